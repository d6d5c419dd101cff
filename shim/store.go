// Package shim is harvester-ipam's one way to whereabouts' IPPools and
// OverlappingRangeIPReservations (ORIPs): the plugin and the reconciler read
// and write them through Store, which holds the safety rules by construction.
// Every pool write is a patch that tests the resourceVersion of a fresh read
// (Guarded), retried a bounded number of times on 409 and 422. A release is
// planned on a fresh read (Plan) and then takes two steps, so that a crash
// between them loses nothing: ReleaseReservations (while whereabouts' Lease
// is held, delete each reservation that is still the released entry's and
// that no other entry of its pod holds, with UID and resourceVersion
// preconditions), then RemoveAllocations (remove the planned entries that are
// still what the plan saw).
package shim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/harvester/harvester-ipam/shim/names"
)

// Options tune a Store; the zero value of each field is its default.
type Options struct {
	// CallTimeout bounds each API request (10 s).
	CallTimeout time.Duration
	// Backoff bounds the retries of a conflicting write (DefaultBackoff).
	Backoff Backoff
	// Clock is what the store waits by (the wall clock).
	Clock Clock
	// Random draws the jitter of retries, in [0, 1) (math/rand).
	Random func() float64
	// Identity names this process as the holder of whereabouts' Lease
	// ("harvester-ipam/<host>/<pid>").
	Identity string
	// PageSize bounds each LIST (500).
	PageSize int64
	// LeaseSeconds is the leaseDurationSeconds of our record of whereabouts'
	// Lease (5), and LeaseRetry how often we look again at a Lease someone
	// else holds (50 ms): a model of whereabouts sets its own (1 s, 500 ms).
	LeaseSeconds int32
	LeaseRetry   time.Duration
	// Group, when set, is shared by the stores of one process (a node
	// agent's requests): their Locked calls share acquisitions of the
	// Lease, and their releases and removals that wait at one moment are
	// done together (Group). Nil: each call on its own.
	Group *Group
	// AtStep, when set, is called at the step boundaries of a release
	// ("release-after-entries": a release in one turn removed the entries
	// and has not judged the reservations yet): test builds crash there.
	AtStep func(step string)
	// Turn, when set, is called as a turn under whereabouts' Lease begins
	// (the Lease taken or, in a Group, the turn's place in its hold come)
	// with holder, the identity the Lease is held as; the func it returns
	// is called as the turn ends, before the Lease is handed back (also
	// when the turn panics). The simulation checks with it that no two
	// holders are ever inside a turn at once.
	Turn func(holder string) (end func())
}

// Store is the pools and reservations of one namespace. The stores of other
// namespaces made with In share its options and its count of retries.
type Store struct {
	api       API
	namespace string
	o         *Options
	retried   *atomic.Int64
}

// New is the store of namespace behind api.
func New(api API, namespace string, o Options) *Store {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Backoff.Steps <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.Clock == nil {
		o.Clock = RealClock{}
	}
	if o.Random == nil {
		o.Random = defaultRandom
	}
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	if o.LeaseSeconds <= 0 {
		o.LeaseSeconds = leaseSeconds
	}
	if o.LeaseRetry <= 0 {
		o.LeaseRetry = leaseRetry
	}
	return &Store{api: api, namespace: namespace, o: &o, retried: new(atomic.Int64)}
}

// In is this store on another namespace's pools: a checkpoint may name pools
// of a namespace the current kubeconfig does not.
func (s *Store) In(namespace string) *Store {
	if namespace == "" || namespace == s.namespace {
		return s
	}
	return &Store{api: s.api, namespace: namespace, o: s.o, retried: s.retried}
}

// Namespace is where the pools and reservations live.
func (s *Store) Namespace() string { return s.namespace }

// Retried counts the writes retried after a conflict (409) or a failed
// resourceVersion test (422), in this store and those made with In.
func (s *Store) Retried() int64 { return s.retried.Load() }

// Now is the store's clock's time.
func (s *Store) Now() time.Time { return s.o.Clock.Now() }

func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.o.CallTimeout)
}

// callWrite bounds a write: in a turn under the Lease by leaseCallTimeout,
// so that no write made under the Lease lands after the hold may have
// passed to another holder (a read that lands late changes nothing, and a
// large list may take longer); else as call.
func (s *Store) callWrite(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Value(underLeaseKey{}) != nil && s.o.CallTimeout > leaseCallTimeout {
		return context.WithTimeout(ctx, leaseCallTimeout)
	}
	return context.WithTimeout(ctx, s.o.CallTimeout)
}

