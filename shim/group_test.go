package shim_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// syncClock is a test clock for goroutines: Sleep moves it on at once.
type syncClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *syncClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *syncClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return runaway(c.now)
}

func (c *syncClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// groupStore is a store of one request of a process whose stores share g.
func groupStore(api *fake.API, c shim.Clock, g *shim.Group) *shim.Store {
	return shim.New(api, ns, shim.Options{
		Backoff: shim.Backoff{Steps: 12, Duration: time.Millisecond, Factor: 2, Jitter: 1}, Clock: c,
		Random: func() float64 { return 0.5 }, Identity: "harvester-ipam-agent/request", Group: g,
	})
}

// leaseLog records, at each write of the Lease, whether it takes the Lease
// (free before it) or hands it back, and when on clock c; writes are slowed
// by delay, as an API server's are, so that calls meet.
type leaseLog struct {
	mu     sync.Mutex
	events []string
	at     []time.Time
	gets   int
}

func (l *leaseLog) hook(api *fake.API, c shim.Clock, delay time.Duration) func(*fake.Call) error {
	return func(call *fake.Call) error {
		if call.Resource != fake.Leases {
			return nil
		}
		time.Sleep(delay)
		l.mu.Lock()
		defer l.mu.Unlock()
		if call.Verb == "get" {
			l.gets++
			return nil
		}
		cur := api.Lease(ns, names.Lease)
		if cur == nil || cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity == "" {
			l.events = append(l.events, "take")
		} else {
			l.events = append(l.events, "write as "+*cur.Spec.HolderIdentity)
		}
		l.at = append(l.at, c.Now())
		return nil
	}
}

func (l *leaseLog) takes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e == "take" {
			n++
		}
	}
	return n
}

// The Locked calls of a group's stores run one at a time, never two at
// once, under far fewer acquisitions than calls, all as the group; once no
// call waits, the Lease is handed back.
func TestAGroupsTurnsShareAcquisitions(t *testing.T) {
	api := fake.New()
	c := &syncClock{now: testEpoch}
	var log leaseLog
	api.Hook = log.hook(api, c, 2*time.Millisecond)
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	var inside, most, ran atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := groupStore(api, c, g).Locked(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				n := inside.Add(1)
				defer inside.Add(-1)
				if n > most.Load() {
					most.Store(n)
				}
				require.NoError(t, l.Keep(ctx))
				held := api.Lease(ns, names.Lease)
				assert.Equal(t, "harvester-ipam-agent/n1/1", *held.Spec.HolderIdentity, "held as the group in every turn")
				time.Sleep(time.Millisecond)
				ran.Add(1)
				return nil
			})
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.NoError(t, g.Wait(context.Background()))
	assert.EqualValues(t, 20, ran.Load())
	assert.EqualValues(t, 1, most.Load(), "turns never overlap")
	assert.Less(t, log.takes(), 10, "acquisitions for 20 calls: %v", log.events)
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "handed back")
}

// A hold is kept at most MaxHold: the turn that finds it older hands the
// Lease back and leaves it free as long as it was held before taking it
// again, so that whereabouts elsewhere gets turns.
func TestAGroupHandsTheLeaseBackAfterMaxHold(t *testing.T) {
	api := fake.New()
	c := &syncClock{now: testEpoch}
	var log leaseLog
	api.Hook = log.hook(api, c, 0)
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1", MaxHold: 500 * time.Millisecond}
	first := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	call := func(wait bool) {
		defer wg.Done()
		require.NoError(t, groupStore(api, c, g).Locked(context.Background(), func(context.Context, *shim.Locked) error {
			if wait {
				close(first)
				<-release
			}
			c.advance(300 * time.Millisecond) // each turn takes 300 ms
			return nil
		}))
	}
	wg.Add(1)
	go call(true)
	<-first
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go call(false)
	}
	time.Sleep(50 * time.Millisecond) // both wait for their turn
	close(release)
	wg.Wait()
	require.NoError(t, g.Wait(context.Background()))
	log.mu.Lock()
	defer log.mu.Unlock()
	require.Equal(t, []string{"take", "write as harvester-ipam-agent/n1/1", "take", "write as harvester-ipam-agent/n1/1"}, log.events,
		"two turns under the first hold; the third after the Lease was handed back")
	assert.Equal(t, 600*time.Millisecond, log.at[1].Sub(log.at[0]), "held for two turns")
	assert.Equal(t, 600*time.Millisecond, log.at[2].Sub(log.at[1]), "left free as long as it was held")
}

