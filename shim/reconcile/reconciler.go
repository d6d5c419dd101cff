package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/harvester/harvester-ipam/shim"
)

// Annotations that carry the first sighting of a stale entry across passes.
const (
	// StaleSinceAnnotation, on an IPPool: offset -> {id, since, reason}.
	StaleSinceAnnotation = "harvester-ipam.harvesterhci.io/stale-since"
	// OrphanSinceAnnotation, on an ORIP: when it was first seen orphaned.
	OrphanSinceAnnotation = "harvester-ipam.harvesterhci.io/orphan-since"
)

// sighting is the first time an entry was seen stale.
type sighting struct {
	ID     string    `json:"id"`
	Since  time.Time `json:"since"`
	Reason Reason    `json:"reason"`
}

// Reconciler releases stale allocations and orphaned reservations of one
// namespace's pools.
type Reconciler struct {
	Kube  kubernetes.Interface
	Store *shim.Store
	// Grace is how long an entry must have been seen stale before it is released.
	Grace time.Duration
	// DryRun judges and reports, and writes nothing, not even a sighting.
	DryRun bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// PageSize bounds each LIST (pods, ORIPs); zero is 1000.
	PageSize int64
	// EventErrors counts the Events that could not be created.
	EventErrors int
}

// Row is one line of a pass's plan: an entry found stale, and what was done.
type Row struct {
	Kind      string // "allocation" or "reservation"
	Pool      string
	IP        string
	PodRef    string
	Container string
	IfName    string
	Reason    Reason
	Since     time.Time // first sighting; zero in a dry run's first sight
	Action    string
}

// Report is what a pass found and did.
type Report struct {
	Pools, Allocations, ORIPs int
	Rows                      []Row
	Released                  []shim.Release
	DeletedORIPs              []string
	// Errors are the entries that could not be handled; the pass went on.
	Errors []error
}

// Candidates counts the stale entries, released or not.
func (r *Report) Candidates() int { return len(r.Rows) }

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

func (r *Reconciler) pageSize() int64 {
	if r.PageSize > 0 {
		return r.PageSize
	}
	return 1000
}

