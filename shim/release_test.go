package shim_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// copyAPI is the fake API server with a process's own copy of the pools
// and reservations (shim.Local), as a node agent's informers keep it: the
// copy is the server's state as of the last delivery, and a watch delivers
// every write when deliver is called (or at once, with live).
type copyAPI struct {
	*fake.API
	mu        sync.Mutex
	live      bool
	pools     map[string]*shim.Pool
	resv      map[string]*shim.Reservation
	delivered uint64
	moved     chan struct{}
	// asOf records the resourceVersion each list of the pools asked to be
	// no older than ("": fresh).
	asOf []string
}

func (c *copyAPI) ListPools(ctx context.Context, namespace string, page shim.Page) ([]shim.Pool, string, error) {
	if page.Continue == "" {
		c.mu.Lock()
		c.asOf = append(c.asOf, page.NotOlderThan)
		c.mu.Unlock()
	}
	return c.API.ListPools(ctx, namespace, page)
}

func newCopyAPI(api *fake.API, live bool) *copyAPI {
	c := &copyAPI{API: api, live: live, moved: make(chan struct{})}
	c.deliver()
	return c
}

// deliver brings the copy up to the server's state, as the watch would.
func (c *copyAPI) deliver() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pools, c.resv = map[string]*shim.Pool{}, map[string]*shim.Reservation{}
	for _, p := range c.API.AllPools(ns) {
		c.pools[p.Name] = &p
		if n, _ := strconv.ParseUint(p.ResourceVersion, 10, 64); n > c.delivered {
			c.delivered = n
		}
	}
	for _, r := range c.API.AllReservations(ns) {
		c.resv[r.Name] = &r
	}
	close(c.moved)
	c.moved = make(chan struct{})
}

// deliverOnly brings the named pools of the copy up to the server's state
// and counts every write up to the newest of them as delivered, as an
// informer's relist does part way through (it delivers the pools in the
// order of their names, not of their writes): the copy then claims to hold
// writes it does not.
func (c *copyAPI) deliverOnly(names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range names {
		p := c.API.Pool(ns, name)
		if p == nil {
			continue
		}
		c.pools[name] = p
		if n, _ := strconv.ParseUint(p.ResourceVersion, 10, 64); n > c.delivered {
			c.delivered = n
		}
	}
	close(c.moved)
	c.moved = make(chan struct{})
}

func (c *copyAPI) sync() {
	if c.live {
		c.deliver()
	}
}

func (c *copyAPI) LocalPool(_, name string) *shim.Pool {
	c.sync()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pools[name]
}

func (c *copyAPI) LocalReservation(_, name string) *shim.Reservation {
	c.sync()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resv[name]
}

func copyStore(api shim.API, c shim.Clock) *shim.Store {
	return shim.New(api, ns, shim.Options{
		Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2, Jitter: 1}, Clock: c,
		Random: func() float64 { return 0.5 }, Identity: "harvester-ipam-agent/test",
	})
}

// With a copy of its own, a release removes the entries first and judges
// the reservation under one acquisition of the Lease: the pool's patch on
// the plan's read, one list of the pools as of that patch, the delete as the
// copy shows the reservation, and no read of the reservation.
func TestReleaseWithACopyInOneTurn(t *testing.T) {
	api := fake.New()
	api.Put(storageNetwork()...)
	cp := newCopyAPI(api, true)
	s := copyStore(cp, &syncClock{now: testEpoch})
	require.True(t, s.HasLocal())
	ctx := context.Background()
	var calls []string
	patched := ""
	api.Hook = func(c *fake.Call) error {
		calls = append(calls, c.Verb+" "+c.Resource)
		if c.Verb == "list" {
			patched = api.Pool(ns, storage).ResourceVersion
		}
		return nil
	}
	p, onCopy, err := s.Look(ctx, storage, shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	assert.True(t, onCopy)
	plan, err := shim.PlanOf(p, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	removed, deleted, err := s.Release(ctx, plan)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, ipsOf(removed))
	assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, deleted)
	assert.Equal(t, []string{"get leases", "create leases", "patch ippools", "list ippools",
		"delete overlappingrangeipreservations", "delete overlappingrangeipreservations", "update leases"}, calls)
	assert.Equal(t, []string{patched}, cp.asOf, "the pools listed as of the release's own patch")
	assert.Equal(t, []string{"3", "5", "6", "7"}, offsets(t, api, storage))
	assert.NotContains(t, reservations(api), "192.168.50.4")
	assert.Equal(t, "", *api.Lease(ns, "whereabouts").Spec.HolderIdentity)
}