// Pool reads a pool fresh; nil, nil when it does not exist.
//
// A GET, on purpose: a LIST by name with no resourceVersion is as fresh, and
// Kubernetes 1.31+ serves it from the watch cache 3x cheaper for a pool of
// 10,000 entries, but it first waits for that cache to catch up with etcd
// (up to ~100 ms whenever anything else changed, such as whereabouts' Lease),
// which doubled a small pool's ADD in the bench.
func (s *Store) Pool(ctx context.Context, name string) (*Pool, error) {
	return s.getPool(ctx, name, Fresh)
}

// CachedPool reads a pool from the API server's watch cache: cheap, and
// possibly behind. A picker that finds nothing in it has nothing to do but
// what the next read will show; one that finds something must Plan, fresh.
func (s *Store) CachedPool(ctx context.Context, name string) (*Pool, error) {
	return s.getPool(ctx, name, Cache)
}

// Local is what an API may also offer: the process's own copy of the pools
// and reservations (a node agent's informer copy, which its own writes keep
// current; agent/cache). A copy may be behind: the store takes from it only
// what a guarded write or a read under the Lease checks again, and never
// decides from it that something is not there.
type Local interface {
	// LocalPool is the pool as the copy holds it; nil when it holds none.
	LocalPool(namespace, name string) *Pool
	// LocalReservation is the reservation as the copy holds it; nil when it
	// holds none.
	LocalReservation(namespace, name string) *Reservation
}

func (s *Store) local() Local {
	l, _ := s.api.(Local)
	return l
}

// LocalPool is the pool as the process's own copy holds it (Local); nil
// without a copy, or when it holds none. Callers must not change it.
func (s *Store) LocalPool(name string) *Pool {
	if l := s.local(); l != nil {
		return l.LocalPool(s.namespace, name)
	}
	return nil
}

// Look is a pool in which pick chooses something, to plan a release on: the
// process's own copy (LocalPool) when it shows something to pick (onCopy),
// else a fresh read. What the copy does not show is read fresh, so nothing
// is decided from a copy alone to be not there; and a plan made on the copy
// whose removal finds its entries gone must be made again on a fresh read,
// since what the copy did not show may be there. Nil when the pool does not
// exist.
func (s *Store) Look(ctx context.Context, name string, pick Picker) (p *Pool, onCopy bool, err error) {
	if p := s.LocalPool(name); p != nil && len(pick(p)) > 0 {
		return p, true, nil
	}
	p, err = s.Pool(ctx, name)
	return p, false, err
}

func (s *Store) getPool(ctx context.Context, name string, from Source) (*Pool, error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	p, err := s.api.GetPool(cctx, s.namespace, name, from)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pool %s/%s: %w", s.namespace, name, err)
	}
	return p, nil
}

// Pools lists every pool of the namespace, fresh, page by page.
func (s *Store) Pools(ctx context.Context) ([]Pool, error) {
	return s.poolsNotOlderThan(ctx, "")
}

// poolsNotOlderThan lists every pool of the namespace as of rv, one of the
// store's own pool writes, or later ("": fresh).
func (s *Store) poolsNotOlderThan(ctx context.Context, rv string) ([]Pool, error) {
	ps, err := listAll(ctx, Page{Limit: s.o.PageSize, NotOlderThan: rv}, func(ctx context.Context, page Page) ([]Pool, string, error) {
		cctx, cancel := s.call(ctx)
		defer cancel()
		return s.api.ListPools(cctx, s.namespace, page)
	})
	if err != nil {
		return nil, fmt.Errorf("list pools in %s: %w", s.namespace, err)
	}
	return ps, nil
}

// Reservation reads one reservation; nil, nil when it does not exist.
func (s *Store) Reservation(ctx context.Context, name string) (*Reservation, error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	o, err := s.api.GetReservation(cctx, s.namespace, name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get reservation %s/%s: %w", s.namespace, name, err)
	}
	return o, nil
}

// Reservations lists every reservation of the namespace, page by page.
func (s *Store) Reservations(ctx context.Context) ([]Reservation, error) {
	os, err := ListAll(ctx, s.o.PageSize, func(ctx context.Context, page Page) ([]Reservation, string, error) {
		cctx, cancel := s.call(ctx)
		defer cancel()
		return s.api.ListReservations(cctx, s.namespace, page)
	})
	if err != nil {
		return nil, fmt.Errorf("list reservations in %s: %w", s.namespace, err)
	}
	return os, nil
}

