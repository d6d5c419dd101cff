package plugin

// New returns the plugin the binary runs. In builds with the crashpoints tag
// it crashes at the step HARVESTER_IPAM_CRASH_AT names (see crash_on.go);
// otherwise it is the zero Plugin.
func New() *Plugin {
	return &Plugin{AtStep: crashHook()}
}

// at marks a step boundary: test builds and the simulation kill the plugin
// there, to prove that no step loses data.
func (p *Plugin) at(point string) {
	if p.AtStep != nil {
		p.AtStep(point)
	}
}
