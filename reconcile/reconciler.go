package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/harvester/harvester-ipam/shim"
)

// OrphanSinceAnnotation, on an ORIP: when it was first seen orphaned.
const OrphanSinceAnnotation = "harvester-ipam.harvesterhci.io/orphan-since"

// Reconciler releases stale allocations and orphaned reservations of one
// namespace's pools. It reads and writes whereabouts' objects only through
// Store, and the rest of the cluster through Cluster.
type Reconciler struct {
	Store   *shim.Store
	Cluster Cluster
	// Grace is how long an entry must have been seen stale before it is released.
	Grace time.Duration
	// DryRun judges and reports, and writes nothing, not even a sighting.
	DryRun bool
	// DeleteOrphanedPools deletes a pool that no NAD names and that holds no
	// live entry, once it has been seen so for Grace.
	DeleteOrphanedPools bool
	// Now is the clock; nil is the store's.
	Now func() time.Time
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
	Since     time.Time // first sighting; zero when not recorded
	Action    string
}

// PoolStats are one pool's figures after a pass (what it released no longer
// counted), for the metrics.
type PoolStats struct {
	Pool  string
	Range string
	// Usage is how full the pool is, with the excludes and bounds of the NAD
	// that names it when one was read.
	Usage
	Allocated int
	Stale     int
	// OldestStale is how long the oldest recorded stale sighting has been
	// stale; zero when none.
	OldestStale time.Duration
	// Orphaned: no NAD names the pool (known only when the NADs are).
	Orphaned bool
}

// Report is what a pass found and did.
type Report struct {
	Pools, Allocations, ORIPs int
	Rows                      []Row
	Stats                     []PoolStats
	Released                  []shim.Allocation
	// ReleasedORIPs are the reservations deleted with their allocations;
	// DeletedORIPs the orphaned ones.
	ReleasedORIPs, DeletedORIPs []string
	// DeletedPools are the orphaned pools deleted.
	DeletedPools []string
	// NADs is what the NADs said; NADs.Known is false when they could not be read.
	NADs *NADs
	// Errors are the entries that could not be handled; the pass went on.
	Errors []error
}

// Candidates counts the stale entries, released or not.
func (r *Report) Candidates() int { return len(r.Rows) }

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return r.Store.Now().UTC()
}