// Ping asks the API server for one pool: it answers when the store is usable.
func (s *Store) Ping(ctx context.Context) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	if _, _, err := s.api.ListPools(cctx, s.namespace, Page{Limit: 1}); err != nil {
		return fmt.Errorf("list pools in %s: %w", s.namespace, err)
	}
	return nil
}

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
				got, after, err = l.s.removeOnce(ctx, pool, chunk, base)
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
	view := make([]*Pool, len(pools))
	for i := range pools {
		view[i] = &pools[i]
	}
	var mu sync.Mutex
	holders := map[string]map[string][]Allocation{}
	holdersOf := func(network string) map[string][]Allocation {
		mu.Lock()
		defer mu.Unlock()
		h, ok := holders[network]
		if !ok {
			h = holdersIn(view, network)
			holders[network] = h
		}
		return h
	}
	type item struct {
		j *releaseJob
		c candidate
	}
	byName := map[string][]item{}
	var names []string
	for _, j := range jobs {
		for _, c := range j.cands {
			if _, ok := byName[c.name]; !ok {
				names = append(names, c.name)
			}
			byName[c.name] = append(byName[c.name], item{j, c})
		}
	}
	sort.Strings(names)
	judge := func(name string) {
		for _, it := range byName[name] {
			j := it.j
			mu.Lock()
			failed := j.err != nil
			mu.Unlock()
			if failed {
				continue
			}
			held := func(ctx context.Context, o *Reservation, fresh bool) (bool, error) {
				var hs map[string][]Allocation
				if fresh {
					pools, err := l.Pools(ctx)
					if err != nil {
						return false, err
					}
					hs = Holders(pools, j.network)
				} else {
					hs = holdersOf(j.network)
				}
				for _, h := range hs[o.Name] {
					if h.PodRef == o.Spec.PodRef && !j.going[goingKey(h.Pool, h.Offset, h.ContainerID)] {
						return true, nil
					}
				}
				return false, nil
			}
			deleted, err := l.releaseReservation(ctx, it.c, held)
			mu.Lock()
			if err != nil {
				j.err = err
			} else if deleted != "" {
				j.deleted = append(j.deleted, deleted)
			}
			mu.Unlock()
		}
	}
	if width <= 1 {
		for _, name := range names {
			judge(name)
		}
		return nil
	}
	// width workers, each taking the next name until none is left (started
	// and waited for as the Group says: under a scheduler, theirs).
	var next, left int
	done := make(chan struct{})
	workers := min(width, len(names))
	left = workers
	for w := 0; w < workers; w++ {
		l.s.goAside(func() {
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
				judge(name)
			}
		})
	}
	l.s.await(done)
	return nil
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

// Owns says whether a reservation is an entry's: same podref, and the same
// container when the reservation names one (whereabouts before v0.8 did).
func Owns(o *Reservation, a Allocation) bool {
	return o.Spec.PodRef == a.PodRef && (o.Spec.ContainerID == "" || o.Spec.ContainerID == a.ContainerID)
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

// SetPoolAnnotation sets (or, with "", removes) one annotation of a pool,
// computed by value from the pool as freshly read, with a guarded patch
// retried as every pool write is.
func (s *Store) SetPoolAnnotation(ctx context.Context, pool, key string, value func(*Pool) string) error {
	return s.retry(ctx, func() error {
		p, err := s.Pool(ctx, pool)
		if err != nil || p == nil {
			return err
		}
		want := value(p)
		have, ok := p.Annotations[key]
		if want == have && (ok || want == "") {
			return nil
		}
		cctx, cancel := s.callWrite(ctx)
		defer cancel()
		_, err = s.api.PatchPool(cctx, s.namespace, pool, setAnnotation(p.ResourceVersion, p.Annotations, key, want))
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("annotate pool %s/%s: %w", s.namespace, pool, err)
		}
		return nil
	})
}

// DeletePool deletes a pool that still is what keep, judging it as freshly
// read, says may go: read fresh, judged, then deleted with the UID and
// resourceVersion of that read as preconditions, so that a pool written
// since (an ADD took an address, a release, a sighting) is not deleted on a
// judgement of what it was. It is not retried: a conflict (409) means the
// pool changed, and the caller judges it again on its next look; deleted is
// false then, as it is when the pool is gone or may not go.
func (s *Store) DeletePool(ctx context.Context, name string, mayGo func(*Pool) bool) (deleted bool, err error) {
	p, err := s.Pool(ctx, name)
	if err != nil || p == nil || !mayGo(p) {
		return false, err
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	err = s.api.DeletePool(cctx, s.namespace, name, Preconditions{UID: p.UID, ResourceVersion: p.ResourceVersion})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete pool %s/%s: %w", s.namespace, name, err)
	}
	return true, nil
}

