// Package cli is harvester-ipam-reconciler's command, its flags aside: a
// pass (or with an interval, a pass every interval and metrics) that
// releases whereabouts allocations and reservations no ADD will release,
// an inspection of how full each pool is, and the standby of the chart's
// diagnostics container.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/reconcile/audit/watch"
	"github.com/harvester/harvester-ipam/shim"
)

// Options are the command line, each a flag (cmd/harvester-ipam-reconciler
// says which and what it defaults to).
type Options struct {
	Kubeconfig          string // "": the in-cluster service account
	Namespace           string
	Grace               time.Duration
	Interval            time.Duration // 0: one pass
	DryRun              bool
	MetricsAddr         string // "": none
	DeleteOrphanedPools bool
	Need                int64 // Inspect: the addresses each pool must fit; 0 does not check
	// Audit: Inspect looks twice, AuditWait apart, and fails with
	// ErrAuditOpen when a finding is open (docs/audit.md).
	Audit bool
	// AuditWait: a single pass audits after it, looking twice this far
	// apart (0: no audit); Inspect with Audit: 30 s when 0.
	AuditWait time.Duration
	// AuditGrace: how long a finding must last before it is reported, every
	// kind but Headroom (0: the audit's own).
	AuditGrace time.Duration
	// DaemonSet is the chart's installer DaemonSet, whose diagnostics
	// container the audit's next commands name ("": harvester-ipam).
	DaemonSet string

	Stdout, Stderr io.Writer // nil: os.Stdout, os.Stderr
}

func (o *Options) defaults() {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
}

// ErrCannotFit is Inspect's error when a pool cannot fit Need more
// addresses now (each named in what it printed).
var ErrCannotFit = errors.New("a pool cannot fit the addresses needed")

// ErrAuditOpen is Inspect's error with Audit when an audit finding is open
// (each printed with the command to run next).
var ErrAuditOpen = errors.New("an audit finding is open")

// Inspect prints, per pool, its range, size, allocated, stale and free
// addresses and the NAD that names it, and the pools no NAD names, and what
// the audit sees at one look; with Need, whether every pool fits that many
// more; with Audit, the findings open over two looks. It writes nothing.
// ErrCannotFit comes before ErrAuditOpen.
func Inspect(ctx context.Context, o Options) error {
	o.defaults()
	if o.Audit && o.AuditWait == 0 {
		o.AuditWait = 30 * time.Second
	}
	var requests atomic.Int64
	r, rc, _, err := newReconciler(ctx, o, &requests, false)
	if err != nil {
		return err
	}
	in, err := r.Inspect(ctx)
	if err != nil {
		return err
	}
	reconcile.WriteInspect(o.Stdout, in)
	if err := watch.Seen(ctx, rc, r, watch.Config{DaemonSet: o.DaemonSet}, o.Stdout); err != nil {
		return err
	}
	var open []audit.Open
	if o.Audit {
		fmt.Fprintln(o.Stdout)
		if open, err = watch.Once(ctx, rc, r, watch.Config{Grace: o.AuditGrace, DaemonSet: o.DaemonSet}, o.AuditWait, false, o.Stdout); err != nil {
			return err
		}
	}
	if o.Need > 0 {
		short := in.CannotFit(o.Need)
		reconcile.WriteNeed(o.Stdout, o.Need, short)
		if len(short) > 0 {
			return ErrCannotFit
		}
	}
	if len(open) > 0 {
		return ErrAuditOpen
	}
	return nil
}

