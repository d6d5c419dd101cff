package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// Reasons are the Events' reasons, by kind.
var reasons = map[audit.Kind]string{
	audit.SharedAddress:            "StorageNetworkAddressShared",
	audit.MissingAddress:           "StorageNetworkAddressMissing",
	audit.PodPoolMismatch:          "StorageNetworkAddressMismatch",
	audit.EntryReservationMismatch: "StorageNetworkReservationMismatch",
	audit.Headroom:                 "StorageNetworkHeadroomLow",
}

// Reason is the reason of the Event a finding of kind k records.
func Reason(k audit.Kind) string { return reasons[k] }

// Auditor looks at the cluster, keeps what stays wrong (audit.Tracker), and
// tells: an Event per finding that opens, the metrics, a log line.
type Auditor struct {
	Source  Source
	Tracker *audit.Tracker
	Options audit.Options
	// Kube records the Events; nil records none.
	Kube kubernetes.Interface
	// CallTimeout bounds each Event's request.
	CallTimeout time.Duration
	// Metrics, when set, shows the last look.
	Metrics *Collector
	// Log gets a line per finding that opens or closes; nil: none.
	Log io.Writer
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// EventErrors counts the Events that could not be recorded.
	EventErrors int
	// behindSince is when looks began to find an informer that does not
	// follow the cluster (zero: every one follows).
	behindSince time.Time
}

func (a *Auditor) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Look reads a snapshot, judges it and records what changed. A look that
// could not read everything it needs (the NADs) changes nothing: what was
// open stays open rather than closing for want of a list.
func (a *Auditor) Look(ctx context.Context) (audit.Change, audit.Result, error) {
	s, err := a.Source.Snapshot(ctx)
	if errors.Is(err, ErrNotFollowing) {
		// Judge nothing: what was open stays open, what was pending
		// waits. Said once per outage, and by the metric at every look.
		if a.behindSince.IsZero() {
			a.behindSince = a.now()
			a.logf("audit: not judging while an informer does not follow the cluster (an API server restart: each reconnects on its own backoff): %v", err)
		}
		if a.Metrics != nil {
			a.Metrics.setFollowing(false)
		}
		return audit.Change{}, audit.Result{}, err
	}
	if err == nil && s.NADsErr != nil {
		err = fmt.Errorf("audit: list NADs: %w", s.NADsErr)
	}
	if err != nil {
		return audit.Change{}, audit.Result{}, err
	}
	if !a.behindSince.IsZero() {
		a.logf("audit: every informer follows the cluster again, after %s: judging again", a.now().Sub(a.behindSince).Round(time.Second))
		a.behindSince = time.Time{}
	}
	if a.Metrics != nil {
		a.Metrics.setFollowing(true)
	}
	r := audit.Judge(s, a.Options)
	c := a.Tracker.Observe(a.now(), r.Findings)
	for _, o := range c.Opened {
		a.event(ctx, s.PoolNamespace, o)
		a.logf("audit: open: %s %s: %s (next: %s)", o.Kind, o.Network, o.Message, o.Command)
	}
	for _, f := range c.Closed {
		a.logf("audit: resolved: %s %s %s %s", f.Kind, f.Network, f.Address, strings.Join(f.Pods, ","))
	}
	if a.Metrics != nil {
		a.Metrics.set(c.Open, r.Figures, r.Networks)
	}
	return c, r, nil
}

// Twice looks, waits, and looks again: what a single run (a CronJob's
// pass, inspect --audit) reports. Graces longer than wait are cut to it:
// a single run cannot wait ten minutes for a Headroom finding.
func (a *Auditor) Twice(ctx context.Context, wait time.Duration) (audit.Change, audit.Result, error) {
	if _, _, err := a.Look(ctx); err != nil {
		return audit.Change{}, audit.Result{}, err
	}
	select {
	case <-ctx.Done():
		return audit.Change{}, audit.Result{}, ctx.Err()
	case <-time.After(wait):
	}
	return a.Look(ctx)
}

// Run looks whenever the source says something changed (after settle, so
// that a burst of changes is one look), when a pending finding is due, and
// at least every interval, until ctx ends. Errors are logged; it goes on.
func (a *Auditor) Run(ctx context.Context, changed <-chan struct{}, interval, settle time.Duration) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
		case <-timer.C:
		}
		next := interval
		c, _, err := a.Look(ctx)
		if errors.Is(err, ErrNotFollowing) {
			next = min(next, 5*time.Second) // and the source pokes when they follow again
		} else if err != nil {
			a.logf("audit: %v", err)
		} else if !c.NextDue.IsZero() {
			// A moment past due, so that the look finds it due.
			next = min(next, max(c.NextDue.Sub(a.now())+100*time.Millisecond, settle))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

func (a *Auditor) logf(format string, args ...any) {
	if a.Log != nil {
		fmt.Fprintf(a.Log, "%s %s\n", a.now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
	}
}

// event records a Warning on the finding's pod, or on its pool.
func (a *Auditor) event(ctx context.Context, poolNamespace string, o audit.Open) {
	if a.Kube == nil {
		return
	}
	ns, name := o.Subject()
	// kubectl describe shows the Events whose involvedObject has the
	// object's name, namespace, kind and UID: without the UID, none.
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: name, UID: o.SubjectUID}
	if name == "" {
		ref = corev1.ObjectReference{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPool", Namespace: poolNamespace, Name: o.Pool, UID: o.SubjectUID}
	}
	now := metav1.NewTime(a.now())
	msg := eventMessage(o.Message, o.Command)
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, time.Now().UnixNano()), Namespace: ref.Namespace},
		InvolvedObject: ref, Reason: Reason(o.Kind), Message: msg, Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: Component}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "harvesterhci.io/" + Component, ReportingInstance: Component,
	}
	timeout := a.CallTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := a.Kube.CoreV1().Events(ref.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		a.EventErrors++
		a.logf("audit: event %s on %s/%s: %v", ev.Reason, ref.Namespace, ref.Name, err)
	}
}

// Component is the Events' source: the reconciler's.
const Component = "harvester-ipam-reconciler"

// eventMessage is an Event's message: the finding's, cut to fit an
// Event's 1024 bytes, and the command to run next, never cut.
func eventMessage(message, command string) string {
	next := " Next: " + command
	if room := 1024 - len(next); len(message) > room {
		cut := max(room-3, 0)
		for cut > 0 && !utf8.RuneStart(message[cut]) {
			cut--
		}
		message = message[:cut] + "..."
	}
	return message + next
}
