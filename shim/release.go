package shim

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Plan is what a release removes from one pool: the entries a picker chose on
// a fresh read, with the network_name their reservations are named under.
type Plan struct {
	Pool    string
	Network string
	Entries []Allocation
	// Base is the read of the pool the plan was made on: the removal's first
	// patch is guarded by its resourceVersion (nil: read fresh first).
	Base *Pool
}

// Empty says that the plan releases nothing.
func (pl Plan) Empty() bool { return len(pl.Entries) == 0 }

// Plan reads a pool fresh and plans the release of what pick chooses; a pool
// that does not exist holds nothing.
func (s *Store) Plan(ctx context.Context, pool, networkName string, pick Picker) (Plan, error) {
	p, err := s.Pool(ctx, pool)
	if err != nil || p == nil {
		return Plan{Pool: pool, Network: networkName}, err
	}
	return PlanOf(p, networkName, pick)
}

// PlanOf plans the release of what pick chooses from p, which the caller has
// just read fresh.
func PlanOf(p *Pool, networkName string, pick Picker) (Plan, error) {
	es, err := entries(p, pick(p))
	return Plan{Pool: p.Name, Network: networkName, Entries: es, Base: p}, err
}

// maxRemovals bounds the removals of one patch: the API server refuses a JSON
// patch of more than 10,000 operations, and a huge one holds the pool long.
const maxRemovals = 1000

