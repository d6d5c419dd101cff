// Command harvester-ipam-agent is harvester-ipam's node agent: it serves the
// plugin's CNI verbs on a unix socket, in-process, with a warm client of the
// API server under its own service account. The plugin hands it each verb
// and does the work itself whenever the agent does not take it.
//
//	harvester-ipam-agent [flags]          serve
//	harvester-ipam-agent probe [flags]    exit 0 when the agent at --socket serves (a readiness probe)
//	harvester-ipam-agent --version
//
// Exit status: 0 stopped (or the probe was served); 1 could not start (or the
// probe was not served); 2 bad flags. This file is its flags; what it does
// is in agent/cli.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/agent/cli"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/wire"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "probe" {
		os.Exit(probe(args[1:]))
	}
	var o cli.Options
	var version bool
	fs := flag.NewFlagSet("harvester-ipam-agent", flag.ContinueOnError)
	fs.StringVar(&o.Socket, "socket", wire.DefaultSocket, "the unix socket to serve (its directory is made root's only)")
	fs.StringVar(&o.NodeFile, "node-file", wire.NodeFile, "where to tell the plugin the socket's path; empty tells nothing (the plugin then looks at "+wire.DefaultSocket+")")
	fs.StringVar(&o.Checkpoints, "checkpoint-dir", conf.DefaultCheckpointDir, "the plugin's checkpoint directory (the one the agent has): made root's only (0700) if it is not; a config naming another is left to the plugin")
	fs.StringVar(&o.Namespaces, "namespace", "kube-system", "the pool namespaces to serve, comma-separated (where whereabouts' kubeconfig keeps its IPPools); a config of another is left to the plugin")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the agent's own identity; empty uses the in-cluster service account (never whereabouts')")
	fs.StringVar(&o.Node, "node", os.Getenv("NODE_NAME"), "the node's name, for the Lease identity of each request; empty: the host name")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "127.0.0.1:9422", "where to serve Prometheus metrics at /metrics; empty serves none")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", 256, "requests served at once; beyond, the plugin works alone")
	fs.DurationVar(&o.Summary, "summary-interval", time.Minute, "how often to log a line of what was served; 0 never")
	fs.DurationVar(&o.CheckEvery, "check-interval", 30*time.Second, "how often to check that the pools answer the agent")
	fs.DurationVar(&o.Grace, "grace", 25*time.Second, "how long a stop waits for the verbs under way")
	fs.BoolVar(&o.LogRequests, "log-requests", false, "log a line for each request: the verb, the attachment, the outcome, how long it took")
	fs.BoolVar(&o.ExecWB, "exec-whereabouts", false, "allocate by running the whereabouts binary of each request's CNI_PATH, under whereabouts' Lease, as the plugin does, instead of whereabouts' allocator in-process")
	fs.StringVar(&o.NodeConfig, "node-config", conf.DefaultNodeConfig, "the node's settings for harvester-ipam's log (the chart's plugin.*), which the plugin reads too; a log file they name is the host's, which the plugin writes")
	fs.BoolVar(&version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: harvester-ipam-agent [flags]\n       harvester-ipam-agent probe [--socket PATH] [--timeout D]\n\n"+
			"harvester-ipam's node agent: serves the plugin's CNI verbs on a unix socket.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "harvester-ipam-agent: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		os.Exit(2)
	}
	if version {
		fmt.Println("harvester-ipam-agent", Version)
		return
	}
	o.Version = Version
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-agent:", err)
		os.Exit(1)
	}
}

// probe asks the agent at --socket whether it serves, as the plugin would,
// with a request that does nothing.
func probe(args []string) int {
	fs := flag.NewFlagSet("harvester-ipam-agent probe", flag.ContinueOnError)
	socket := fs.String("socket", wire.DefaultSocket, "the agent's socket")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the agent to take the probe")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := cli.Probe(context.Background(), *socket, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("serving")
	return 0
}