// Run runs one pass, or with an Interval a pass every interval (serving
// metrics at MetricsAddr) until ctx ends. Its error is a pass that could
// not finish (a single pass's; a loop logs each and goes on) or a start
// that failed.
func Run(ctx context.Context, o Options) error {
	o.defaults()
	var requests atomic.Int64
	r, rc, shared, err := newReconciler(ctx, o, &requests, o.Interval > 0)
	if err != nil {
		return err
	}
	if o.Interval > 0 {
		if err := loop(ctx, r, rc, shared, o, &requests); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	if err := pass(ctx, r, o, &requests, nil); err != nil {
		return err
	}
	if o.AuditWait > 0 {
		// The audit reports; its failure is logged, not the pass's.
		if _, err := watch.Once(ctx, rc, r, watch.Config{Grace: o.AuditGrace, Log: o.Stderr, DaemonSet: o.DaemonSet}, o.AuditWait, !o.DryRun, o.Stdout); err != nil {
			fmt.Fprintln(o.Stderr, "harvester-ipam-reconciler:", err)
		}
	}
	return nil
}

// Standby does nothing until ctx ends: it holds the chart's diagnostics
// container, whose memory limit is its own, so that what an operator's
// kubectl exec of the reconciler reads of a large cluster never counts
// against the installer's.
func Standby(ctx context.Context) {
	// What the packages' initialisation allocated goes back to the node.
	debug.FreeOSMemory()
	<-ctx.Done()
}

// newReconciler connects to the cluster; a loop (cached) reads pods and nodes
// from informers, which it returns for the audit to share, a single pass
// lists them.
func newReconciler(ctx context.Context, o Options, requests *atomic.Int64, cached bool) (*reconcile.Reconciler, *rest.Config, *watch.Shared, error) {
	var rc *rest.Config
	var err error
	if o.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
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
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	api, err := shim.NewKubeAPI(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	cluster := reconcile.NewKubeCluster(kube, dyn, 10*time.Second, 500)
	var shared *watch.Shared
	if cached {
		// One cluster-wide pod informer and one node informer, for the
		// passes and the audit alike (issue 44: not two of each).
		if shared, err = watch.NewShared(kube); err != nil {
			return nil, nil, nil, err
		}
		if err := shared.Start(ctx, 2*time.Minute); err != nil {
			return nil, nil, nil, err
		}
		cluster = reconcile.NewCachedClusterFrom(kube, dyn, 10*time.Second, 500, shared.Pods, shared.Nodes)
	}
	return &reconcile.Reconciler{
		Store:   shim.New(api, o.Namespace, shim.Options{Identity: "harvester-ipam-reconciler/" + hostname()}),
		Cluster: cluster,
		Grace:   o.Grace, DryRun: o.DryRun, DeleteOrphanedPools: o.DeleteOrphanedPools,
	}, rc, shared, nil
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pass runs one pass, prints its plan and a summary, and fails when the pass
// could not finish: the CronJob's exit status says so.
func pass(ctx context.Context, r *reconcile.Reconciler, o Options, requests *atomic.Int64, m *metrics) error {
	start, before := time.Now(), requests.Load()
	rep, err := r.Pass(ctx)
	took, reqs := time.Since(start), requests.Load()-before
	if m != nil {
		m.observe(rep, err, took, reqs)
	}
	if err != nil {
		return fmt.Errorf("pass: %w", err)
	}
	reconcile.WriteRows(o.Stdout, rep.Rows, time.Now())
	mode := ""
	if r.DryRun {
		mode = " (dry run: nothing changed)"
	}
	nads := fmt.Sprintf("%d NADs on whereabouts", rep.NADs.Count)
	if !rep.NADs.Known {
		nads = fmt.Sprintf("NADs unknown (%v)", rep.NADs.Err)
	}
	fmt.Fprintf(o.Stdout, "pass%s: %d pools, %d allocations, %d reservations, %s; %d stale, %d allocations released (%d with their reservation), %d orphaned reservations deleted, %d orphaned pools deleted; %d API requests, %s\n",
		mode, rep.Pools, rep.Allocations, rep.ORIPs, nads, rep.Candidates(), len(rep.Released), len(rep.ReleasedORIPs), len(rep.DeletedORIPs), len(rep.DeletedPools), reqs, took.Round(time.Millisecond))
	if len(rep.Errors) > 0 {
		return fmt.Errorf("pass left %d entries unhandled: %w", len(rep.Errors), errors.Join(rep.Errors...))
	}
	return nil
}

func loop(ctx context.Context, r *reconcile.Reconciler, rc *rest.Config, shared *watch.Shared, o Options, requests *atomic.Int64) error {
	m := newMetrics(o.Namespace)
	// The audit watches on its own; without it (its informers refused) the
	// reconciler still releases, and the log says why.
	audits := watch.NewCollector()
	m.reg.MustRegister(audits)
	go keepAuditing(ctx, o.Stderr, func(ctx context.Context) error {
		return watch.Watch(ctx, rc, o.Namespace, watch.Config{Grace: o.AuditGrace, Log: o.Stderr, DaemonSet: o.DaemonSet}, o.Interval, audits, shared)
	}, shim.RealClock{}.Sleep, 10*time.Second, 5*time.Minute)
	if o.MetricsAddr != "" {
		srv := &http.Server{Addr: o.MetricsAddr, Handler: m.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fmt.Fprintln(o.Stderr, "metrics:", err)
			}
		}()
		defer srv.Close()
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		if err := pass(ctx, r, o, requests, m); err != nil {
			fmt.Fprintln(o.Stderr, "harvester-ipam-reconciler:", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// keepAuditing starts the audit (start), and tries again after a pause
// (from first, doubling up to most) while it is refused (its informers not
// listed: an API server restarting, RBAC not yet bound), until it runs or
// ctx ends; the log says why each time, and meanwhile the audit's gauge is
// absent, which HarvesterIPAMAuditNotJudging reads. Each try runs under a
// context of its own, ended when the try fails, so that a failed try's
// informers stop; the audit that runs keeps its own until ctx ends.
func keepAuditing(ctx context.Context, log io.Writer, start func(context.Context) error, pause func(context.Context, time.Duration) error, first, most time.Duration) {
	wait := first
	for {
		try, cancel := context.WithCancel(ctx)
		err := start(try)
		if err == nil {
			context.AfterFunc(ctx, cancel)
			return
		}
		cancel()
		fmt.Fprintf(log, "harvester-ipam-reconciler: the audit does not run: %v; trying again in %s\n", err, wait)
		if pause(ctx, wait) != nil {
			return
		}
		wait = min(2*wait, most)
	}
}