// The reservation is judged on a list of the pools taken under the Lease,
// whatever the copy shows: whereabouts made a pool of another range just
// before the Lease was taken and handed the pod's new sandbox the same
// address there, keeping the reservation (it reuses one of the pod's own);
// the copy never learns of that pool, and the reservation stays. Without a
// patch of its own (the entries were gone), the list is fresh.
func TestReleaseWithACopyJudgesOnAList(t *testing.T) {
	for _, tt := range []struct {
		name     string
		gone     bool // the entries were removed already (a DEL again)
		wantAsOf bool // the list is as of the release's patch
	}{
		{name: "as of the release's patch", wantAsOf: true},
		{name: "no patch: fresh", gone: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			if tt.gone {
				p := api.Pool(ns, storage)
				delete(p.Spec.Allocations, "4")
				_, err := api.UpdatePool(ns, p)
				require.NoError(t, err)
			}
			cp := newCopyAPI(api, false)
			s := copyStore(cp, &syncClock{now: testEpoch})
			ctx := context.Background()
			// The plan, as DEL makes it from the recorded address.
			e := shim.Allocation{Pool: storage, Offset: "4", IPAllocation: alloc{ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}
			e.IP, _ = shim.OffsetIP(netIP("192.168.50.0"), "4")
			plan := shim.Plan{Pool: storage, Entries: []shim.Allocation{e}}
			if !tt.gone {
				var err error
				plan, err = shim.PlanOf(cp.LocalPool(ns, storage), "", shim.Attachment("old1", "lhnet1", nil, nil))
				require.NoError(t, err)
				plan.Entries = plan.Entries[:1] // 192.168.50.4 alone
			}
			once := false
			patched := ""
			api.Hook = func(c *fake.Call) error {
				if c.Resource == fake.Leases && !once {
					once = true
					// whereabouts, just before: a pool of a wider range, the
					// pod's new sandbox at the same address, the reservation kept.
					api.Put(fake.NewPool("192.168.50.0-23", "192.168.50.0/23", map[string]alloc{
						"4": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}))
				}
				if c.Verb == "list" && c.Resource == fake.Pools && tt.wantAsOf {
					patched = api.Pool(ns, storage).ResourceVersion
				}
				return nil
			}
			removed, deleted, err := s.Release(ctx, plan)
			require.NoError(t, err)
			assert.Empty(t, deleted, "the new sandbox's reservation stays")
			assert.Contains(t, reservations(api), "192.168.50.4")
			assert.Equal(t, []string{patched}, cp.asOf)
			if !tt.gone {
				assert.Equal(t, []string{"192.168.50.4"}, ipsOf(removed))
			}
		})
	}
}

