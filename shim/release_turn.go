package shim

import (
	"context"
	"sort"
	"strconv"
	"sync"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"

	"github.com/harvester/harvester-ipam/conf/names"
)

// releaseJob is one ReleaseReservations (or Release): its candidates, the
// entries its plan releases, and what became of it.
type releaseJob struct {
	ctx     context.Context
	network string
	cands   []candidate
	going   map[string]bool
	deleted []string
	err     error
	done    chan struct{} // closed when a Group has run it
	// With remove (Release), the plan's entries are removed first, under
	// the Lease, and removed says which.
	plan    Plan
	remove  bool
	removed []Allocation
}

// removeFirst removes the entries of the jobs that release them (Release),
// one guarded patch per pool for all of them (one that wants another entry
// at an offset another wants waits for a patch of its own), and returns the
// resourceVersion of the newest patch that removed something ("" when none
// did). A job whose removal fails has its error, and its reservations are
// not judged.
func (l *Locked) removeFirst(ctx context.Context, jobs []*releaseJob) (latest string) {
	var newest uint64
	byPool := map[string][]*releaseJob{}
	var order []string
	for _, j := range jobs {
		if !j.remove || len(j.plan.Entries) == 0 {
			continue
		}
		if byPool[j.plan.Pool] == nil {
			order = append(order, j.plan.Pool)
		}
		byPool[j.plan.Pool] = append(byPool[j.plan.Pool], j)
	}
	for _, pool := range order {
		pending := byPool[pool]
		for len(pending) > 0 {
			want := map[string]whereaboutsv1alpha1.IPAllocation{}
			var round, later []*releaseJob
			var base *Pool
			for _, j := range pending {
				mine := map[string]whereaboutsv1alpha1.IPAllocation{}
				for _, e := range j.plan.Entries {
					mine[e.Offset] = e.IPAllocation
				}
				if clashes(want, mine) {
					later = append(later, j)
					continue
				}
				round = append(round, j)
				for off, a := range mine {
					want[off] = a
				}
				if newerPool(j.plan.Base, base) {
					base = j.plan.Base
				}
			}
			pending = later
			var done []Allocation
			var err error
			offs := make([]string, 0, len(want))
			for off := range want {
				offs = append(offs, off)
			}
			sort.Strings(offs)
			for start := 0; start < len(offs) && err == nil; start += maxRemovals {
				chunk := map[string]whereaboutsv1alpha1.IPAllocation{}
				for _, off := range offs[start:min(start+maxRemovals, len(offs))] {
					chunk[off] = want[off]
				}
				if err = l.Keep(ctx); err != nil {
					break
				}
				var got []Allocation
				var after *Pool
				// As long as the write takes: the next Keep (the next chunk's,
				// or before the list) says whether the turn goes on.
				got, after, err = l.s.removeOnce(mayLandLate(ctx), pool, chunk, base)
				done = append(done, got...)
				base = after
				if len(got) > 0 && after != nil {
					if n, perr := strconv.ParseUint(after.ResourceVersion, 10, 64); perr == nil && n > newest {
						newest, latest = n, after.ResourceVersion
					}
				}
			}
			given := map[string]bool{}
			for _, j := range round {
				for _, a := range done {
					if e, ok := plannedAt(j.plan, a.Offset); ok && e.IPAllocation == a.IPAllocation && !given[a.Offset] {
						given[a.Offset] = true
						j.removed = append(j.removed, a)
					}
				}
				if err != nil {
					j.err = err
				}
			}
		}
	}
	return latest
}

// plannedAt is the plan's entry at offset.
func plannedAt(p Plan, offset string) (Allocation, bool) {
	for _, e := range p.Entries {
		if e.Offset == offset {
			return e, true
		}
	}
	return Allocation{}, false
}

func goingKey(pool, offset, containerID string) string {
	return pool + "/" + offset + "/" + containerID
}

