// Command harvester-ipam is a CNI IPAM plugin that wraps whereabouts: a NAD
// names it instead of whereabouts and keeps every whereabouts field.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/harvester/harvester-ipam/agent/client"
	"github.com/harvester/harvester-ipam/plugin"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

func main() {
	p := plugin.New()
	// Each verb goes to the node agent first, when one serves this node.
	p.Agent = client.New()
	skel.PluginMainFuncs(p.Funcs(),
		version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"harvester-ipam "+Version+": reclaims a pod's stale whereabouts allocations, then delegates")
}