// The Lease the group handed back is taken again with one write while
// nobody else wrote it; once someone did (whereabouts took and handed it
// back), the write conflicts and the Lease is read first, as ever.
func TestAGroupTakesTheLeaseItHandedBackWithoutReadingIt(t *testing.T) {
	api := fake.New()
	c := &syncClock{now: testEpoch}
	var log leaseLog
	api.Hook = log.hook(api, c, 0)
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	s := groupStore(api, c, g)
	nothing := func(context.Context, *shim.Locked) error { return nil }
	require.NoError(t, s.Locked(context.Background(), nothing))
	require.NoError(t, g.Wait(context.Background()))
	gets := log.gets
	require.NoError(t, s.Locked(context.Background(), nothing))
	require.NoError(t, g.Wait(context.Background()))
	assert.Equal(t, gets, log.gets, "no read of the Lease it handed back")

	// whereabouts takes it and hands it back.
	wb := shim.New(api, ns, shim.Options{Clock: c, Identity: "kube-system/whereabouts-node2"})
	require.NoError(t, wb.Locked(context.Background(), nothing))
	gets = log.gets
	require.NoError(t, s.Locked(context.Background(), nothing))
	require.NoError(t, g.Wait(context.Background()))
	assert.Equal(t, gets+1, log.gets, "written by someone else since: read first")
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity)
}

// Releases of one moment are judged in one turn on one list of the pools,
// and their removals from one pool share patches; each still releases its
// own entries and reservations only.
func TestAGroupReleasesTogether(t *testing.T) {
	const n = 16
	allocs := map[string]alloc{"1": {ContainerID: "keep", PodRef: "ns/keep", IfName: "eth1"}}
	objs := []any{fake.NewReservation("10.0.0.1", "ns/keep")}
	for i := 2; i < 2+n; i++ {
		pod := "ns/p" + strconv.Itoa(i)
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: pod, IfName: "eth1"}
		objs = append(objs, fake.NewReservation(fmt.Sprintf("10.0.0.%d", i), pod))
	}
	api := fake.New()
	api.Put(append(objs, fake.NewPool("10.0.0.0-24", "10.0.0.0/24", allocs))...)
	c := &syncClock{now: testEpoch}
	var log leaseLog
	lease := log.hook(api, c, 3*time.Millisecond)
	var lists, patches atomic.Int32
	api.Hook = func(call *fake.Call) error {
		switch {
		case call.Verb == "list" && call.Resource == fake.Pools:
			lists.Add(1)
		case call.Verb == "patch":
			patches.Add(1)
			time.Sleep(3 * time.Millisecond)
		}
		return lease(call)
	}
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	var wg sync.WaitGroup
	for i := 2; i < 2+n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := groupStore(api, c, g)
			ctx := context.Background()
			plan, err := s.Plan(ctx, "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p"+strconv.Itoa(i), "new", ""))
			require.NoError(t, err)
			deleted, err := s.ReleaseReservations(ctx, plan)
			require.NoError(t, err)
			assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, deleted)
			removed, err := s.RemoveAllocations(ctx, plan)
			require.NoError(t, err)
			assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, ipsOf(removed))
		}(i)
	}
	wg.Wait()
	require.NoError(t, g.Wait(context.Background()))
	assert.Equal(t, []string{"1"}, offsets(t, api, "10.0.0.0-24"))
	assert.Equal(t, []string{"10.0.0.1"}, reservations(api))
	assert.Less(t, int(lists.Load()), n/2, "lists of the pools under the Lease")
	assert.Less(t, log.takes(), n/2, "acquisitions")
	assert.Less(t, int(patches.Load()), n/2, "patches of the pool")
}