// releaseJobs judges and deletes the candidates of jobs under the Lease, on
// one list of the pools: each job's as ReleaseReservations alone would (a
// reservation is held when an entry of its pod that the job does not
// release holds it). Candidates of one reservation are judged one job after
// the other; up to width reservations at once. A job's error is its own.
func (l *Locked) releaseJobs(ctx context.Context, jobs []*releaseJob, width int) error {
	latest := l.removeFirst(ctx, jobs)
	if latest != "" && l.s.o.AtStep != nil {
		l.s.o.AtStep("release-after-entries")
	}
	// The pools the reservations are judged on: one list from the API
	// server, as of the removal's patch when there was one (it was written
	// under the Lease, so the list holds every write before it, every one
	// of whereabouts' included). Never the process's own copy: an
	// informer's copy is not one snapshot (a relist delivers the pools by
	// name, not in the order of their writes), so it may hold a write and
	// lack an older one of another pool, the very entry that holds a
	// reservation.
	fail := func(err error) error {
		for _, j := range jobs {
			if j.err == nil {
				j.err = err
			}
		}
		return err
	}
	if err := l.Keep(ctx); err != nil {
		return fail(err)
	}
	pools, err := l.s.poolsNotOlderThan(ctx, latest)
	if err != nil {
		return fail(err)
	}
	jg := newJudgement(l, pools, jobs)
	l.s.fanOut(width, jg.names, func(name string) { jg.judge(ctx, name) })
	return nil
}

// judgement is one turn's judging of the candidates of its jobs, by
// reservation name, on one list of the pools.
type judgement struct {
	l    *Locked
	view []*Pool
	// names are the reservations judged, sorted; byName their candidates,
	// job by job.
	names  []string
	byName map[string][]jobCandidate
	// mu guards holders (computed once per network) and each job's
	// outcome (err, deleted).
	mu      sync.Mutex
	holders map[string]map[string][]Allocation
}

type jobCandidate struct {
	j *releaseJob
	c candidate
}

func newJudgement(l *Locked, pools []Pool, jobs []*releaseJob) *judgement {
	jg := &judgement{l: l, view: make([]*Pool, len(pools)), byName: map[string][]jobCandidate{}, holders: map[string]map[string][]Allocation{}}
	for i := range pools {
		jg.view[i] = &pools[i]
	}
	for _, j := range jobs {
		for _, c := range j.cands {
			if _, ok := jg.byName[c.name]; !ok {
				jg.names = append(jg.names, c.name)
			}
			jg.byName[c.name] = append(jg.byName[c.name], jobCandidate{j, c})
		}
	}
	sort.Strings(jg.names)
	return jg
}

// holdersOf indexes the list's entries by reservation name under network.
func (jg *judgement) holdersOf(network string) map[string][]Allocation {
	jg.mu.Lock()
	defer jg.mu.Unlock()
	h, ok := jg.holders[network]
	if !ok {
		h = holdersIn(jg.view, network)
		jg.holders[network] = h
	}
	return h
}

// judge judges the candidates of one reservation, one job after the other;
// a job that failed already is skipped.
func (jg *judgement) judge(ctx context.Context, name string) {
	for _, it := range jg.byName[name] {
		j := it.j
		jg.mu.Lock()
		failed := j.err != nil
		jg.mu.Unlock()
		if failed {
			continue
		}
		deleted, err := jg.l.releaseReservation(ctx, it.c, jg.heldFor(j))
		jg.mu.Lock()
		if err != nil {
			j.err = err
		} else if deleted != "" {
			j.deleted = append(j.deleted, deleted)
		}
		jg.mu.Unlock()
	}
}

// heldFor says, for j, whether an entry of the reservation's pod that j
// does not release holds it: on the turn's list, or on a fresh one.
func (jg *judgement) heldFor(j *releaseJob) func(ctx context.Context, o *Reservation, fresh bool) (bool, error) {
	return func(ctx context.Context, o *Reservation, fresh bool) (bool, error) {
		var hs map[string][]Allocation
		if fresh {
			pools, err := jg.l.Pools(ctx)
			if err != nil {
				return false, err
			}
			hs = Holders(pools, j.network)
		} else {
			hs = jg.holdersOf(j.network)
		}
		for _, h := range hs[o.Name] {
			if h.PodRef == o.Spec.PodRef && !j.going[goingKey(h.Pool, h.Offset, h.ContainerID)] {
				return true, nil
			}
		}
		return false, nil
	}
}