// A copy that claims to hold every write up to the release's own patch may
// still lack an older write to another pool (an informer's relist delivers
// the pools by name, and counts the newest resourceVersion it delivered):
// whereabouts gave the pod's new sandbox the address in an overlapping pool
// just before the Lease was taken, and the copy has the release's own patch
// but not that pool. The reservation is judged on a list of the pools as of
// the patch, never on the copy: it stays.
func TestReleaseWithACopyNeverJudgesOnIt(t *testing.T) {
	const wide = "192.168.50.0-23"
	api := fake.New()
	api.Put(storageNetwork()...)
	api.Put(fake.NewPool(wide, "192.168.50.0/23", map[string]alloc{}))
	cp := newCopyAPI(api, false)
	s := copyStore(cp, &syncClock{now: testEpoch})
	ctx := context.Background()
	plan, err := shim.PlanOf(cp.LocalPool(ns, storage), "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	plan.Entries = plan.Entries[:1] // 192.168.50.4 alone
	once := false
	lists := 0
	api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Leases && !once {
			once = true
			// whereabouts, just before: the pod's new sandbox at the same
			// address in the wider pool, the reservation kept.
			p := api.Pool(ns, wide)
			p.Spec.Allocations["4"] = alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
		}
		if c.Verb == "list" && c.Resource == fake.Pools {
			lists++
		}
		if c.Verb == "patch" && c.Resource == fake.Pools {
			// The informer relists: the release's own pool arrives with its
			// patch, the wider pool's write not yet.
			go func() {
				time.Sleep(5 * time.Millisecond)
				cp.deliverOnly(storage)
			}()
		}
		return nil
	}
	removed, deleted, err := s.Release(ctx, plan)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.4"}, ipsOf(removed))
	assert.Empty(t, deleted, "the new sandbox's reservation stays")
	assert.Contains(t, reservations(api), "192.168.50.4")
	assert.Equal(t, 1, lists, "judged on a list of the pools as of the patch")
}

// Releases of one moment, through a group, each with its copy: one patch of
// the pool, one acquisition, every entry and reservation its own.
func TestReleasesWithACopyGoTogether(t *testing.T) {
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
	cp := newCopyAPI(api, true)
	c := &syncClock{now: testEpoch}
	var log leaseLog
	lease := log.hook(api, c, 3*time.Millisecond)
	var mu sync.Mutex
	patches, lists := 0, 0
	api.Hook = func(call *fake.Call) error {
		mu.Lock()
		switch {
		case call.Verb == "patch":
			patches++
		case call.Verb == "list":
			lists++
		}
		mu.Unlock()
		return lease(call)
	}
	g := &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	var wg sync.WaitGroup
	for i := 2; i < 2+n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := shim.New(cp, ns, shim.Options{Clock: c, Group: g})
			p := cp.LocalPool(ns, "10.0.0.0-24")
			plan, err := shim.PlanOf(p, "", shim.EarlierSandboxes("ns/p"+strconv.Itoa(i), "new", ""))
			require.NoError(t, err)
			removed, deleted, err := s.Release(context.Background(), plan)
			require.NoError(t, err)
			assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, ipsOf(removed))
			assert.Equal(t, []string{fmt.Sprintf("10.0.0.%d", i)}, deleted)
		}(i)
	}
	wg.Wait()
	require.NoError(t, g.Wait(context.Background()))
	assert.Empty(t, offsets(t, api, "10.0.0.0-24"))
	assert.Empty(t, reservations(api))
	assert.Less(t, patches, n/2)
	assert.Less(t, log.takes(), n/2)
	assert.Less(t, lists, n/2, "one list of the pools a turn")
}

func netIP(s string) net.IP { return net.ParseIP(s) }