// Pass reads every pool, reservation and the pods and nodes they name, and
// releases what has been stale for the grace period. An error means the pass
// could not judge at all; entries it could not handle are in Report.Errors.
func (r *Reconciler) Pass(ctx context.Context) (*Report, error) {
	rep := &Report{}
	pools, err := r.listPools(ctx)
	if err != nil {
		return nil, err
	}
	orips, err := r.listORIPs(ctx)
	if err != nil {
		return nil, err
	}
	world, err := r.readWorld(ctx, pools)
	if err != nil {
		return nil, err
	}
	rep.Pools, rep.ORIPs = len(pools), len(orips)
	now := r.now()

	for i := range pools {
		p := &pools[i]
		rep.Allocations += len(p.Spec.Allocations)
		if err := r.reconcilePool(ctx, p, world, now, rep); err != nil {
			rep.Errors = append(rep.Errors, err)
		}
	}
	if len(rep.Released) > 0 {
		// Releases deleted reservations too: judge the rest on the pools as they are now.
		if pools, err = r.listPools(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.reconcileORIPs(ctx, pools, orips, now, rep); err != nil {
		rep.Errors = append(rep.Errors, err)
	}
	sort.SliceStable(rep.Rows, func(i, j int) bool {
		if rep.Rows[i].Pool != rep.Rows[j].Pool {
			return rep.Rows[i].Pool < rep.Rows[j].Pool
		}
		return rep.Rows[i].IP < rep.Rows[j].IP
	})
	return rep, nil
}

func (r *Reconciler) reconcilePool(ctx context.Context, p *whereaboutsv1alpha1.IPPool, world World, now time.Time, rep *Report) error {
	verdicts, err := Classify(p, world)
	if err != nil {
		return err
	}
	old := readSightings(p)
	seen := map[string]sighting{}
	due := map[string]whereaboutsv1alpha1.IPAllocation{}
	rows := map[string]int{}
	for _, v := range verdicts {
		if !v.Stale() {
			continue
		}
		s, ok := old[v.Offset]
		if !ok || s.ID != v.ContainerID {
			s = sighting{ID: v.ContainerID, Since: now, Reason: v.Reason}
			if r.DryRun {
				s.Since = time.Time{}
			}
		}
		s.Reason = v.Reason
		seen[v.Offset] = s
		row := Row{Kind: "allocation", Pool: p.Name, IP: v.IP.String(), PodRef: v.PodRef, Container: v.ContainerID, IfName: v.IfName, Reason: v.Reason, Since: s.Since}
		if !s.Since.IsZero() && now.Sub(s.Since) >= r.Grace {
			due[v.Offset] = v.IPAllocation
			row.Action = "release"
		} else {
			row.Action = "wait " + (r.Grace - now.Sub(orNow(s.Since, now))).Round(time.Second).String()
		}
		rows[v.Offset] = len(rep.Rows)
		rep.Rows = append(rep.Rows, row)
	}
	if r.DryRun {
		for off := range due {
			rep.Rows[rows[off]].Action = "would release"
		}
		return nil
	}

	if len(due) > 0 {
		fresh, err := r.freshWorld(ctx, due)
		if err != nil {
			return err
		}
		released, err := r.Store.Release(ctx, p.Name, NetworkName(p), stillStale(p.Spec.Range, due, fresh))
		for _, rel := range released {
			rep.Released = append(rep.Released, rel)
			delete(seen, rel.Offset)
			r.event(ctx, p, rel)
		}
		for off := range due {
			if !releasedOffset(released, off) {
				rep.Rows[rows[off]].Action = "kept: live on a fresh look"
				delete(seen, off)
			}
		}
		if err != nil {
			return fmt.Errorf("release stale entries of pool %s: %w", p.Name, err)
		}
	}
	// Record first sightings, and forget entries no longer stale; a pass that
	// changes nothing writes nothing (and reads nothing more).
	want := func(cur *whereaboutsv1alpha1.IPPool) string {
		keep := map[string]sighting{}
		for off, s := range seen {
			if a, ok := cur.Spec.Allocations[off]; ok && a.ContainerID == s.ID {
				keep[off] = s
			}
		}
		if len(keep) == 0 {
			return ""
		}
		b, _ := json.Marshal(keep)
		return string(b)
	}
	if len(due) == 0 && want(p) == p.Annotations[StaleSinceAnnotation] {
		return nil
	}
	return r.Store.SetPoolAnnotation(ctx, p.Name, StaleSinceAnnotation, want)
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

func releasedOffset(rs []shim.Release, off string) bool {
	for _, r := range rs {
		if r.Offset == off {
			return true
		}
	}
	return false
}

// stillStale picks the due entries that are unchanged in the fresh pool and
// still stale when judged again against a fresh look at their pods and nodes.
func stillStale(rng string, due map[string]whereaboutsv1alpha1.IPAllocation, fresh World) shim.Picker {
	return func(allocs map[string]whereaboutsv1alpha1.IPAllocation) []string {
		cands := shim.Exactly(due)(allocs)
		if len(cands) == 0 {
			return nil
		}
		verdicts, err := Classify(&whereaboutsv1alpha1.IPPool{Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}, fresh)
		if err != nil {
			return nil // in doubt, release nothing
		}
		stale := map[string]bool{}
		for _, v := range verdicts {
			stale[v.Offset] = v.Stale()
		}
		var out []string
		for _, off := range cands {
			if stale[off] {
				out = append(out, off)
			}
		}
		return out
	}
}

// freshGETs bounds the pods a fresh look GETs one by one; more are listed
// again, namespace by namespace, so a pass's requests stay bounded by
// namespaces when a node with hundreds of pods goes.
const freshGETs = 20

// freshWorld looks again at the pods (and their nodes) of the due entries.
func (r *Reconciler) freshWorld(ctx context.Context, due map[string]whereaboutsv1alpha1.IPAllocation) (World, error) {
	pods := map[string]bool{}
	for _, a := range due {
		pods[a.PodRef] = true
	}
	if len(pods) > freshGETs {
		var ps []whereaboutsv1alpha1.IPPool
		allocs := map[string]whereaboutsv1alpha1.IPAllocation{}
		for off, a := range due {
			allocs[off] = a
		}
		ps = append(ps, whereaboutsv1alpha1.IPPool{Spec: whereaboutsv1alpha1.IPPoolSpec{Allocations: allocs}})
		return r.readWorld(ctx, ps)
	}
	w := World{Pods: map[string]*corev1.Pod{}, Nodes: map[string]bool{}, NodesKnown: true}
	for _, a := range due {
		ns, name, ok := strings.Cut(a.PodRef, "/")
		if !ok {
			continue
		}
		if _, done := w.Pods[a.PodRef]; done {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
		pod, err := r.Kube.CoreV1().Pods(ns).Get(cctx, name, metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return World{}, fmt.Errorf("get pod %s: %w", a.PodRef, err)
		}
		w.Pods[a.PodRef] = pod
		if node := pod.Spec.NodeName; node != "" {
			if _, done := w.Nodes[node]; !done {
				cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
				_, err := r.Kube.CoreV1().Nodes().Get(cctx, node, metav1.GetOptions{})
				cancel()
				switch {
				case apierrors.IsNotFound(err):
					w.Nodes[node] = false
				case err != nil:
					w.NodesKnown = false // in doubt: the node may exist
				default:
					w.Nodes[node] = true
				}
			}
		}
	}
	return w, nil
}

func readSightings(p *whereaboutsv1alpha1.IPPool) map[string]sighting {
	out := map[string]sighting{}
	if raw, ok := p.Annotations[StaleSinceAnnotation]; ok {
		_ = json.Unmarshal([]byte(raw), &out) // unreadable: start the grace again
	}
	return out
}

func (r *Reconciler) reconcileORIPs(ctx context.Context, pools []whereaboutsv1alpha1.IPPool, orips []whereaboutsv1alpha1.OverlappingRangeIPReservation, now time.Time, rep *Report) error {
	var orphans []*whereaboutsv1alpha1.OverlappingRangeIPReservation
	released := map[string]bool{}
	for _, rel := range rep.Released {
		if rel.ORIP != "" {
			released[rel.ORIP] = true
		}
	}
	verdicts, err := ClassifyORIPs(pools, orips)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range verdicts {
		o := v.ORIP
		if released[o.Name] {
			continue // deleted with its allocation in this pass
		}
		since, ok := parseTime(o.Annotations[OrphanSinceAnnotation])
		if v.Reason == Live {
			if ok && !r.DryRun {
				// Backed again: forget the sighting.
				if err := r.annotateORIP(ctx, o, ""); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		row := Row{Kind: "reservation", Pool: "-", IP: o.Name, PodRef: o.Spec.PodRef, Container: o.Spec.ContainerID, IfName: o.Spec.IfName, Reason: v.Reason, Since: since}
		if !ok && r.Grace <= 0 {
			since, ok = now, true // no grace: due at first sight
		}
		switch {
		case !ok && r.DryRun:
			row.Action = "wait " + r.Grace.String()
		case !ok:
			row.Since = now
			row.Action = "wait " + r.Grace.String()
			if err := r.annotateORIP(ctx, o, now.Format(time.RFC3339)); err != nil {
				errs = append(errs, err)
			}
		case now.Sub(since) < r.Grace:
			row.Action = "wait " + (r.Grace - now.Sub(since)).Round(time.Second).String()
		case r.DryRun:
			row.Action = "would delete"
		default:
			row.Action = "delete"
			orphans = append(orphans, o)
		}
		rep.Rows = append(rep.Rows, row)
	}
	if len(orphans) > 0 {
		// A fresh look: an allocation may have come for the address meanwhile.
		fresh, err := r.listPools(ctx)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		again, err := ClassifyORIPs(fresh, derefs(orphans))
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, v := range again {
			if v.Reason == Live {
				continue
			}
			if err := r.Store.DeleteORIP(ctx, v.ORIP); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.DeletedORIPs = append(rep.DeletedORIPs, v.ORIP.Name)
			r.oripEvent(ctx, v.ORIP)
		}
	}
	return errors.Join(errs...)
}

func derefs(os []*whereaboutsv1alpha1.OverlappingRangeIPReservation) []whereaboutsv1alpha1.OverlappingRangeIPReservation {
	out := make([]whereaboutsv1alpha1.OverlappingRangeIPReservation, len(os))
	for i, o := range os {
		out[i] = *o
	}
	return out
}

// annotateORIP records (or with "" forgets) an ORIP's first orphan sighting.
// The patch tests the resourceVersion, so a reservation recreated meanwhile is
// not stamped.
func (r *Reconciler) annotateORIP(ctx context.Context, o *whereaboutsv1alpha1.OverlappingRangeIPReservation, since string) error {
	ops := []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": o.ResourceVersion}}
	key := "/metadata/annotations/" + strings.ReplaceAll(OrphanSinceAnnotation, "/", "~1")
	switch {
	case since == "":
		ops = append(ops, map[string]any{"op": "remove", "path": key})
	case o.Annotations == nil:
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations", "value": map[string]string{OrphanSinceAnnotation: since}})
	default:
		ops = append(ops, map[string]any{"op": "add", "path": key, "value": since})
	}
	body, _ := json.Marshal(ops)
	cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
	defer cancel()
	_, err := r.Store.Client().OverlappingRangeIPReservations(r.Store.Namespace()).Patch(cctx, o.Name, types.JSONPatchType, body, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("annotate reservation %s: %w", o.Name, err)
	}
	return nil // changed meanwhile: judged again next pass
}

func parseTime(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}
