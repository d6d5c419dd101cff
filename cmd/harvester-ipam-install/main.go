// Command harvester-ipam-install puts harvester-ipam into the host's CNI bin
// dir, beside whereabouts, and with --stand-in=whereabouts in whereabouts'
// place (the real binary kept aside). The chart's DaemonSet runs it on every
// node: once at start, then again whenever the stand-in's name is written
// (inotify; every --interval when it cannot watch) and every --interval, so
// that a binary removed or replaced on the host comes back. Stopped, it
// gives the stand-in's name back only when the chart no longer stands in on
// the node (its DaemonSet, --daemonset, gone or being deleted, its namespace
// being deleted, its newest revision not standing in at that name and dir,
// or not running on this node). A restart, a rollout, a node's shutdown or
// a force-deleted pod keeps harvester-ipam standing in. Started with its
// stand-in turned off, or moved to another name, it gives back what an
// earlier pod of its release took (the bin dir's record of the stand-in
// says which). Of two releases on one node, the one whose installer took
// the name first keeps it; the other says so and is ready. With --verify it
// only checks (the readiness probe); --give-back gives the name back and
// exits. This file is its flags; what it does is in install/cli.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/install/cli"
	"github.com/harvester/harvester-ipam/install/standin"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

const usage = `harvester-ipam-install %s: puts harvester-ipam into a node's CNI bin dir and,
with --stand-in=whereabouts, stands it in for whereabouts (harvester-ipam at
the name, the real binary kept at <name>.real). The chart's DaemonSet runs it
on every node; a person runs --verify or --give-back.

Modes:
  (default)    install (and stand in), then with --interval keep it so: again
               whenever the stand-in's name is written and every interval.
               Stopped (SIGTERM), it gives the name back only when its
               --daemonset is gone or being deleted (helm uninstall).
  --verify     check only: harvester-ipam installed and runs, and with
               --stand-in it stands in (or there is nothing to stand in for);
               with --not-stand-in (the stand-in turned off) the real binary
               is back at the name and nothing is aside; prints what it
               found. The chart's probes run this.
  --give-back  with --stand-in: put the real binary back at the name, remove
               <name>.real, and exit (a node that missed an uninstall).
  --version    print the version.

Exit status: 0 done (--verify: in order); 1 failed, the reason on stderr
(--verify: not in order, and what is wrong); 2 bad flags.

In the chart's pod the host's CNI bin dir is /host/opt/cni/bin (the
defaults below); on a node's own shell give --cni-bin-dir /opt/cni/bin.

Flags:
`

func main() {
	var c cli.Config
	opt := &c.Install
	flag.StringVar(&opt.Source, "source", "/usr/bin/harvester-ipam", "the binary to install")
	flag.StringVar(&opt.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin dir, as mounted")
	flag.StringVar(&opt.Name, "name", "harvester-ipam", "the file name in the CNI bin dir (the type NADs name)")
	flag.StringVar(&c.Require, "require-cni-versions", "0.3.1", "comma-separated CNI versions the binary must support")
	flag.DurationVar(&opt.Timeout, "timeout", 10*time.Second, "limit of each run of the binary")
	flag.DurationVar(&c.Interval, "interval", 0, "check and reinstall every interval; 0 installs once and exits")
	flag.BoolVar(&c.Verify, "verify", false, "only check that the installed binary is the source and runs (exit 1 if not)")
	flag.StringVar(&c.Delegate, "delegate", "whereabouts", "the delegate to look for beside it (a warning when missing; \"\" skips)")
	flag.StringVar(&c.FlatFile, "flat-file", "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf", "whereabouts' flat file, as mounted (a warning when missing; \"\" skips)")
	flag.StringVar(&c.StandIn, "stand-in", "", "also stand in for this plugin (whereabouts): harvester-ipam at its name, the real binary at <name>"+standin.RealSuffix+"; \"\" does not")
	flag.BoolVar(&c.GiveBack, "give-back", false, "give the --stand-in name back to the real binary and exit")
	flag.StringVar(&c.DaemonSet, "daemonset", "", "this installer's DaemonSet: stopped, the --stand-in name is given back only when it no longer stands in on this node (gone, being deleted, its namespace being deleted, turned off, or not running here); started, what an earlier pod of it stood in for and it no longer does is given back; \"\" never gives it back when stopped")
	flag.StringVar(&c.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the --daemonset's namespace")
	flag.StringVar(&c.Kubeconfig, "kubeconfig", "", "a kubeconfig to read the --daemonset with; \"\" is the pod's service account")
	flag.StringVar(&c.NodeConfig, "node-config", "", "the node's settings file for harvester-ipam, as mounted (the host's "+conf.DefaultNodeConfig+"); kept as --log-level and --log-file say, removed when both are empty; \"\" leaves it alone")
	flag.StringVar(&c.Node.LogLevel, "log-level", "", "with --node-config: harvester-ipam's log level on this node (debug, verbose, error), over whereabouts' log_level; \"\" is whereabouts'")
	flag.StringVar(&c.Node.LogFile, "log-file", "", "with --node-config: harvester-ipam's log file on this node (a host path), over whereabouts' log_file; \"\" is whereabouts'")
	flag.StringVar(&c.HostCNIBinDir, "host-cni-bin-dir", "", "the --cni-bin-dir's path on the host (the chart's hostPaths.cniBinDir): a DaemonSet that stands in in another dir now gives this one back; \"\" does not check")
	flag.StringVar(&c.NodeName, "node", os.Getenv("NODE_NAME"), "the node this runs on: a DaemonSet that no longer runs on it gives the name back; \"\" does not check")
	flag.StringVar(&c.Pod, "pod", os.Getenv("POD_NAME"), "this pod's name, in the stand-in's record; \"\" is this process")
	flag.StringVar(&c.NotStandIn, "not-stand-in", "", "a name this DaemonSet does not stand in for (the chart's standIn.name, turned off): harvester-ipam found there with no record of who put it there (a release from before the records) is given back")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), usage, Version)
		flag.PrintDefaults()
	}
	flag.Parse()
	if *version {
		fmt.Println("harvester-ipam-install", Version)
		return
	}
	c.Args = flag.Args()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := cli.Main(ctx, c)
	stop()
	os.Exit(code)
}