// "No reservation" is never decided from the copy: a reservation the copy
// does not show as the entry's (none, or another pod's, not yet delivered
// since) is read from the API server, and when it is the entry's there, it
// is released.
func TestReleaseWithACopyReadsTheReservationItDoesNotShow(t *testing.T) {
	for _, tt := range []struct {
		name   string
		inCopy *shim.Reservation // the copy's reservation 192.168.50.4
	}{
		{name: "the copy shows none"},
		{name: "the copy shows another pod's", inCopy: fake.NewReservation("192.168.50.4", "longhorn-system/im-b")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			cp := newCopyAPI(api, false)
			cp.mu.Lock()
			delete(cp.resv, "192.168.50.4")
			if tt.inCopy != nil {
				cp.resv["192.168.50.4"] = tt.inCopy
			}
			cp.mu.Unlock()
			s := copyStore(cp, &syncClock{now: testEpoch})
			ctx := context.Background()
			gets := 0
			api.Hook = func(c *fake.Call) error {
				if c.Verb == "get" && c.Resource == fake.Reservations && c.Name == "192.168.50.4" {
					gets++
				}
				return nil
			}
			plan, err := shim.PlanOf(cp.LocalPool(ns, storage), "", shim.Attachment("old1", "lhnet1", nil, nil))
			require.NoError(t, err)
			plan.Entries = plan.Entries[:1] // 192.168.50.4 alone
			removed, deleted, err := s.Release(ctx, plan)
			require.NoError(t, err)
			assert.Equal(t, []string{"192.168.50.4"}, ipsOf(removed))
			assert.Equal(t, []string{"192.168.50.4"}, deleted, "found by a GET and released")
			assert.NotContains(t, reservations(api), "192.168.50.4")
			assert.Equal(t, 1, gets)
		})
	}
}

// The API server goes away right after a release removed the entries (it
// restarts): the reservations are not left without their entries for the
// reconciler, whose grace is minutes; the release judges them again, on a
// fresh list under the Lease, once the server answers, and succeeds. The
// pod's next ADD would not find them: it looks for earlier sandboxes'
// entries, and they are gone.
func TestReleaseWithACopyJudgesAgainWhenTheServerWasGone(t *testing.T) {
	api := fake.New()
	api.Put(storageNetwork()...)
	cp := newCopyAPI(api, true)
	s := copyStore(cp, &syncClock{now: testEpoch})
	ctx := context.Background()
	down := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && c.Resource == fake.Pools {
			down = 5 // the next five requests meet a server that is gone
			return nil
		}
		if down > 0 {
			down--
			return fmt.Errorf("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return nil
	}
	p, _, err := s.Look(ctx, storage, shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	plan, err := shim.PlanOf(p, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	removed, deleted, err := s.Release(ctx, plan)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, ipsOf(removed))
	assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, deleted)
	assert.NotContains(t, reservations(api), "192.168.50.4")
	assert.NotContains(t, reservations(api), "192.168.50.8")
	assert.Equal(t, []string{"3", "5", "6", "7"}, offsets(t, api, storage))
}

// The reservations of a pod that no entry of it holds (a node agent killed
// between removing an earlier sandbox's entries and judging their
// reservations) are released by the plugin's ADD that takes over the lost
// ADD: judged as every reservation is, under the Lease on a fresh list of
// the pools; those of another pod or network, and those an entry of the pod
// holds, stay.
func TestStrayReservationsOfAPodAreReleased(t *testing.T) {
	api := fake.New()
	api.Put(storageNetwork()...)
	api.Put(fake.NewReservation("192.168.50.9", "longhorn-system/im-a"), // the stray: no entry
		fake.NewReservation("192.168.50.12", "longhorn-system/im-a"),      // no entry, but no earlier sandbox recorded it
		fake.NewReservation("blue-192.168.50.10", "longhorn-system/im-a"), // another network's
		fake.NewReservation("192.168.50.11", "longhorn-system/im-b"))      // another pod's
	s := shim.New(api, ns, shim.Options{Clock: &clock{now: testEpoch}, Identity: "harvester-ipam/test"})
	earlier := []net.IP{netIP("192.168.50.9"), netIP("192.168.50.3"), netIP("192.168.50.10"), netIP("192.168.50.11")}
	deleted, err := s.ReleaseStrayReservations(context.Background(), "longhorn-system/im-a", "", earlier)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.9"}, deleted)
	assert.NotContains(t, reservations(api), "192.168.50.9")
	for _, stays := range []string{"192.168.50.3", "192.168.50.4", "192.168.50.5", "blue-192.168.50.10", "192.168.50.11", "192.168.50.12"} {
		assert.Contains(t, reservations(api), stays)
	}
	assert.Equal(t, "", *api.Lease(ns, "whereabouts").Spec.HolderIdentity, "the Lease handed back")
}
