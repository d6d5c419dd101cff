// Command harvester-ipam-reconciler releases whereabouts allocations and
// reservations that no ADD will ever release (dead nodes, deleted pods,
// deleted NADs, leftover ORIPs), cluster-wide and without any NAD.
//
//	harvester-ipam-reconciler [flags]           one pass (a CronJob), or with --interval a loop (a Deployment)
//	harvester-ipam-reconciler inspect [flags]   per pool: range, size, allocated, stale, free; pools no NAD names
//	harvester-ipam-reconciler inspect --need N  the same, and exit 3 when a pool cannot fit N more addresses
//	harvester-ipam-reconciler inspect --audit   the same, and exit 4 when an audit finding is open (docs/audit.md)
//	harvester-ipam-reconciler standby           nothing until stopped: the chart's diagnostics container
//
// Exit status: 0 done (inspect --need: every pool fits); 1 the pass or the
// inspection could not finish; 2 bad flags; 3 (inspect --need) some pool
// cannot fit N more addresses now; 4 (inspect --audit) an audit finding is open. This file is its flags; what it does is
// in reconcile/cli.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/reconcile/cli"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

const usage = `harvester-ipam-reconciler %s: releases whereabouts allocations and
reservations that no ADD will release (a pod or node that is gone, a deleted
NAD, a leftover reservation), cluster-wide, and shows how full each pool is.

Usage:
  harvester-ipam-reconciler [flags]
      one pass: judge every entry of every IPPool and reservation in
      --namespace, release those seen stale for --grace (0: at once), print
      what it found and did. With --interval, a pass every interval and
      metrics at --metrics-addr (the chart's Deployment mode).
  harvester-ipam-reconciler --grace 0 --dry-run
      what a pass would release now, and why; writes nothing.
  harvester-ipam-reconciler inspect [--need N]
      per pool: range, size (with the NAD's excludes), allocated, stale,
      free, the NAD that names it; every stale entry with its pod and why;
      the pools no NAD names; what the audit sees at one look (docs/audit.md).
      Writes nothing. With --need N, also whether every pool fits N more
      addresses now (a preflight before an upgrade). With --audit, looks
      twice --audit-wait apart (30s) and prints the findings open: two pods
      on one address, a pod without its address, pod and pool disagreeing,
      entries and reservations disagreeing, too little headroom.
  harvester-ipam-reconciler standby
      nothing, until stopped: the chart's diagnostics container, where an
      operator's kubectl exec runs the reconciler under its own limits.

Exit status: 0 done (inspect --need: every pool fits; inspect --audit: no
finding open); 1 the pass or the inspection could not finish (a pass that
left entries unhandled too); 2 bad flags or arguments; 3 (inspect --need)
some pool cannot fit N more addresses now, each named with what a pass would
free; 4 (inspect --audit) some audit finding is open, each printed with the
command to run next (with --need too: 3 first).

The audit (docs/audit.md) reports and writes nothing but Events: with
--interval it watches pods, pools, reservations and NADs and re-judges on
each change (an Event and harvester_ipam_audit_findings within its grace and
a few seconds); a single pass audits after it with --audit-wait D (the
chart's CronJob: 35s), looking twice D apart.

In the chart's pods it logs in as its service account; elsewhere give
--kubeconfig. Run from the DaemonSet's pod in any install:
  kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler inspect

Flags:
`

// daemonSetEnv names the chart's DaemonSet for a run without --daemonset:
// the chart sets it in the diagnostics container, where an operator's
// kubectl exec runs inspect by hand.
const daemonSetEnv = "HARVESTER_IPAM_DAEMONSET"

func daemonSetDefault() string {
	if ds := os.Getenv(daemonSetEnv); ds != "" {
		return ds
	}
	return "harvester-ipam"
}

// exitCannotFit is inspect --need's status when a pool cannot fit N more
// addresses: distinct from 1 (could not inspect) and from 2, which the flag
// package exits with on bad flags, so a preflight script can tell them apart.
const exitCannotFit = 3

