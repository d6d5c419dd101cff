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
// cannot fit N more addresses now; 4 (inspect --audit) an audit finding is open.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/audit"
	"github.com/harvester/harvester-ipam/audit/watch"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/reconcile"
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

type options struct {
	kubeconfig          string
	namespace           string
	grace               time.Duration
	interval            time.Duration
	dryRun              bool
	metricsAddr         string
	deleteOrphanedPools bool
	need                int64
	audit               bool
	auditWait           time.Duration
	auditGrace          time.Duration
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
	var o options
	fs := flag.NewFlagSet("harvester-ipam-reconciler", flag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig; empty uses the in-cluster service account")
	fs.StringVar(&o.namespace, "namespace", "kube-system", "namespace of whereabouts' IPPools and reservations")
	fs.DurationVar(&o.grace, "grace", 10*time.Minute, "how long an entry must be seen stale before it is released")
	fs.DurationVar(&o.interval, "interval", 0, "time between passes; 0 runs one pass and exits")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print what would be released and why; change nothing")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":9420", "where loop mode serves Prometheus metrics at /metrics; empty serves none")
	fs.BoolVar(&o.deleteOrphanedPools, "delete-orphaned-pools", false, "delete a pool that no NAD names and that holds no live entry, once seen so for --grace (never while the NADs cannot be read)")
	fs.Int64Var(&o.need, "need", 0, "inspect: exit 3, naming each pool, when a pool cannot fit this many more addresses now")
	fs.BoolVar(&o.audit, "audit", false, "inspect: look twice, --audit-wait apart, print the open audit findings and exit 4 when any is open")
	fs.DurationVar(&o.auditWait, "audit-wait", 0, "a single pass: audit after it, looking twice this far apart (0: no audit); inspect --audit: 30s when unset")
	fs.DurationVar(&o.auditGrace, "audit-grace", 0, "how long an audit finding must last before it is reported, every kind but Headroom (0: 30s; Headroom: 10m)")
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
	if o.need < 0 || (o.need > 0 && !inspect) {
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: --need takes a count above 0, with inspect")
		os.Exit(2)
	}
	if o.audit && !inspect || o.auditWait < 0 || o.auditGrace < 0 {
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: --audit goes with inspect (a pass audits with --audit-wait); --audit-wait and --audit-grace take a duration of 0 or more")
		os.Exit(2)
	}
	if inspect && o.audit && o.auditWait == 0 {
		o.auditWait = 30 * time.Second
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var requests atomic.Int64
	r, rc, err := newReconciler(ctx, o, &requests, o.interval > 0 && !inspect)
	if err != nil {
		fail(err)
	}
	switch {
	case inspect:
		in, err := r.Inspect(ctx)
		if err != nil {
			fail(err)
		}
		reconcile.WriteInspect(os.Stdout, in)
		if err := watch.Seen(ctx, rc, r, os.Stdout); err != nil {
			fail(err)
		}
		var open []audit.Open
		if o.audit {
			fmt.Println()
			if open, err = watch.Once(ctx, rc, r, watch.Config{Grace: o.auditGrace}, o.auditWait, false, os.Stdout); err != nil {
				fail(err)
			}
		}
		if o.need > 0 {
			short := in.CannotFit(o.need)
			reconcile.WriteNeed(os.Stdout, o.need, short)
			if len(short) > 0 {
				os.Exit(exitCannotFit)
			}
		}
		if len(open) > 0 {
			os.Exit(exitAuditOpen)
		}
	case o.interval > 0:
		if err := loop(ctx, r, o, &requests, rc); err != nil && !errors.Is(err, context.Canceled) {
			fail(err)
		}
	default:
		if err := pass(ctx, r, &requests, nil); err != nil {
			fail(err)
		}
		if o.auditWait > 0 {
			// The audit reports; its failure is logged, not the pass's.
			if _, err := watch.Once(ctx, rc, r, watch.Config{Grace: o.auditGrace, Log: os.Stderr}, o.auditWait, !o.dryRun, os.Stdout); err != nil {
				fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler:", err)
			}
		}
	}
}

// newReconciler connects to the cluster; a loop (watch) reads pods and nodes
// from informers, a single pass lists them.
func newReconciler(ctx context.Context, o options, requests *atomic.Int64, cached bool) (*reconcile.Reconciler, *rest.Config, error) {
	var rc *rest.Config
	var err error
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "harvester-ipam-reconciler"
	rc.QPS, rc.Burst = 50, 100
	// Count requests: a pass's cost is its requests.
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			requests.Add(1)
			return rt.RoundTrip(req)
		})
	})
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	api, err := shim.NewKubeAPI(rc)
	if err != nil {
		return nil, nil, err
	}
	cluster := reconcile.NewKubeCluster(kube, dyn, 10*time.Second, 500)
	if cached {
		if cluster, err = reconcile.NewCachedCluster(ctx, kube, dyn, 10*time.Second, 500, 2*time.Minute); err != nil {
			return nil, nil, err
		}
	}
	return &reconcile.Reconciler{
		Store:   shim.New(api, o.namespace, shim.Options{Identity: "harvester-ipam-reconciler/" + hostname()}),
		Cluster: cluster,
		Grace:   o.grace, DryRun: o.dryRun, DeleteOrphanedPools: o.deleteOrphanedPools,
	}, rc, nil
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pass runs one pass, prints its plan and a summary, and fails when the pass
// could not finish: the CronJob's exit status says so.
func pass(ctx context.Context, r *reconcile.Reconciler, requests *atomic.Int64, m *metrics) error {
	start, before := time.Now(), requests.Load()
	rep, err := r.Pass(ctx)
	took, reqs := time.Since(start), requests.Load()-before
	if m != nil {
		m.observe(rep, err, took, reqs)
	}
	if err != nil {
		return fmt.Errorf("pass: %w", err)
	}
	reconcile.WriteRows(os.Stdout, rep.Rows, time.Now())
	mode := ""
	if r.DryRun {
		mode = " (dry run: nothing changed)"
	}
	nads := fmt.Sprintf("%d NADs on whereabouts", rep.NADs.Count)
	if !rep.NADs.Known {
		nads = fmt.Sprintf("NADs unknown (%v)", rep.NADs.Err)
	}
	fmt.Printf("pass%s: %d pools, %d allocations, %d reservations, %s; %d stale, %d allocations released (%d with their reservation), %d orphaned reservations deleted, %d orphaned pools deleted; %d API requests, %s\n",
		mode, rep.Pools, rep.Allocations, rep.ORIPs, nads, rep.Candidates(), len(rep.Released), len(rep.ReleasedORIPs), len(rep.DeletedORIPs), len(rep.DeletedPools), reqs, took.Round(time.Millisecond))
	if len(rep.Errors) > 0 {
		return fmt.Errorf("pass left %d entries unhandled: %w", len(rep.Errors), errors.Join(rep.Errors...))
	}
	return nil
}

