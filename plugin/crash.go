package plugin

import "github.com/harvester/harvester-ipam/plugin/crashpoint"

// New returns the plugin the binary runs. In builds with the crashpoints tag
// it crashes at the step HARVESTER_IPAM_CRASH_AT names (package crashpoint);
// otherwise it is the zero Plugin.
func New() *Plugin {
	return &Plugin{AtStep: crashpoint.Hook()}
}

// at marks a step boundary: test builds and the simulation kill the plugin
// there, to prove that no step loses data.
func (p *Plugin) at(point string) {
	if p.AtStep != nil {
		p.AtStep(point)
	}
}