// RemoveAllocations removes from the plan's pool the planned entries that are
// still what the plan saw (an entry that changed hands since is another
// sandbox's now), in guarded patches of at most maxRemovals removals. The
// first patch is guarded by the read the plan was made on (Plan.Base); a
// conflict (the pool changed since) reads it fresh and tries again, and so
// does each retry. It returns the entries removed. With Options.Group, the
// removals from one pool that wait at one moment go in one patch.
func (s *Store) RemoveAllocations(ctx context.Context, plan Plan) ([]Allocation, error) {
	if g := s.o.Group; g != nil {
		return g.removeAllocations(ctx, s, plan)
	}
	var removed []Allocation
	base := plan.Base
	for start := 0; start < len(plan.Entries); start += maxRemovals {
		chunk := plan.Entries[start:min(start+maxRemovals, len(plan.Entries))]
		want := make(map[string]whereaboutsv1alpha1.IPAllocation, len(chunk))
		for _, e := range chunk {
			want[e.Offset] = e.IPAllocation
		}
		var done []Allocation
		var err error
		done, base, err = s.removeOnce(ctx, plan.Pool, want, base)
		removed = append(removed, done...)
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// removeOnce removes the entries of want that are still as wanted from
// pool in one guarded patch: first on base when set (the read a plan was
// made on, which shows them, or the pool as the previous patch left it),
// then, after a conflict or without a base, on fresh reads, retried as every
// pool write is. It returns the entries removed and the pool as
// the patch left it (nil when it is not known).
func (s *Store) removeOnce(ctx context.Context, pool string, want map[string]whereaboutsv1alpha1.IPAllocation, base *Pool) ([]Allocation, *Pool, error) {
	var done []Allocation
	var after *Pool
	attempt := func(p *Pool) error {
		done, after = nil, nil
		offsets := Exactly(want)(p)
		if len(offsets) == 0 {
			after = p
			return nil
		}
		es, err := entries(p, offsets)
		if err != nil {
			return err
		}
		cctx, cancel := s.callWrite(ctx)
		defer cancel()
		written, err := s.api.PatchPool(cctx, s.namespace, pool, removeAllocations(p.ResourceVersion, offsets))
		if apierrors.IsNotFound(err) {
			return nil // deleted under us: nothing left to remove
		}
		if err != nil {
			return fmt.Errorf("release %s from pool %s/%s: %w", describe(es), s.namespace, pool, err)
		}
		done, after = es, written
		return nil
	}
	first := 1
	if base != nil {
		err := attempt(base)
		if !isConflict(err) || s.o.Backoff.Steps <= 1 {
			return done, after, err
		}
		// The pool changed since the plan's read: read it fresh at once.
		s.retried.Add(1)
		first = 2
	}
	err := s.retryFrom(ctx, first, func() error {
		p, err := s.Pool(ctx, pool)
		if err != nil || p == nil {
			done, after = nil, nil
			return err
		}
		return attempt(p)
	})
	return done, after, err
}

// quickLook bounds the reservations ReleaseReservations GETs one by one before
// taking the Lease; more are listed in one go.
const quickLook = 20

// ReleaseReservations deletes the reservations of the plan's entries that
// are still theirs (same podref, and container when the reservation names
// one) and that no other entry of the pod holds: in any pool that may hold
// reservations of the plan's network (an overlapping range, a node slice), a
// new sandbox of the pod may have the address again, and then the
// reservation is its. The judgement and the delete happen while whereabouts'
// Lease is held, so that no whereabouts ADD can take the address (and keep
// its reservation, as whereabouts does when the podref matches) between the
// two; without a reservation that may be the entries', the Lease is not
// taken. It returns the names deleted, sorted.
//
// With Options.Group, the releases that wait at one moment are judged
// together, under one acquisition of the Lease and one list of the pools
// (Group).
func (s *Store) ReleaseReservations(ctx context.Context, plan Plan) ([]string, error) {
	cands, err := s.reservationCandidates(ctx, plan)
	if err != nil || len(cands) == 0 {
		return nil, err
	}
	j := &releaseJob{ctx: ctx, network: plan.Network, cands: cands, going: map[string]bool{}}
	for _, e := range plan.Entries {
		j.going[goingKey(plan.Pool, e.Offset, e.ContainerID)] = true
	}
	if g := s.o.Group; g != nil {
		g.releaseReservations(s, j)
	} else {
		err := s.Locked(ctx, func(ctx context.Context, l *Locked) error { return l.releaseJobs(ctx, []*releaseJob{j}, 1) })
		if j.err == nil {
			j.err = err
		}
	}
	sort.Strings(j.deleted)
	return j.deleted, j.err
}

// Release frees what a plan holds, entries and reservations, when the
// process keeps its own copy of the pools (Local; a node agent): in one
// turn under whereabouts' Lease, the entries are removed first, as
// whereabouts' own DEL removes them (a guarded patch, each entry only while
// it is what the plan saw), then each reservation is judged and deleted as
// ReleaseReservations does, on one list of the pools as of that patch
// (resourceVersionMatch=NotOlderThan: the API server answers it from its
// watch cache as soon as the cache has that write, without waiting for it
// to catch up with the Lease's write as a list without a resourceVersion
// does). The patch was written under the Lease, so the list holds every
// pool write made before the Lease was taken (whereabouts writes pools only
// under it). The copy is never what a reservation is judged on: it is not
// one snapshot. Without a patch (the entries were gone), the pools are
// listed fresh. Without a reservation to judge, the entries are removed
// without the Lease.
//
// A crash between the two steps leaves the reservations without their
// entries, as whereabouts' own DEL may: the next DEL judges the
// reservations of the addresses its checkpoint recorded, and the
// reconciler deletes a reservation no entry of its pod holds.
//
// Without a copy of its own (HasLocal false), callers release in the two
// steps ReleaseReservations, then RemoveAllocations.
func (s *Store) Release(ctx context.Context, plan Plan) (removed []Allocation, deleted []string, err error) {
	if plan.Empty() {
		return nil, nil, nil
	}
	cands, err := s.reservationCandidates(ctx, plan)
	if err != nil {
		return nil, nil, err
	}
	if len(cands) == 0 {
		removed, err := s.RemoveAllocations(ctx, plan)
		return removed, nil, err
	}
	going := map[string]bool{}
	for _, e := range plan.Entries {
		going[goingKey(plan.Pool, e.Offset, e.ContainerID)] = true
	}
	j := &releaseJob{ctx: ctx, network: plan.Network, cands: cands, going: going, plan: plan, remove: true}
	s.runRelease(ctx, j)
	removed, deleted = j.removed, j.deleted
	// The entries are gone and the reservations were not judged (the API
	// server went away between, or the Lease was lost): nothing will look
	// at them again but the reconciler, after its grace, since the pod's
	// next ADD looks for entries. So they are judged again, as
	// ReleaseReservations judges (a fresh list under the Lease), for a while.
	deadline := s.Now().Add(rejudgeFor)
	for wait := rejudgeFirst; j.err != nil && len(removed) > 0 && ctx.Err() == nil; wait = min(2*wait, rejudgeMax) {
		if !s.Now().Add(wait).Before(deadline) {
			break
		}
		if serr := s.o.Clock.Sleep(ctx, wait); serr != nil {
			break
		}
		j = &releaseJob{ctx: ctx, network: plan.Network, cands: cands, going: going}
		s.runRelease(ctx, j)
		deleted = append(deleted, j.deleted...)
	}
	sort.Strings(deleted)
	return removed, slices.Compact(deleted), j.err
}

// A release whose entries are gone and whose reservations were not judged
// judges them again for rejudgeFor (an API server's restart), the waits
// doubling from rejudgeFirst up to rejudgeMax.
const (
	rejudgeFor   = 30 * time.Second
	rejudgeFirst = 250 * time.Millisecond
	rejudgeMax   = 5 * time.Second
)

// runRelease runs j under whereabouts' Lease: in a turn of the Group, or
// under a Lease of its own.
func (s *Store) runRelease(ctx context.Context, j *releaseJob) {
	if g := s.o.Group; g != nil {
		g.releaseReservations(s, j)
		return
	}
	err := s.Locked(ctx, func(ctx context.Context, l *Locked) error { return l.releaseJobs(ctx, []*releaseJob{j}, 1) })
	if j.err == nil {
		j.err = err
	}
}

// HasLocal says whether the store's API keeps a copy of its own (Local):
// then Release frees a plan in one turn.
func (s *Store) HasLocal() bool { return s.local() != nil }

// Free frees what a plan holds, entries and reservations, as the store
// frees best: with a copy of its own (a node agent), in one turn under
// whereabouts' Lease (Release); otherwise in the two steps
// ReleaseReservations then RemoveAllocations, calling between (a crash
// point, a step timer) after the first. A crash between the two leaves the
// entries, which the next ADD, DEL or reconciler pass releases. It returns
// the entries removed and the reservations deleted.
func (s *Store) Free(ctx context.Context, plan Plan, between func()) (removed []Allocation, deleted []string, err error) {
	if plan.Empty() {
		return nil, nil, nil
	}
	if s.HasLocal() {
		removed, deleted, err = s.Release(ctx, plan)
		if err != nil {
			err = fmt.Errorf("release %s from pool %s/%s: %w", describe(plan.Entries), s.namespace, plan.Pool, err)
		}
		return removed, deleted, err
	}
	deleted, err = s.ReleaseReservations(ctx, plan)
	if err != nil {
		return nil, nil, fmt.Errorf("release the reservations of %s from pool %s/%s: %w", describe(plan.Entries), s.namespace, plan.Pool, err)
	}
	if between != nil {
		between()
	}
	removed, err = s.RemoveAllocations(ctx, plan)
	return removed, deleted, err
}