func loop(ctx context.Context, r *reconcile.Reconciler, o options, requests *atomic.Int64, rc *rest.Config) error {
	m := newMetrics(o.namespace)
	// The audit watches on its own; without it (its informers refused) the
	// reconciler still releases, and the log says why.
	audits := watch.NewCollector()
	m.reg.MustRegister(audits)
	if err := watch.Watch(ctx, rc, o.namespace, watch.Config{Grace: o.auditGrace, Log: os.Stderr}, o.interval, audits); err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: the audit does not run:", err)
	}
	if o.metricsAddr != "" {
		srv := &http.Server{Addr: o.metricsAddr, Handler: m.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fmt.Fprintln(os.Stderr, "metrics:", err)
			}
		}()
		defer srv.Close()
	}
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		if err := pass(ctx, r, requests, m); err != nil {
			fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler:", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// standby does nothing until SIGTERM or SIGINT, then exits 0: it holds the
// chart's diagnostics container, whose memory limit is its own, so that what
// an operator's kubectl exec of the reconciler reads of a large cluster
// never counts against the installer's.
func standby(args []string) {
	if len(args) > 0 {
		fmt.Fprintf(os.Stderr, "harvester-ipam-reconciler: standby takes no arguments, not %q\n", args[0])
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// What the packages' initialisation allocated goes back to the node.
	debug.FreeOSMemory()
	<-ctx.Done()
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler:", err)
	os.Exit(1)
}