// exitAuditOpen is inspect --audit's status when a finding is open.
const exitAuditOpen = 4

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "standby" {
		standby(args[1:])
		return
	}
	inspect := len(args) > 0 && args[0] == "inspect"
	if inspect {
		args = args[1:]
	}
	var o cli.Options
	fs := flag.NewFlagSet("harvester-ipam-reconciler", flag.ExitOnError)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig; empty uses the in-cluster service account")
	fs.StringVar(&o.Namespace, "namespace", "kube-system", "namespace of whereabouts' IPPools and reservations")
	fs.DurationVar(&o.Grace, "grace", 10*time.Minute, "how long an entry must be seen stale before it is released")
	fs.DurationVar(&o.Interval, "interval", 0, "time between passes; 0 runs one pass and exits")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print what would be released and why; change nothing")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", ":9420", "where loop mode serves Prometheus metrics at /metrics; empty serves none")
	fs.BoolVar(&o.DeleteOrphanedPools, "delete-orphaned-pools", false, "delete a pool that no NAD names and that holds no live entry, once seen so for --grace (never while the NADs cannot be read)")
	fs.Int64Var(&o.Need, "need", 0, "inspect: exit 3, naming each pool, when a pool cannot fit this many more addresses now")
	fs.BoolVar(&o.Audit, "audit", false, "inspect: look twice, --audit-wait apart, print the open audit findings and exit 4 when any is open")
	fs.DurationVar(&o.AuditWait, "audit-wait", 0, "a single pass: audit after it, looking twice this far apart (0: no audit); inspect --audit: 30s when unset")
	fs.DurationVar(&o.AuditGrace, "audit-grace", 0, "how long an audit finding must last before it is reported, every kind but Headroom (0: 30s; Headroom: 10m)")
	fs.StringVar(&o.DaemonSet, "daemonset", daemonSetDefault(), "the chart's installer DaemonSet, whose diagnostics container the audit's next commands name (default $"+daemonSetEnv+", else harvester-ipam)")
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), usage, Version)
		fs.PrintDefaults()
	}
	_ = fs.Parse(args)
	if *version {
		fmt.Println("harvester-ipam-reconciler", Version)
		return
	}
	// A word left over is a typo or a misplaced command: refuse it rather
	// than run a pass the operator did not ask for.
	if fs.NArg() > 0 {
		hint := ""
		if fs.Arg(0) == "inspect" {
			hint = " (inspect comes first)"
		}
		fmt.Fprintf(os.Stderr, "harvester-ipam-reconciler: unexpected argument %q%s\n", fs.Arg(0), hint)
		fs.Usage()
		os.Exit(2)
	}
	// A pass's flags after inspect: it would only inspect (it writes
	// nothing), and the operator who asked for a pass would not see one.
	if inspect {
		var passFlags []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "grace", "dry-run", "interval", "delete-orphaned-pools", "metrics-addr", "audit-grace":
				passFlags = append(passFlags, "--"+f.Name)
			}
		})
		if len(passFlags) > 0 {
			fmt.Fprintf(os.Stderr, "harvester-ipam-reconciler: inspect writes nothing and takes no %s: a pass's dry run is harvester-ipam-reconciler --grace 0 --dry-run, without inspect\n", strings.Join(passFlags, ", "))
			os.Exit(2)
		}
	}
	if o.Need < 0 || (o.Need > 0 && !inspect) {
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: --need takes a count above 0, with inspect")
		os.Exit(2)
	}
	if o.Audit && !inspect || o.AuditWait < 0 || o.AuditGrace < 0 {
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: --audit goes with inspect (a pass audits with --audit-wait); --audit-wait and --audit-grace take a duration of 0 or more")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if inspect {
		err = cli.Inspect(ctx, o)
	} else {
		err = cli.Run(ctx, o)
	}
	stop()
	switch {
	case errors.Is(err, cli.ErrCannotFit):
		os.Exit(exitCannotFit)
	case errors.Is(err, cli.ErrAuditOpen):
		os.Exit(exitAuditOpen)
	case err != nil:
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler:", err)
		os.Exit(1)
	}
}

// standby does nothing until SIGTERM or SIGINT, then exits 0: the chart's
// diagnostics container (cli.Standby).
func standby(args []string) {
	if len(args) > 0 {
		fmt.Fprintf(os.Stderr, "harvester-ipam-reconciler: standby takes no arguments, not %q\n", args[0])
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Said once it catches SIGTERM: what the container's log shows.
	fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: standing by until stopped (the chart's diagnostics container: kubectl exec runs the reconciler here)")
	cli.Standby(ctx)
}
