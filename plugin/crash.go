package plugin

// New returns the plugin the binary runs. In builds with the crashpoints tag
// it carries a crash hook (see crash_on.go); otherwise it is the zero Plugin.
func New() *Plugin {
	return &Plugin{crash: crashHook()}
}

// at marks a step boundary. Test builds (tag crashpoints) kill the process
// there when HARVESTER_IPAM_CRASH_AT names it, so that the rig can prove that
// no step loses data; in other builds it does nothing.
func (p *Plugin) at(point string) {
	if p.crash != nil {
		p.crash(point)
	}
}
