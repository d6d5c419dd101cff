package watch

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// Config is how the reconciler's command runs the audit.
type Config struct {
	// Grace is every kind's but Headroom's (audit.DefaultGrace when 0).
	Grace time.Duration
	// Log gets the findings that open and close.
	Log io.Writer
	// DaemonSet is the chart's installer DaemonSet, named in the next
	// commands ("": harvester-ipam, the release's name by default).
	DaemonSet string
}

func (c Config) tracker() *audit.Tracker {
	graces := map[audit.Kind]time.Duration{}
	if c.Grace > 0 {
		for _, k := range audit.Kinds {
			if k != audit.Headroom {
				graces[k] = c.Grace
			}
		}
	}
	return audit.NewTracker(graces)
}

// options says, in the reconciler's pod, which command an operator runs:
// the chart's DaemonSet in the reconciler's own namespace.
func (c Config) options() audit.Options {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	return diagnose(strings.TrimSpace(string(b)), err, c.DaemonSet)
}

func diagnose(ns string, nsErr error, daemonSet string) audit.Options {
	if daemonSet == "" {
		daemonSet = "harvester-ipam"
	}
	if nsErr != nil || ns == "" {
		ns = "kube-system"
	}
	return audit.Options{Diagnose: fmt.Sprintf("kubectl -n %s exec ds/%s -c diagnostics -- harvester-ipam-reconciler", ns, daemonSet)}
}

func clients(rc *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	return kube, dyn, nil
}

// Once is the audit of a single run: two looks wait apart (graces longer
// than wait cut to it), an Event per open finding, printed to w. events
// false records none (inspect writes nothing).
func Once(ctx context.Context, rc *rest.Config, r *reconcile.Reconciler, cfg Config, wait time.Duration, events bool, w io.Writer) ([]audit.Open, error) {
	kube, _, err := clients(rc)
	if err != nil {
		return nil, err
	}
	if cfg.Grace <= 0 || cfg.Grace > wait {
		cfg.Grace = wait
	}
	a := &Auditor{Source: &ListSource{Store: r.Store, Cluster: r.Cluster, Kube: kube}, Options: cfg.options(), Log: cfg.Log,
		Tracker: audit.NewTracker(graceFor(cfg.Grace))}
	if events {
		a.Kube = kube
	}
	c, _, err := a.Twice(ctx, wait)
	if err != nil {
		return nil, err
	}
	WriteOpen(w, c.Open, time.Now())
	return c.Open, nil
}

// graceFor is one grace for every kind.
func graceFor(d time.Duration) map[audit.Kind]time.Duration {
	out := map[audit.Kind]time.Duration{}
	for _, k := range audit.Kinds {
		out[k] = d
	}
	return out
}

// Seen prints what one look finds, unconfirmed: inspect's view.
func Seen(ctx context.Context, rc *rest.Config, r *reconcile.Reconciler, cfg Config, w io.Writer) error {
	kube, _, err := clients(rc)
	if err != nil {
		return err
	}
	s, err := (&ListSource{Store: r.Store, Cluster: r.Cluster, Kube: kube}).Snapshot(ctx)
	if err != nil {
		return err
	}
	WriteSeen(w, audit.Judge(s, cfg.options()), "inspect --audit")
	return nil
}

// Watch starts the Deployment's audit: informers (the pods' and nodes' of
// shared, those the reconciler's passes read, when it is not nil), and a
// look at every change, when a finding is due, and at least every
// interval, until ctx ends. It returns once the informers have listed.
func Watch(ctx context.Context, rc *rest.Config, namespace string, cfg Config, interval time.Duration, m *Collector, shared *Shared) error {
	kube, dyn, err := clients(rc)
	if err != nil {
		return err
	}
	src, err := NewWatchSource(ctx, rc, kube, dyn, namespace, 2*time.Minute, shared)
	if err != nil {
		return err
	}
	a := &Auditor{Source: src, Tracker: cfg.tracker(), Options: cfg.options(), Kube: kube, Metrics: m, Log: cfg.Log}
	go a.Run(ctx, src.Changed(), interval, time.Second)
	return nil
}
