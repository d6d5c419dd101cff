// Command harvester-ipam is a CNI IPAM plugin that wraps whereabouts: it
// runs at whereabouts' name (the chart stands it in for whereabouts) or is
// named in a NAD, keeps every whereabouts field, and hands each allocation
// to the real whereabouts.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/install/standin"
	"github.com/harvester/harvester-ipam/plugin"
	"github.com/harvester/harvester-ipam/wire/client"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

const usage = `harvester-ipam %s: a CNI IPAM plugin that stands in for whereabouts. Before
each ADD it releases what earlier sandboxes of the same pod still hold in
whereabouts' IPPools, then hands the ADD to the real whereabouts; its DEL
releases the attachment's own entry, even when the NAD is gone.

The container runtime runs it, never a person: it reads the CNI verb from
CNI_COMMAND (ADD, DEL, CHECK, GC, STATUS, VERSION) and the network config
from stdin, and answers on stdout (the result, or a CNI error).

  CNI_COMMAND=VERSION harvester-ipam </dev/null
      the CNI versions it speaks on stdout; on stderr, which binary this is
      and which whereabouts it hands allocations to

Where it finds the real whereabouts: at <its own name>%s beside it when it
stands at whereabouts' name (the chart's stand-in), else the binary named by
ipam.harvester_ipam.delegate (default whereabouts) on CNI_PATH.

Exit status: 0 the verb succeeded; 1 it failed, with a CNI error on stdout
whose code says why (2 bad option, 4 bad CNI_ARGS, 5 checkpoint dir, 6 bad
JSON, 7 bad config, 11 try again later: the API server or whereabouts.real
not reachable; a delegate's error keeps the delegate's code).

Flags (for a person): --help, --version.
`

func main() {
	if len(os.Args) > 1 {
		os.Exit(flags(os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv("CNI_COMMAND") == "VERSION" {
		exe, _ := os.Executable()
		fmt.Fprintln(os.Stderr, whoAmI(exe))
	}
	p := plugin.New()
	// Each verb goes to the node agent first, when one serves this node.
	p.Agent = client.New()
	skel.PluginMainFuncs(p.Funcs(),
		conf.SpecVersions(),
		"harvester-ipam "+Version+": reclaims a pod's stale whereabouts allocations, then delegates")
}

// flags answers a person's --help or --version; a runtime passes no
// arguments.
func flags(args []string, stdout, stderr io.Writer) int {
	switch args[0] {
	case "--version", "-version":
		fmt.Fprintln(stdout, "harvester-ipam", Version)
		return 0
	case "--help", "-help", "-h":
		fmt.Fprintf(stdout, usage, Version, standin.RealSuffix)
		return 0
	}
	fmt.Fprintf(stderr, "harvester-ipam: unknown argument %q: the plugin takes its verb from CNI_COMMAND (see --help)\n", args[0])
	return 2
}

// whoAmI names this binary and the whereabouts it delegates to: at
// whereabouts' name, the real binary aside; else the delegate on CNI_PATH.
func whoAmI(exe string) string {
	if exe == "" {
		return fmt.Sprintf("harvester-ipam %s", Version)
	}
	aside := standin.Aside(exe)
	if filepath.Base(exe) != "harvester-ipam" {
		if _, err := os.Stat(aside); err == nil {
			return fmt.Sprintf("harvester-ipam %s at %s, standing in for %s: allocations go to the real %s at %s",
				Version, exe, filepath.Base(exe), filepath.Base(exe), aside)
		}
		return fmt.Sprintf("harvester-ipam %s at %s, standing in for %s, but %s is missing: ADD fails until the chart's installer puts the real binary there",
			Version, exe, filepath.Base(exe), aside)
	}
	return fmt.Sprintf("harvester-ipam %s at %s: allocations go to ipam.harvester_ipam.delegate (default whereabouts) on CNI_PATH, the real one beside it when harvester-ipam stands at its name",
		Version, exe)
}
