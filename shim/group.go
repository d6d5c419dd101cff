package shim

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim/batch"
)

// Group is shared by the stores of one process that serves many verbs at
// once (a node agent). Whatever its stores ask of whereabouts' Lease and of
// one pool at one moment, it does together:
//
//   - Locked calls take turns under one acquisition of the Lease: a call
//     that waits when the one before it is done runs under the same hold,
//     and the last hands the Lease back in the background. Turns are
//     serialised, so each call sees what it would have seen had it taken the
//     Lease itself when its turn came: every other holder (whereabouts, the
//     exec path, other nodes' agents) wrote before the acquisition, and
//     every earlier turn is done.
//   - A hold is kept at most MaxHold; after a hold that long the group
//     leaves the Lease free for as long before it takes it again, so that
//     whereabouts elsewhere, which looks every 0.5 to 1.1 s, gets turns.
//   - The Lease handed back is remembered: while nobody else writes it, the
//     next acquisition takes it with one write, without reading it first.
//     So is one whose hand back failed: while nobody wrote it since, it is
//     still the group's. The Lease under the group's Identity in a record
//     the group did not write is another holder's (another process of the
//     same name), and waited out as any other holder's.
//   - Releases of reservations (ReleaseReservations) waiting at one moment
//     are judged in one turn, on one list of the pools taken under the Lease,
//     each as it would be alone.
//   - Removals from one pool (RemoveAllocations) waiting at one moment go in
//     one guarded patch, each still removing only its own entries, and only
//     while they are what it planned on.
//
// The zero value is ready for use, and holds the Lease as defaultIdentity.
type Group struct {
	// Identity names the process as the holder of whereabouts' Lease.
	Identity string
	// MaxHold bounds one acquisition (500 ms).
	MaxHold time.Duration
	// Width bounds the reservations deleted at once in a turn (8).
	Width int
	// Go and Await, when set, run the group's concurrency under a scheduler
	// of the caller's (the simulation's, which runs one goroutine at a
	// time), as agent/alloc's Options do: Go starts f beside the caller (nil:
	// a goroutine), Await returns once done is closed (nil: a receive).
	// Every goroutine the group starts, and every wait of one of them or of
	// a caller for another, goes through them.
	Go    func(f func())
	Await func(done <-chan struct{})

	mu       sync.Mutex
	leases   map[string]*shared // by namespace
	removals batch.Queues[poolKey, *removal]
	once     sync.Once
}

// DefaultMaxHold is a Group's MaxHold when it sets none: within whereabouts'
// own retry period, so that whereabouts waits no more for a group than for
// one of its own holders.
const DefaultMaxHold = 500 * time.Millisecond

// groupTimeout bounds what a group does for the calls waiting at one moment
// once it has started (the calls' own contexts may end meanwhile: what was
// begun for them is finished). Two minutes, as whereabouts' own ADD waits
// for its Lease: the agent's releases give up no sooner than the exec path.
const groupTimeout = 2 * time.Minute

// shared is the Lease of one namespace as a group holds it. One goroutine
// (hold), running while calls wait or the Lease is held, takes the Lease,
// runs the calls' turns one after the other, and hands it back once no call
// waits.
type shared struct {
	mu      sync.Mutex
	queue   []*turn
	running bool
	idle    chan struct{} // closed when the hold goroutine that runs ends

	// Of the hold goroutine:
	held   *hold
	by     *Store    // the store held took it with
	since  time.Time // when held was acquired
	record *Lease    // the Lease as the group last wrote it, its hold ended (acquire's record)
	rest   time.Time // no acquisition before (after a hold of MaxHold)

	jobs     []*releaseJob
	draining bool
}

// turn is one Locked call waiting to run.
type turn struct {
	ctx  context.Context
	s    *Store
	fn   func(context.Context, *Locked) error
	done chan struct{} // closed once err is set
	err  error
	// panicked is what fn panicked with, given back to the caller's
	// goroutine (a request's, which recovers it) rather than the group's.
	panicked any
}