// MarkReservation sets (or, with "", removes) one annotation of a
// reservation as it was read: a reservation changed since (or gone) is left
// alone, and ok is false; the caller judges it again on its next look.
func (s *Store) MarkReservation(ctx context.Context, o *Reservation, key, value string) (ok bool, err error) {
	if _, has := o.Annotations[key]; value == "" && !has {
		return true, nil
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	_, err = s.api.PatchReservation(cctx, s.namespace, o.Name, setAnnotation(o.ResourceVersion, o.Annotations, key, value))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err), apierrors.IsInvalid(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("annotate reservation %s/%s: %w", s.namespace, o.Name, err)
	}
	return true, nil
}

// ClaimReservation makes o, a reservation of the pod, the container's: its
// containerid (and ifname, where given) set by a patch that tests the
// version read. False, without an error, when o changed or went meanwhile:
// the caller reads it again.
func (s *Store) ClaimReservation(ctx context.Context, o *Reservation, containerID, ifName string) (ok bool, err error) {
	ops := []PatchOp{{Op: "add", Path: "/spec/containerid", Value: containerID}}
	if ifName != "" {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/ifname", Value: ifName})
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	_, err = s.api.PatchReservation(cctx, s.namespace, o.Name, Guarded(o.ResourceVersion, ops...))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err), apierrors.IsInvalid(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("claim reservation %s/%s for %s: %w", s.namespace, o.Name, containerID, err)
	}
	return true, nil
}

// retry runs fn again, after a pause, while it fails with a conflict (409)
// or a failed patch test (422), up to Backoff.Steps attempts in all. fn reads
// fresh each time.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	return s.retryFrom(ctx, 1, fn)
}

// retryFrom is retry when attempts before the first were made already.
func (s *Store) retryFrom(ctx context.Context, first int, fn func() error) error {
	var err error
	for attempt := first; ; attempt++ {
		err = fn()
		if !isConflict(err) || attempt >= s.o.Backoff.Steps {
			return err
		}
		s.retried.Add(1)
		if serr := s.o.Clock.Sleep(ctx, s.o.Backoff.wait(attempt, s.o.Random)); serr != nil {
			return errors.Join(err, serr)
		}
	}
}

func isConflict(err error) bool { return apierrors.IsConflict(err) || apierrors.IsInvalid(err) }

// describe names released addresses, the first few of many.
func describe(as []Allocation) string {
	const show = 8
	var ips []string
	for i, a := range as {
		if i == show {
			ips = append(ips, fmt.Sprintf("and %d more", len(as)-show))
			break
		}
		ips = append(ips, a.IP.String())
	}
	return strings.Join(ips, ", ")
}

// IPs are the addresses of entries.
func IPs(as []Allocation) []net.IP {
	out := make([]net.IP, len(as))
	for i, a := range as {
		out[i] = a.IP
	}
	return out
}

// ReleaseStrayReservations deletes the reservations of podRef, under
// networkName, that no entry of the pod holds in any pool that may hold
// that network's reservations: what a release killed between its two steps
// leaves when it removed the entries first (a node agent's, as whereabouts'
// own DEL). The pod's next ADD would not find them (it looks for entries),
// and whereabouts v0.7.0 takes such an address as taken. They are judged as
// ReleaseReservations judges, under whereabouts' Lease on a fresh list of
// the pools, and deleted with the read's preconditions. The reservations
// are listed before the pools: one an ADD creates (always after its entry)
// is then either no candidate or seen held. It returns the names deleted.
//
// Only the reservations of addresses are looked at (those an earlier
// sandbox of the pod recorded): a reservation of the pod's current sandbox
// may be one whereabouts shares between its interfaces on overlapping
// ranges, and is never a stray's.
func (s *Store) ReleaseStrayReservations(ctx context.Context, podRef, networkName string, addresses []net.IP) ([]string, error) {
	if len(addresses) == 0 {
		return nil, nil
	}
	want := map[string]bool{}
	for _, ip := range addresses {
		want[names.Reservation(ip, networkName)] = true
	}
	all, err := s.Reservations(ctx)
	if err != nil {
		return nil, err
	}
	var cands []candidate
	for i := range all {
		o := &all[i]
		if o.Spec.PodRef != podRef || !want[o.Name] {
			continue
		}
		cands = append(cands, candidate{Allocation: Allocation{IPAllocation: whereaboutsv1alpha1.IPAllocation{
			PodRef: podRef, ContainerID: o.Spec.ContainerID}}, name: o.Name, read: o})
	}
	if len(cands) == 0 {
		return nil, nil
	}
	j := &releaseJob{ctx: ctx, network: networkName, cands: cands, going: map[string]bool{}}
	s.runRelease(ctx, j)
	sort.Strings(j.deleted)
	return j.deleted, j.err
}