// Removals from one pool that meet go in one patch, each only while its
// entry is what it planned on: an entry that changed hands since stays.
func TestAGroupsRemovalsKeepWhatChangedHands(t *testing.T) {
	api := fake.New()
	api.Put(storageNetwork()...)
	c := &syncClock{now: testEpoch}
	g := &shim.Group{}
	s := groupStore(api, c, g)
	ctx := context.Background()
	planA, err := s.Plan(ctx, storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	planB, err := s.Plan(ctx, storage, "", shim.Attachment("old2", "", nil, nil))
	require.NoError(t, err)
	// Offset 4 changes hands after both plans were made.
	p := api.Pool(ns, storage)
	p.Spec.Allocations["4"] = alloc{ContainerID: "newer", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
	_, err = api.UpdatePool(ns, p)
	require.NoError(t, err)
	var wg sync.WaitGroup
	got := make([][]string, 2)
	for i, plan := range []shim.Plan{planA, planB} {
		wg.Add(1)
		go func(i int, plan shim.Plan) {
			defer wg.Done()
			removed, err := groupStore(api, c, g).RemoveAllocations(ctx, plan)
			require.NoError(t, err)
			got[i] = ipsOf(removed)
		}(i, plan)
	}
	wg.Wait()
	assert.Equal(t, []string{"192.168.50.8"}, got[0], "4 is another sandbox's now; 8 is old1's")
	assert.Equal(t, []string{"192.168.50.5"}, got[1])
	assert.Equal(t, []string{"3", "4", "6", "7"}, offsets(t, api, storage))
}

// A turn that panics (a bug) panics in its caller's goroutine, which a node
// agent recovers for its request, not in the group's: the group goes on
// serving, and hands the Lease back.
func TestAPanicInAGroupsTurnIsTheCallers(t *testing.T) {
	api := fake.New()
	c := &syncClock{now: testEpoch}
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	s := groupStore(api, c, g)
	ctx := context.Background()
	assert.PanicsWithValue(t, "a bug", func() {
		_ = s.Locked(ctx, func(context.Context, *shim.Locked) error { panic("a bug") })
	})
	ran := false
	require.NoError(t, s.Locked(ctx, func(context.Context, *shim.Locked) error { ran = true; return nil }))
	assert.True(t, ran)
	require.NoError(t, g.Wait(ctx))
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "handed back")
}

// leaseWrites is the API server, recording the Lease's writes as "take"
// (free before), "renew" or "hand back"; the first renewal fails as a
// timeout does.
type leaseWrites struct {
	*fake.API
	mu     sync.Mutex
	writes []string
	failed bool
}

func (w *leaseWrites) UpdateLease(ctx context.Context, l *shim.Lease) (*shim.Lease, error) {
	w.mu.Lock()
	cur := w.API.Lease(l.Namespace, l.Name)
	switch {
	case cur == nil || cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity == "":
		w.writes = append(w.writes, "take")
	case *l.Spec.HolderIdentity == "":
		w.writes = append(w.writes, "hand back")
	default:
		w.writes = append(w.writes, "renew")
		if !w.failed {
			w.failed = true
			w.mu.Unlock()
			return nil, errors.New("etcdserver: request timed out")
		}
	}
	w.mu.Unlock()
	return w.API.UpdateLease(ctx, l)
}

func (w *leaseWrites) CreateLease(ctx context.Context, l *shim.Lease) (*shim.Lease, error) {
	w.mu.Lock()
	w.writes = append(w.writes, "take")
	w.mu.Unlock()
	return w.API.CreateLease(ctx, l)
}

// A hold whose renewal failed is lost: no turn runs under it. The turn that
// waits behind the one that lost it takes the Lease again, and its requests
// are made under that new hold.
func TestNoTurnRunsUnderALostHold(t *testing.T) {
	api := &leaseWrites{API: fake.New()}
	api.Put(storageNetwork()...)
	c := &syncClock{now: testEpoch}
	// MaxHold far off: only the loss ends the hold.
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1", MaxHold: time.Hour}
	s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Group: g})
	ctx := context.Background()
	second := make(chan error, 1)
	err := s.Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
		go func() {
			second <- s.Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
				_, err := l.Reservation(ctx, "192.168.50.4")
				return err
			})
		}()
		time.Sleep(50 * time.Millisecond) // the second waits for its turn
		c.advance(1500 * time.Millisecond)
		_, err := l.Reservation(ctx, "192.168.50.4") // renews, and the renewal fails
		return err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "renew lease kube-system/whereabouts: etcdserver: request timed out")
	require.NoError(t, <-second, "the next turn runs under a hold of its own")
	require.NoError(t, g.Wait(ctx))
	api.mu.Lock()
	defer api.mu.Unlock()
	assert.Equal(t, []string{"take", "renew", "hand back", "take", "hand back"}, api.writes)
}

// Releases that come while a turn runs go in the same turn only while its
// hold is kept: once a renewal failed, they wait for a turn of their own
// under a new hold, and are done there rather than failed.
func TestReleasesWaitingBehindALostHoldGetANewOne(t *testing.T) {
	api := &leaseWrites{API: fake.New()}
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]alloc{
		"2": {ContainerID: "old-2", PodRef: "ns/p2", IfName: "eth1"},
		"3": {ContainerID: "old-3", PodRef: "ns/p3", IfName: "eth1"},
	}), fake.NewReservation("10.0.0.2", "ns/p2"), fake.NewReservation("10.0.0.3", "ns/p3"))
	c := &syncClock{now: testEpoch}
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1", MaxHold: time.Hour}
	s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Group: g})
	ctx := context.Background()
	plan := func(pod string) shim.Plan {
		p, err := s.Plan(ctx, "10.0.0.0-24", "", shim.EarlierSandboxes(pod, "new", ""))
		require.NoError(t, err)
		return p
	}
	plan2, plan3 := plan("ns/p2"), plan("ns/p3")
	second := make(chan error, 1)
	var once sync.Once
	api.Hook = func(call *fake.Call) error {
		if call.Verb == "list" && call.Resource == fake.Pools {
			once.Do(func() {
				go func() {
					_, err := s.ReleaseReservations(ctx, plan3)
					second <- err
				}()
				time.Sleep(50 * time.Millisecond)  // the second waits for the turn
				c.advance(1500 * time.Millisecond) // the delete renews, and the renewal fails
			})
		}
		return nil
	}
	_, err := s.ReleaseReservations(ctx, plan2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "renew lease kube-system/whereabouts")
	require.NoError(t, <-second, "released under a hold of its own")
	require.NoError(t, g.Wait(ctx))
	assert.Equal(t, []string{"10.0.0.2"}, reservations(api.API))
}