func (g *Group) init() {
	g.once.Do(func() {
		if g.Identity == "" {
			g.Identity = defaultIdentity()
		}
		if g.MaxHold <= 0 {
			g.MaxHold = DefaultMaxHold
		}
		if g.Width <= 0 {
			g.Width = 8
		}
		g.leases = map[string]*shared{}
	})
}

// spawn runs f beside the caller: a goroutine, or Go's.
func (g *Group) spawn(f func()) {
	if g.Go != nil {
		g.Go(f)
		return
	}
	go f()
}

// await returns once done is closed: a receive, or Await's.
func (g *Group) await(done <-chan struct{}) {
	if g.Await != nil {
		g.Await(done)
		return
	}
	<-done
}

func (g *Group) of(namespace string) *shared {
	g.init()
	g.mu.Lock()
	defer g.mu.Unlock()
	sh := g.leases[namespace]
	if sh == nil {
		sh = &shared{}
		g.leases[namespace] = sh
	}
	return sh
}

// locked runs fn in its turn under the group's hold of s's namespace. A
// call whose context ends before its turn is not run.
func (g *Group) locked(ctx context.Context, s *Store, fn func(context.Context, *Locked) error) error {
	sh := g.of(s.namespace)
	t := &turn{ctx: ctx, s: s, fn: fn, done: make(chan struct{})}
	sh.mu.Lock()
	sh.queue = append(sh.queue, t)
	start := !sh.running
	if start {
		sh.running = true
		sh.idle = make(chan struct{})
	}
	idle := sh.idle
	sh.mu.Unlock()
	if start {
		g.spawn(func() { g.hold(sh, idle) })
	}
	g.await(t.done)
	if t.panicked != nil {
		panic(t.panicked)
	}
	return t.err
}

// end ends a turn with err.
func (t *turn) end(err error) {
	t.err = err
	close(t.done)
}

// hold runs the turns of sh until none waits, then hands the Lease back.
func (g *Group) hold(sh *shared, idle chan struct{}) {
	defer close(idle)
	for {
		sh.mu.Lock()
		if len(sh.queue) == 0 {
			if sh.held == nil {
				sh.running = false
				sh.mu.Unlock()
				return
			}
			sh.mu.Unlock()
			// No call waits: hand the Lease back (calls that come meanwhile
			// wait, then take it again).
			sh.record = sh.held.release(context.Background(), sh.by)
			sh.held, sh.by = nil, nil
			continue
		}
		t := sh.queue[0]
		sh.queue = sh.queue[1:]
		sh.mu.Unlock()
		if err := t.ctx.Err(); err != nil {
			t.end(fmt.Errorf("wait for lease %s/%s: %w", t.s.namespace, names.Lease, err))
			continue
		}
		if err := g.take(t.ctx, t.s, sh); err != nil {
			t.end(err)
			continue
		}
		t.end(g.run(t, sh.held))
	}
}

// run runs a turn's fn, keeping what it panics with for its caller.
func (g *Group) run(t *turn, h *hold) (err error) {
	defer func() {
		if r := recover(); r != nil {
			t.panicked = r
			err = fmt.Errorf("panic under the lease: %v", r)
		}
	}()
	defer t.s.turn(g.Identity)()
	return t.fn(underLease(t.ctx), &Locked{s: t.s, h: h})
}

// take makes sure the group holds the Lease for a turn: the hold it kept,
// unless it is lost or was kept MaxHold already (then handed back, and
// taken again once it was left free as long).
func (g *Group) take(ctx context.Context, s *Store, sh *shared) error {
	if h := sh.held; h != nil {
		h.mu.Lock()
		lost := h.lost
		h.mu.Unlock()
		held := s.Now().Sub(sh.since)
		if !lost && held < g.MaxHold {
			return nil
		}
		sh.record = h.release(ctx, sh.by)
		sh.held, sh.by = nil, nil
		if !lost {
			sh.rest = s.Now().Add(held)
		}
	}
	if wait := sh.rest.Sub(s.Now()); wait > 0 {
		if err := s.o.Clock.Sleep(ctx, wait); err != nil {
			return fmt.Errorf("wait for lease %s/%s: %w", s.namespace, names.Lease, err)
		}
	}
	h, err := s.acquire(ctx, g.Identity, sh.record)
	sh.record = nil
	if err != nil {
		return err
	}
	sh.held, sh.by, sh.since = h, s, s.Now()
	return nil
}