// Pass reads every pool, reservation and the pods and nodes they name, and
// releases what has been stale for the grace period. An error means the pass
// could not judge at all; entries it could not handle are in Report.Errors.
func (r *Reconciler) Pass(ctx context.Context) (*Report, error) {
	rep := &Report{}
	pools, err := r.Store.Pools(ctx)
	if err != nil {
		return nil, err
	}
	orips, err := r.Store.Reservations(ctx)
	if err != nil {
		return nil, err
	}
	world, err := r.readWorld(ctx, pools)
	if err != nil {
		return nil, err
	}
	sb := SandboxesOf(pools)
	rep.Pools, rep.ORIPs = len(pools), len(orips)
	rep.NADs = IndexNADs(r.Cluster.NADs(ctx))
	now := r.now()

	for i := range pools {
		p := &pools[i]
		rep.Allocations += len(p.Spec.Allocations)
		if err := r.reconcilePool(ctx, p, world, sb, rep.NADs, now, rep); err != nil {
			rep.Errors = append(rep.Errors, err)
		}
	}
	if err := r.reconcileOrphanedPools(ctx, pools, world, now, rep); err != nil {
		rep.Errors = append(rep.Errors, err)
	}
	if err := r.reconcileORIPs(ctx, orips, now, rep); err != nil {
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

// reconcilePool judges one pool's entries, releases those seen stale twice
// over the grace, records the sightings and adds the pool's figures to rep.
func (r *Reconciler) reconcilePool(ctx context.Context, p *shim.Pool, world World, sb Sandboxes, nads *NADs, now time.Time, rep *Report) error {
	verdicts, err := Classify(p, world, sb)
	if err != nil {
		return err
	}
	pp := r.sight(p, verdicts, now, rep)
	// The figures are the pool's once this pass is done with it: what it
	// releases is free again (the gauges must not say "full" for a minute
	// after the pass that emptied it).
	var released map[string]bool
	defer func() { rep.Stats = append(rep.Stats, pp.stats(verdicts, released, nads)) }()
	if r.DryRun {
		pp.dryRun(rep)
		return nil
	}
	if len(pp.due) > 0 {
		released, err = r.release(ctx, p, pp.due, rep)
		for off := range pp.due {
			if !released[off] {
				rep.Rows[pp.rows[off]].Action = "kept: live on a fresh look"
			}
			delete(pp.seen, off)
		}
		if err != nil {
			return fmt.Errorf("release stale entries of pool %s: %w", p.Name, err)
		}
	}
	return r.recordSightings(ctx, pp, rep)
}

// poolPass is a pass's look at one pool's stale entries.
type poolPass struct {
	p *shim.Pool
	// old are the sightings the pool recorded, seen this pass's.
	old, seen sightings
	// due are the entries seen stale twice, over the grace apart.
	due map[string]shim.IPAllocation
	// rows index the report's row of each stale entry by offset.
	rows map[string]int
	// ages are how long each entry has been seen stale.
	ages map[string]time.Duration
}

// sight judges p's stale entries against the sightings it recorded: each
// is due once seen twice, Grace apart, under the same holder; each gets its
// row in rep.
func (r *Reconciler) sight(p *shim.Pool, verdicts []Verdict, now time.Time, rep *Report) *poolPass {
	pp := &poolPass{p: p, old: decodeSightings(p.Annotations[StaleSinceAnnotation]), seen: sightings{},
		due: map[string]shim.IPAllocation{}, rows: map[string]int{}, ages: map[string]time.Duration{}}
	for _, v := range verdicts {
		if !v.Stale() {
			continue
		}
		s, ok := pp.old[v.Offset]
		if !ok || s.holder != holderOf(v.ContainerID) {
			// Recorded to the second, rounded up: never a grace shorter than Grace.
			s = sighting{holder: holderOf(v.ContainerID), since: ceilSecond(now)}
		} else if age := now.Sub(s.since); age > 0 {
			pp.ages[v.Offset] = age
		}
		pp.seen[v.Offset] = s
		row := Row{Kind: "allocation", Pool: p.Name, IP: v.IP.String(), PodRef: v.PodRef, Container: v.ContainerID, IfName: v.IfName, Reason: v.Reason, Since: s.since}
		if ok && s == pp.old[v.Offset] && now.Sub(s.since) >= r.Grace {
			pp.due[v.Offset] = v.IPAllocation
			row.Action = "release"
		} else if r.Grace <= 0 {
			pp.due[v.Offset] = v.IPAllocation
			row.Action = "release"
		} else {
			row.Action = "wait " + (r.Grace - now.Sub(s.since)).Round(time.Second).String()
		}
		pp.rows[v.Offset] = len(rep.Rows)
		rep.Rows = append(rep.Rows, row)
	}
	return pp
}

// dryRun says what the pass would release, and records nothing.
func (pp *poolPass) dryRun(rep *Report) {
	for off, s := range pp.seen {
		if _, recorded := pp.old[off]; !recorded || pp.old[off] != s {
			rep.Rows[pp.rows[off]].Since = time.Time{} // a dry run records nothing
		}
	}
	for off := range pp.due {
		rep.Rows[pp.rows[off]].Action = "would release"
	}
}

// stats are the pool's figures once the pass is done with it.
func (pp *poolPass) stats(verdicts []Verdict, released map[string]bool, nads *NADs) PoolStats {
	left := make([]Verdict, 0, len(verdicts))
	stats := PoolStats{Pool: pp.p.Name, Range: pp.p.Spec.Range, Orphaned: nads.Orphaned(pp.p)}
	for _, v := range verdicts {
		if released[v.Offset] {
			continue
		}
		left = append(left, v)
		if v.Stale() {
			stats.Stale++
			stats.OldestStale = max(stats.OldestStale, pp.ages[v.Offset])
		}
	}
	stats.Allocated = len(left)
	stats.Usage = nads.Usage(pp.p, left)
	return stats
}

// recordSightings records first sightings and forgets entries no longer
// stale; a pass that changes nothing writes nothing.
func (r *Reconciler) recordSightings(ctx context.Context, pp *poolPass, rep *Report) error {
	var unsighted []string // offsets past the annotation's budget, as last written
	want := func(cur *shim.Pool) string {
		keep := sightings{}
		for off, s := range pp.seen {
			if a, ok := cur.Spec.Allocations[off]; ok && holderOf(a.ContainerID) == s.holder {
				keep[off] = s
			}
		}
		enc, left := keep.encode()
		unsighted = left
		return enc
	}
	// Only the entries the budget left out wait to be sighted; the ones this
	// pass recorded have started their grace.
	label := func() {
		for _, off := range unsighted {
			if i, ok := pp.rows[off]; ok {
				rep.Rows[i].Action = "wait: sighted once the stale entries recorded before are released"
			}
		}
	}
	if len(pp.due) == 0 && want(pp.p) == pp.p.Annotations[StaleSinceAnnotation] {
		label()
		return nil
	}
	err := r.Store.SetPoolAnnotation(ctx, pp.p.Name, StaleSinceAnnotation, want)
	label()
	return err
}

// release frees due entries of p that are unchanged and, judged again on a
// fresh look at their pods and nodes, still stale: their reservations first,
// then the entries. It returns the offsets released.
func (r *Reconciler) release(ctx context.Context, p *shim.Pool, due map[string]shim.IPAllocation, rep *Report) (map[string]bool, error) {
	fresh, err := r.freshWorld(ctx, due)
	if err != nil {
		return nil, err
	}
	pools, err := r.Store.Pools(ctx)
	if err != nil {
		return nil, err
	}
	sb := SandboxesOf(pools)
	plan, err := r.Store.Plan(ctx, p.Name, NetworkName(p), stillStale(due, fresh, sb))
	if err != nil {
		return nil, err
	}
	deleted, err := r.Store.ReleaseReservations(ctx, plan)
	rep.ReleasedORIPs = append(rep.ReleasedORIPs, deleted...)
	if err != nil {
		return nil, err
	}
	removed, err := r.Store.RemoveAllocations(ctx, plan)
	out := map[string]bool{}
	for _, a := range removed {
		out[a.Offset] = true
	}
	rep.Released = append(rep.Released, removed...)
	r.events(ctx, p, removed, deleted, plan.Network)
	return out, err
}

// stillStale picks the due entries that are unchanged in the pool as read
// and still stale when judged again on a fresh look.
func stillStale(due map[string]shim.IPAllocation, fresh World, sb Sandboxes) shim.Picker {
	return func(p *shim.Pool) []string {
		cands := shim.Exactly(due)(p)
		if len(cands) == 0 {
			return nil
		}
		verdicts, err := Classify(p, fresh, sb)
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

func (r *Reconciler) reconcileORIPs(ctx context.Context, orips []shim.Reservation, now time.Time, rep *Report) error {
	released := map[string]bool{}
	for _, name := range rep.ReleasedORIPs {
		released[name] = true
	}
	var remaining []shim.Reservation
	for _, o := range orips {
		if !released[o.Name] {
			remaining = append(remaining, o)
		}
	}
	// Releases changed the pools: judge on the pools as they are now.
	pools, err := r.Store.Pools(ctx)
	if err != nil {
		return err
	}
	verdicts, err := ClassifyORIPs(pools, remaining)
	if err != nil {
		return err
	}
	var errs []error
	var due []shim.Reservation
	for _, v := range verdicts {
		o := v.ORIP
		since, ok := parseTime(o.Annotations[OrphanSinceAnnotation])
		if v.Reason == Live {
			if ok && !r.DryRun {
				// Backed again: forget the sighting.
				if _, err := r.Store.MarkReservation(ctx, o, OrphanSinceAnnotation, ""); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		row := Row{Kind: "reservation", Pool: "-", IP: o.Name, PodRef: o.Spec.PodRef, Container: o.Spec.ContainerID, IfName: o.Spec.IfName, Reason: v.Reason, Since: since}
		switch {
		case r.Grace <= 0 && r.DryRun:
			row.Action = "would delete"
		case r.Grace <= 0:
			row.Action = "delete"
			due = append(due, *o)
		case !ok && r.DryRun:
			row.Action = "wait " + r.Grace.String()
		case !ok:
			row.Since = now
			row.Action = "wait " + r.Grace.String()
			if _, err := r.Store.MarkReservation(ctx, o, OrphanSinceAnnotation, now.Format(time.RFC3339)); err != nil {
				errs = append(errs, err)
			}
		case now.Sub(since) < r.Grace:
			row.Action = "wait " + (r.Grace - now.Sub(since)).Round(time.Second).String()
		case r.DryRun:
			row.Action = "would delete"
		default:
			row.Action = "delete"
			due = append(due, *o)
		}
		rep.Rows = append(rep.Rows, row)
	}
	if len(due) > 0 {
		deleted, err := r.deleteOrphans(ctx, due)
		rep.DeletedORIPs = append(rep.DeletedORIPs, deleted...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteOrphans deletes the due reservations that are, while whereabouts'
// Lease is held and on the pools as they are then, still orphaned, and
// unchanged since the pass read them.
func (r *Reconciler) deleteOrphans(ctx context.Context, due []shim.Reservation) ([]string, error) {
	var deleted []string
	err := r.Store.Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
		pools, err := l.Pools(ctx)
		if err != nil {
			return err
		}
		again, err := ClassifyORIPs(pools, due)
		if err != nil {
			return err
		}
		for _, v := range again {
			if v.Reason == Live {
				continue
			}
			ok, err := l.DeleteReservation(ctx, v.ORIP)
			if err != nil {
				return err
			}
			if ok {
				deleted = append(deleted, v.ORIP.Name)
				r.oripEvent(ctx, v.ORIP)
			}
		}
		return nil
	})
	return deleted, err
}

func ceilSecond(t time.Time) time.Time {
	if f := t.Truncate(time.Second); f.Before(t) {
		return f.Add(time.Second)
	}
	return t
}

func parseTime(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}
