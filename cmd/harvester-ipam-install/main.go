// Command harvester-ipam-install puts harvester-ipam into the host's CNI bin
// dir, beside whereabouts. The chart's DaemonSet runs it on every node: once
// at start and then every --interval, so that a binary removed or replaced on
// the host comes back; with --verify it only checks (the readiness probe).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/install"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

func main() {
	var (
		opt      install.Options
		interval time.Duration
		verify   bool
		delegate string
		flatFile string
		require  string
	)
	flag.StringVar(&opt.Source, "source", "/usr/bin/harvester-ipam", "the binary to install")
	flag.StringVar(&opt.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin dir, as mounted")
	flag.StringVar(&opt.Name, "name", "harvester-ipam", "the file name in the CNI bin dir (the type NADs name)")
	flag.StringVar(&require, "require-cni-versions", "0.3.1", "comma-separated CNI versions the binary must support")
	flag.DurationVar(&opt.Timeout, "timeout", 10*time.Second, "limit of each run of the binary")
	flag.DurationVar(&interval, "interval", 0, "check and reinstall every interval; 0 installs once and exits")
	flag.BoolVar(&verify, "verify", false, "only check that the installed binary is the source and runs (exit 1 if not)")
	flag.StringVar(&delegate, "delegate", "whereabouts", "the delegate to look for beside it (a warning when missing; \"\" skips)")
	flag.StringVar(&flatFile, "flat-file", "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf", "whereabouts' flat file, as mounted (a warning when missing; \"\" skips)")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println("harvester-ipam-install", Version)
		return
	}
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if require != "" {
		opt.Require = strings.Split(require, ",")
	} else {
		opt.Require = []string{}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if verify {
		res, err := install.Verify(ctx, opt)
		if err != nil {
			fail(err)
		}
		fmt.Printf("%s is installed and runs: %s\n", res.Path, res.About)
		return
	}

	var warned string
	for first := true; ; first = false {
		res, err := install.Install(ctx, opt)
		if err != nil {
			if ctx.Err() != nil {
				return // terminated while waiting: nothing was changed
			}
			// Exit: the pod restarts with back-off and the failure shows in
			// its status, rather than in a log nobody reads.
			fail(err)
		}
		if res.Changed {
			logf("installed %s (%s; CNI %s)", res.Path, res.About, strings.Join(res.Supported, ", "))
		} else if first {
			logf("%s is up to date (%s)", res.Path, res.About)
		}
		// Warnings only when they change: the loop runs every interval.
		if w := strings.Join(install.Preflight(opt.BinDir, delegate, flatFile), "\n"); w != warned {
			if w != "" {
				logf("warning: %s", strings.ReplaceAll(w, "\n", "\nwarning: "))
			} else if warned != "" {
				logf("whereabouts and its flat file are in place now")
			}
			warned = w
		}
		if interval <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			// The binary stays: pods attached through it need it for their DEL.
			logf("terminating; %s stays installed", res.Path)
			return
		case <-time.After(interval):
		}
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s harvester-ipam-install: %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}

func fail(err error) {
	logf("error: %v", err)
	os.Exit(1)
}