// fanOut runs fn for each name: in turn with width 1, else on width workers,
// each taking the next name until none is left (started and waited for as
// the Group says: under a scheduler, theirs).
func (s *Store) fanOut(width int, names []string, fn func(string)) {
	if width <= 1 {
		for _, name := range names {
			fn(name)
		}
		return
	}
	var mu sync.Mutex
	var next int
	done := make(chan struct{})
	workers := min(width, len(names))
	if workers == 0 {
		return
	}
	left := workers
	for w := 0; w < workers; w++ {
		s.goAside(func() {
			defer func() {
				mu.Lock()
				left--
				if left == 0 {
					close(done)
				}
				mu.Unlock()
			}()
			for {
				mu.Lock()
				if next >= len(names) {
					mu.Unlock()
					return
				}
				name := names[next]
				next++
				mu.Unlock()
				fn(name)
			}
		})
	}
	s.await(done)
}

// candidate is a planned entry whose reservation exists and may be its own.
type candidate struct {
	Allocation
	name string
	// read is the reservation as looked up (nil: look it up under the Lease).
	read *Reservation
}

// reservationCandidates are the planned entries whose reservation exists and
// is theirs, looked up without the Lease: most often whereabouts deleted
// them already (its own DEL), and then no Lease is needed. A reservation the
// process's own copy (Local) shows as the entry's is taken as it is there
// (its delete is guarded by the copy's resourceVersion); one the copy does
// not show is read from the API server: "no reservation" is never decided
// from a copy.
func (s *Store) reservationCandidates(ctx context.Context, plan Plan) ([]candidate, error) {
	if len(plan.Entries) == 0 {
		return nil, nil
	}
	local := s.local()
	var byName map[string]*Reservation
	if len(plan.Entries) > quickLook && local == nil {
		all, err := s.Reservations(ctx)
		if err != nil {
			return nil, err
		}
		byName = make(map[string]*Reservation, len(all))
		for i := range all {
			byName[all[i].Name] = &all[i]
		}
	}
	var out []candidate
	seen := map[string]bool{}
	for _, e := range plan.Entries {
		name := names.Reservation(e.IP, plan.Network)
		if seen[name] {
			continue
		}
		seen[name] = true
		var o *Reservation
		if local != nil {
			if o = local.LocalReservation(s.namespace, name); o != nil && Owns(o, e) {
				out = append(out, candidate{Allocation: e, name: name, read: o})
				continue
			}
		}
		if byName != nil {
			o = byName[name]
		} else {
			var err error
			if o, err = s.Reservation(ctx, name); err != nil {
				return nil, err
			}
		}
		if o != nil && Owns(o, e) {
			out = append(out, candidate{Allocation: e, name: name, read: o})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// Owns says whether a reservation is an entry's: the same podref, as
// whereabouts v0.8.0 and later judge it (they write no containerid, and
// their DEL deletes the reservation of the address it frees). A containerid
// it names (whereabouts v0.7.0's, the node agent's) may be an earlier
// sandbox's of the pod: whereabouts hands the pod's entry on an interface to
// its next sandbox and keeps the reservation as it is. Whether another entry
// of the pod still holds the address is the release's judgement, under the
// Lease (invariant 3).
func Owns(o *Reservation, a Allocation) bool {
	return o.Spec.PodRef == a.PodRef
}

// Holders indexes, by the name of their reservation under networkName, the
// entries of the pools that may hold reservations of that network
// (names.MayHoldReservationsOf).
func Holders(pools []Pool, networkName string) map[string][]Allocation {
	ps := make([]*Pool, len(pools))
	for i := range pools {
		ps[i] = &pools[i]
	}
	return holdersIn(ps, networkName)
}

func holdersIn(pools []*Pool, networkName string) map[string][]Allocation {
	out := map[string][]Allocation{}
	for _, p := range pools {
		if !names.MayHoldReservationsOf(p.Name, p.Spec.Range, networkName) {
			continue
		}
		as, err := Allocations(p)
		if err != nil {
			// An unreadable pool may hold anything: count it as holding by
			// nobody we can name; the caller keeps what it cannot judge.
			continue
		}
		for _, a := range as {
			name := names.Reservation(a.IP, networkName)
			out[name] = append(out[name], a)
		}
	}
	return out
}