// Wait waits until the group has handed back every Lease it holds, or ctx
// ends: a process that stops calls it, so that whereabouts does not wait
// for a Lease no one renews. With Await, ctx is looked at between the waits
// only (the caller's scheduler bounds each).
func (g *Group) Wait(ctx context.Context) error {
	g.init()
	g.mu.Lock()
	var idle []chan struct{}
	for _, sh := range g.leases {
		sh.mu.Lock()
		if sh.running {
			idle = append(idle, sh.idle)
		}
		sh.mu.Unlock()
	}
	g.mu.Unlock()
	for _, done := range idle {
		if g.Await != nil {
			g.Await(done)
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// releaseReservations runs j with the releases that wait at the same
// moment, in one turn under the Lease. It returns once j is done; a job
// whose context ends before its turn is not run.
func (g *Group) releaseReservations(s *Store, j *releaseJob) {
	sh := g.of(s.namespace)
	j.done = make(chan struct{})
	sh.mu.Lock()
	sh.jobs = append(sh.jobs, j)
	lead := !sh.draining
	sh.draining = true
	sh.mu.Unlock()
	if lead {
		g.spawn(func() { g.drain(s, sh) })
	}
	g.await(j.done)
}

// drain runs the waiting release jobs, turn after turn, until none waits.
// A panic (a bug) fails the jobs it met, not the process.
func (g *Group) drain(s *Store, sh *shared) {
	var running []*releaseJob
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("release reservations: panic: %v", r)
			finish(running, err)
			for {
				jobs := g.take1(sh)
				sh.mu.Lock()
				if len(jobs) == 0 && len(sh.jobs) == 0 {
					sh.draining = false
					sh.mu.Unlock()
					return
				}
				sh.mu.Unlock()
				finish(jobs, err)
			}
		}
	}()
	for {
		sh.mu.Lock()
		if len(sh.jobs) == 0 {
			sh.draining = false
			sh.mu.Unlock()
			return
		}
		sh.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
		running = nil
		err := g.locked(ctx, s, func(ctx context.Context, l *Locked) error {
			// The jobs that came meanwhile go in the same turn, until it was
			// held MaxHold or lost: then the next turn takes them.
			for first := true; first || s.Now().Sub(sh.since) < g.MaxHold && !l.lost(); first = false {
				batch := g.take1(sh)
				if len(batch) == 0 {
					return nil
				}
				running = batch
				_ = l.releaseJobs(ctx, batch, g.Width)
				finish(batch, nil)
				running = nil
			}
			return nil
		})
		cancel()
		if err != nil {
			// Not run (the Lease was not taken): those of this turn and
			// those waiting fail alike, since they would wait for the same.
			finish(running, err)
			finish(g.take1(sh), err)
		}
	}
}

// take1 takes the jobs waiting now, and ends those whose context ended.
func (g *Group) take1(sh *shared) []*releaseJob {
	sh.mu.Lock()
	jobs := sh.jobs
	sh.jobs = nil
	sh.mu.Unlock()
	out := jobs[:0]
	for _, j := range jobs {
		if err := j.ctx.Err(); err != nil {
			j.err = fmt.Errorf("release reservations: %w", err)
			close(j.done)
			continue
		}
		out = append(out, j)
	}
	return out
}

func finish(jobs []*releaseJob, err error) {
	for _, j := range jobs {
		if err != nil && j.err == nil {
			j.err = err
		}
		close(j.done)
	}
}

// poolKey is one pool of one namespace.
type poolKey struct{ namespace, pool string }

// removal is one RemoveAllocations chunk waiting for its patch.
type removal struct {
	ctx     context.Context
	want    map[string]whereaboutsv1alpha1.IPAllocation
	base    *Pool
	removed []Allocation
	err     error
	done    chan struct{}
}

// removeAllocations removes plan's entries in patches shared with the
// removals from the same pool that wait at the same moment.
func (g *Group) removeAllocations(ctx context.Context, s *Store, plan Plan) ([]Allocation, error) {
	g.init()
	q := g.removals.Of(poolKey{s.namespace, plan.Pool})
	var removed []Allocation
	for start := 0; start < len(plan.Entries); start += maxRemovals {
		chunk := plan.Entries[start:min(start+maxRemovals, len(plan.Entries))]
		r := &removal{ctx: ctx, want: make(map[string]whereaboutsv1alpha1.IPAllocation, len(chunk)), base: plan.Base, done: make(chan struct{})}
		for _, e := range chunk {
			r.want[e.Offset] = e.IPAllocation
		}
		if q.Push(r) {
			g.spawn(func() { g.removeAll(s, plan.Pool, q) })
		}
		g.await(r.done)
		removed = append(removed, r.removed...)
		if r.err != nil {
			return removed, r.err
		}
	}
	return removed, nil
}

// removeAll writes the waiting removals of one pool until none waits: each
// round as many as fit one patch, on the newest read of the pool any of
// them has (a conflict reads it fresh).
func (g *Group) removeAll(s *Store, pool string, q *batch.Queue[*removal]) {
	var last *Pool // the pool as the previous round's patch left it
	for {
		round := q.Take(onePatch)
		if round == nil {
			return
		}
		base := last
		var live []*removal
		for _, r := range round {
			if err := r.ctx.Err(); err != nil {
				r.err = fmt.Errorf("release from pool %s/%s: %w", s.namespace, pool, err)
				close(r.done)
				continue
			}
			live = append(live, r)
			if newerPool(r.base, base) {
				base = r.base
			}
		}
		want := map[string]whereaboutsv1alpha1.IPAllocation{}
		for _, r := range live {
			for off, a := range r.want {
				want[off] = a
			}
		}
		if len(live) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
		done, after, err := s.removeOnce(ctx, pool, want, base)
		cancel()
		last = after
		// Each gets the entries it asked for, the first that asked for one.
		given := map[string]bool{}
		for _, r := range live {
			for _, a := range done {
				if w, ok := r.want[a.Offset]; ok && w == a.IPAllocation && !given[a.Offset] {
					given[a.Offset] = true
					r.removed = append(r.removed, a)
				}
			}
			r.err = err
			close(r.done)
		}
	}
}

// onePatch chooses a round of removals: as many as fit one patch; one that
// wants another entry at an offset another wants (one of the two planned on
// a stale read) waits for the next round.
func onePatch(waiting []*removal) (round, rest []*removal) {
	want := map[string]whereaboutsv1alpha1.IPAllocation{}
	for _, r := range waiting {
		if len(round) > 0 && (len(want)+len(r.want) > maxRemovals || clashes(want, r.want)) {
			rest = append(rest, r)
			continue
		}
		round = append(round, r)
		for off, a := range r.want {
			want[off] = a
		}
	}
	return round, rest
}

// clashes says whether b wants another entry at an offset a wants.
func clashes(a, b map[string]whereaboutsv1alpha1.IPAllocation) bool {
	for off, x := range b {
		if y, ok := a[off]; ok && y != x {
			return true
		}
	}
	return false
}

// newerPool says whether a is a later read of the pool than b (nil is
// older than any).
func newerPool(a, b *Pool) bool {
	if a == nil {
		return false
	}
	if b == nil {
		return true
	}
	x, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	y, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return errA == nil && errB == nil && x > y
}