// baton runs goroutines one at a time, as the simulation's scheduler does:
// whoever runs holds it, and hands it on only at a request (the API's hook)
// or in Await. A group that blocked in any other way (a receive, a mutex
// held across a request, a WaitGroup) would keep it, and nothing would run.
type baton chan struct{}

func (b baton) take() { b <- struct{}{} }
func (b baton) give() { <-b }

// goroutine starts f holding the baton.
func (b baton) goroutine(f func()) {
	go func() {
		b.take()
		defer b.give()
		f()
	}()
}

// await waits for done without the baton.
func (b baton) await(done <-chan struct{}) {
	b.give()
	<-done
	b.take()
}

// A group given Go and Await starts every goroutine of its own with Go and
// waits only with Await: under a scheduler that runs one goroutine at a
// time, its turns, releases (their deletes side by side, renewing the Lease
// as they go), removals and hand back all run, and Options.Turn sees each
// turn begin and end, never two at once.
func TestAGroupRunsUnderItsCallersScheduler(t *testing.T) {
	const n = 12
	allocs := map[string]alloc{}
	var objs []any
	for i := 2; i < 2+n; i++ {
		pod := "ns/p" + strconv.Itoa(i)
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: pod, IfName: "eth1"}
		objs = append(objs, fake.NewReservation(fmt.Sprintf("10.0.0.%d", i), pod))
	}
	api := fake.New()
	api.Put(append(objs, fake.NewPool("10.0.0.0-24", "10.0.0.0/24", allocs))...)
	c := &syncClock{now: testEpoch}
	b := make(baton, 1)
	var renewals atomic.Int32
	api.Hook = func(call *fake.Call) error {
		if call.Resource == fake.Leases && call.Verb == "update" {
			if l := api.Lease(ns, names.Lease); l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				renewals.Add(1)
			}
		}
		// Time passes at every request (so the Lease is renewed), and
		// another goroutine may run meanwhile.
		c.advance(200 * time.Millisecond)
		b.give()
		time.Sleep(time.Millisecond)
		b.take()
		return nil
	}
	var spawned, awaited atomic.Int32
	var inside, most, turns atomic.Int32
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/u/1", Width: 4, MaxHold: 5 * time.Second,
		Go:    func(f func()) { spawned.Add(1); b.goroutine(f) },
		Await: func(done <-chan struct{}) { awaited.Add(1); b.await(done) },
	}
	store := func() *shim.Store {
		return shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Group: g,
			Identity: "harvester-ipam-agent/n1/u/1/request",
			Turn: func(holder string) func() {
				assert.Equal(t, g.Identity, holder, "a turn of the group is held as the group")
				turns.Add(1)
				if now := inside.Add(1); now > most.Load() {
					most.Store(now)
				}
				return func() { inside.Add(-1) }
			}})
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var wg sync.WaitGroup
		for i := 2; i < 2+n; i++ {
			wg.Add(1)
			b.goroutine(func() {
				defer wg.Done()
				s := store()
				ctx := context.Background()
				plan, err := s.Plan(ctx, "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p"+strconv.Itoa(i), "new", ""))
				if !assert.NoError(t, err) {
					return
				}
				deleted, err := s.ReleaseReservations(ctx, plan)
				assert.NoError(t, err)
				assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, deleted)
				removed, err := s.RemoveAllocations(ctx, plan)
				assert.NoError(t, err)
				assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, ipsOf(removed))
			})
		}
		wg.Wait()
		b.take()
		defer b.give()
		assert.NoError(t, g.Wait(context.Background()))
	}()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("the group blocked outside Await: nothing ran on")
	}
	assert.Empty(t, offsets(t, api, "10.0.0.0-24"))
	assert.Empty(t, reservations(api))
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "handed back")
	assert.Positive(t, spawned.Load())
	assert.Positive(t, awaited.Load())
	assert.Positive(t, renewals.Load(), "the Lease renewed while the deletes ran side by side")
	assert.Positive(t, turns.Load())
	assert.EqualValues(t, 1, most.Load(), "never two turns at once")
	assert.Zero(t, inside.Load(), "every turn ended")
}
