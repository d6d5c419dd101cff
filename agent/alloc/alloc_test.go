package alloc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	wblogging "github.com/k8snetworkplumbingwg/whereabouts/pkg/logging"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

const ns = "kube-system"

func TestMain(m *testing.M) {
	// whereabouts' allocator logs at debug level to stderr unless told not to;
	// the agent tells it once at start.
	wblogging.SetLogStderr(false)
	os.Exit(m.Run())
}

// quick is a store clock whose waits end at once.
type quick struct{}

func (quick) Now() time.Time { return time.Now() }
func (quick) Sleep(ctx context.Context, _ time.Duration) error {
	return ctx.Err()
}

func store(api *fake.API) *shim.Store {
	return shim.New(api, ns, shim.Options{Clock: quick{}, LeaseRetry: time.Millisecond})
}

// ipam is a whereabouts config of one range, as LoadIPAMConfig leaves it.
func ipam(rng string, exclude ...string) *wbtypes.IPAMConfig {
	_, n, err := net.ParseCIDR(rng)
	if err != nil {
		panic(err)
	}
	return &wbtypes.IPAMConfig{
		PodName: "im-a", PodNamespace: "longhorn-system", OverlappingRanges: true,
		IPRanges: []wbtypes.RangeConfiguration{{Range: n.String(), RangeStart: n.IP, OmitRanges: exclude}},
	}
}

func forPod(c *wbtypes.IPAMConfig, pod string) *wbtypes.IPAMConfig {
	cp := *c
	cp.PodName = pod
	return &cp
}

func req(api *fake.API, c *wbtypes.IPAMConfig, id string) alloc.Request {
	return alloc.Request{Store: store(api), IPAM: c, ContainerID: id, IfName: "lhnet1"}
}

func TestAllocateWritesWhatWhereaboutsWrites(t *testing.T) {
	api := fake.New()
	a := alloc.New(alloc.Options{})
	ips, err := a.Allocate(context.Background(), req(api, ipam("192.168.50.0/24", "192.168.50.1/32"), "c1"))
	require.NoError(t, err)
	require.Len(t, ips, 1)
	assert.Equal(t, "192.168.50.2/24", ips[0].String(), "the lowest free address outside the excludes (.0 is the network, .1 excluded)")

	p := api.Pool(ns, "192.168.50.0-24")
	require.NotNil(t, p, "the pool is created on the range's first ADD")
	assert.Equal(t, "192.168.50.0/24", p.Spec.Range)
	assert.Equal(t, map[string]shim.IPAllocation{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, p.Spec.Allocations)

	rs := api.AllReservations(ns)
	require.Len(t, rs, 1)
	assert.Equal(t, "192.168.50.2", rs[0].Name)
	assert.Equal(t, shim.ReservationSpec{ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, rs[0].Spec)
}

func TestAllocateNamedNetworkAndIPv6(t *testing.T) {
	api := fake.New()
	c := ipam("fd00:10::/64")
	c.NetworkName = "blue"
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, c, "c1"))
	require.NoError(t, err)
	assert.Equal(t, "fd00:10::1/64", ips[0].String())
	require.NotNil(t, api.Pool(ns, "blue-fd00-10---64"))
	rs := api.AllReservations(ns)
	require.Len(t, rs, 1)
	assert.Equal(t, "blue-fd00-10--1", rs[0].Name)
}

func TestAllocateWithoutOverlappingRangesWritesNoReservation(t *testing.T) {
	api := fake.New()
	c := ipam("10.0.0.0/29")
	c.OverlappingRanges = false
	_, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, c, "c1"))
	require.NoError(t, err)
	assert.Empty(t, api.AllReservations(ns))
	assert.Len(t, api.Pool(ns, "10.0.0.0-29").Spec.Allocations, 1)
}

// patches counts the pool patches the fake served.
func patches(api *fake.API) *atomic.Int32 {
	n := new(atomic.Int32)
	prev := api.Hook
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && c.Resource == fake.Pools {
			n.Add(1)
		}
		if prev != nil {
			return prev(c)
		}
		return nil
	}
	return n
}

// gate holds every pool patch until release is closed: ADDs that arrive
// meanwhile queue behind the first.
func gate(api *fake.API) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	prev := api.Hook
	api.Hook = func(c *fake.Call) error {
		if prev != nil {
			if err := prev(c); err != nil {
				return err
			}
		}
		if c.Verb == "patch" && c.Resource == fake.Pools {
			<-ch
		}
		return nil
	}
	return func() { once.Do(func() { close(ch) }) }
}

func TestGroupCommitWritesWaitingADDsInOnePatch(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	n := patches(api)
	release := gate(api)
	a := alloc.New(alloc.Options{})
	c := ipam("10.0.0.0/24")

	const pods = 24
	var wg sync.WaitGroup
	got := make([]string, pods)
	errs := make([]error, pods)
	add := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ips, err := a.Allocate(context.Background(), req(api, forPod(c, fmt.Sprintf("im-%02d", i)), fmt.Sprintf("c%02d", i)))
			errs[i] = err
			if err == nil {
				got[i] = ips[0].IP.String()
			}
		}()
	}
	// The first ADD's patch is held; the other 23 arrive and wait together.
	add(0)
	waitFor(t, func() bool { return n.Load() >= 1 })
	for i := 1; i < pods; i++ {
		add(i)
	}
	time.Sleep(50 * time.Millisecond)
	release()
	wg.Wait()

	for i, err := range errs {
		require.NoError(t, err, "ADD %d", i)
	}
	assertDistinct(t, got)
	assert.Len(t, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, pods)
	assert.Len(t, api.AllReservations(ns), pods)
	assert.Equal(t, int32(2), n.Load(), "one patch for the first ADD, one for the 23 that waited behind it")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

func assertDistinct(t *testing.T, ips []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, ip := range ips {
		require.NotEmpty(t, ip)
		require.False(t, seen[ip], "address %s given twice", ip)
		seen[ip] = true
	}
}

func TestAFullRangeFailsOnlyTheMembersPastCapacity(t *testing.T) {
	api := fake.New()
	// A /29 has .1 to .6; .1 is excluded: five addresses for seven pods.
	api.Put(fake.NewPool("10.0.0.0-29", "10.0.0.0/29", map[string]shim.IPAllocation{}))
	n := patches(api)
	release := gate(api)
	a := alloc.New(alloc.Options{})
	c := ipam("10.0.0.0/29", "10.0.0.1/32")

	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []string
	var failed []error
	for i := range 7 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ips, err := a.Allocate(context.Background(), req(api, forPod(c, fmt.Sprintf("im-%d", i)), fmt.Sprintf("c%d", i)))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			ok = append(ok, ips[0].IP.String())
		}()
	}
	waitFor(t, func() bool { return n.Load() >= 1 })
	time.Sleep(50 * time.Millisecond)
	release()
	wg.Wait()

	sort.Strings(ok)
	assert.Equal(t, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, ok)
	require.Len(t, failed, 2)
	for _, err := range failed {
		assert.Equal(t, "error at storage engine: Could not allocate IP in range: ip: 10.0.0.1 / - 10.0.0.6 / range: 10.0.0.0/29 / excludeRanges: [10.0.0.1/32]", err.Error(),
			"whereabouts' own words, so that the plugin explains a full range the same way")
	}
}

func TestAConflictingWriterIsReadFreshAndLosesNothing(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	w := &fake.Whereabouts{API: api, Version: fake.V093, Namespace: ns, Options: shim.Options{Clock: quick{}}}
	// Before our first patch, whereabouts itself allocates in the same pool.
	var once sync.Once
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && c.Resource == fake.Pools {
			once.Do(func() {
				go func() {
					_, err := w.Add(context.Background(), fake.Request{ContainerID: "wb", IfName: "net1", PodRef: "default/other", Range: "10.0.0.0/24"})
					assert.NoError(t, err)
				}()
				waitFor(t, func() bool { return len(api.Pool(ns, "10.0.0.0-24").Spec.Allocations) == 1 })
			})
		}
		return nil
	}
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	p := api.Pool(ns, "10.0.0.0-24")
	assert.Equal(t, map[string]shim.IPAllocation{
		"1": {ContainerID: "wb", PodRef: "default/other", IfName: "net1"},
		"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
	}, p.Spec.Allocations)
	assert.Equal(t, "10.0.0.2", ips[0].IP.String())
}

func TestAnAddressReservedByAnotherPodIsGivenUp(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}),
		// An overlapping range gave 10.0.0.1 to another pod.
		fake.NewReservation("10.0.0.1", "default/elsewhere"))
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2", ips[0].IP.String())
	assert.Equal(t, map[string]shim.IPAllocation{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}},
		api.Pool(ns, "10.0.0.0-24").Spec.Allocations, "the entry at .1 was removed again")
	r, err := api.GetReservation(context.Background(), ns, "10.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "default/elsewhere", r.Spec.PodRef, "the other pod's reservation stays")
}

// On whereabouts v0.7.0's CRDs the API server prunes the entry's ifname:
// the address given up is still removed, and the sandbox holds one entry.
func TestAnAddressGivenUpIsRemovedWhenTheCRDPrunedItsIfName(t *testing.T) {
	api := fake.New()
	api.PruneIfName = true
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}),
		fake.NewReservation("10.0.0.1", "default/elsewhere"))
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2", ips[0].IP.String())
	assert.Equal(t, map[string]shim.IPAllocation{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}},
		api.Pool(ns, "10.0.0.0-24").Spec.Allocations, "the entry at .1, its ifname pruned, was removed again")
}

// whereabouts checks an address's reservation and creates it later, under
// its Lease; a reservation created meanwhile fails its ADD after it wrote
// its entry, and its DEL of that entry then deletes the reservation by name,
// another pod's. So where another pool may hold this pool's addresses
// (overlapping ranges under one network name), or the agent's copy has not
// listed the pools yet, the reservation is created under the Lease; where
// none can, without it.
func TestAReservationAnotherPoolMayShareIsCreatedUnderTheLease(t *testing.T) {
	// The copy: every pool, or (behind) every pool but the other one, which
	// its informer has not delivered yet.
	pools := func(api *fake.API, listed, behind bool) func(string) ([]*shim.Pool, bool) {
		return func(namespace string) ([]*shim.Pool, bool) {
			var out []*shim.Pool
			for _, p := range api.AllPools(namespace) {
				if behind && p.Name != names.Pool("10.0.0.0/24", "") {
					continue
				}
				out = append(out, p.DeepCopy())
			}
			return out, listed
		}
	}
	for _, tc := range []struct {
		name    string
		network string
		other   *shim.Pool
		listed  bool
		lease   bool
		// behind: the copy lacks the other pool and has not shown the
		// allocation's own patch (the simulation's seed 1120 on v0.8.0).
		behind bool
	}{
		{"another pool whose range overlaps, missing from a copy that has not shown the allocation's patch", "", fake.NewPool("10.0.0.0-25", "10.0.0.0/25", nil), true, true, true},
		{"no other pool, in a copy that has not shown the allocation's patch", "", nil, true, true, true},
		{"no other pool", "", nil, true, false, false},
		{"another pool whose range overlaps", "", fake.NewPool("10.0.0.0-25", "10.0.0.0/25", nil), true, true, false},
		{"a node slice of the network, overlapping", "red", fake.NewPool("red-node1-10.0.0.0-25", "10.0.0.0/25", nil), true, true, false},
		{"another network's pool over the same range", "red", fake.NewPool("blue-10.0.0.0-25", "10.0.0.0/25", nil), true, false, false},
		{"another pool, apart", "", fake.NewPool("10.0.1.0-24", "10.0.1.0/24", nil), true, false, false},
		{"the pools not listed yet", "", nil, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.New()
			api.Put(fake.NewPool(names.Pool("10.0.0.0/24", tc.network), "10.0.0.0/24", map[string]shim.IPAllocation{}))
			if tc.other != nil {
				api.Put(tc.other)
			}
			var holders []string
			api.Hook = func(c *fake.Call) error {
				if c.Verb == "create" && c.Resource == fake.Reservations {
					holder := ""
					if l := api.Lease(ns, "whereabouts"); l != nil && l.Spec.HolderIdentity != nil {
						holder = *l.Spec.HolderIdentity
					}
					holders = append(holders, holder)
				}
				return nil
			}
			c := ipam("10.0.0.0/24")
			c.NetworkName = tc.network
			follows := func(namespace, rv string) bool {
				assert.Equal(t, api.ResourceVersion(fake.Pools, namespace, names.Pool("10.0.0.0/24", tc.network)), rv, "the pool as the allocation wrote it")
				return !tc.behind
			}
			_, err := alloc.New(alloc.Options{Pools: pools(api, tc.listed, tc.behind), Follows: follows}).Allocate(context.Background(), req(api, c, "c1"))
			require.NoError(t, err)
			require.Len(t, holders, 1)
			if tc.lease {
				assert.NotEmpty(t, holders[0], "created under whereabouts' Lease")
			} else {
				assert.Empty(t, holders[0], "created without whereabouts' Lease")
				assert.Nil(t, api.Lease(ns, "whereabouts"), "the Lease never taken")
			}
		})
	}
}

func TestTheCacheHintSkipsAReservedAddressBeforeWriting(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}),
		fake.NewReservation("10.0.0.1", "default/elsewhere"))
	n := patches(api)
	a := alloc.New(alloc.Options{Reserved: func(namespace, name string) *shim.Reservation {
		r, _ := api.GetReservation(context.Background(), namespace, name)
		return r
	}})
	ips, err := a.Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2", ips[0].IP.String())
	assert.Equal(t, int32(1), n.Load(), "no entry written at .1 and removed again")
}

// The copy's reservations are a separate watch from its pools: it may show
// an address reserved that the pool shows free and whose reservation is
// gone. On the range's last free address, trusting it made the range
// "full" (code 999) where whereabouts, reading fresh, allocates it: what the
// hint excluded is read fresh before a range is reported full.
func TestAStaleHintNeverMakesARangeFull(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reserved string // who holds .2's reservation in the API server ("" none)
		want     string // the address allocated, or "" for the range full
	}{
		{"the hinted reservation is gone", "", "10.0.0.2"},
		{"the hinted reservation is there", "default/elsewhere", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.New()
			api.Put(fake.NewPool("10.0.0.0-30", "10.0.0.0/30", map[string]shim.IPAllocation{
				"1": {ContainerID: "x", PodRef: "default/x", IfName: "eth1"}}),
				fake.NewReservation("10.0.0.1", "default/x"))
			if tc.reserved != "" {
				api.Put(fake.NewReservation("10.0.0.2", tc.reserved))
			}
			stale := fake.NewReservation("10.0.0.2", "default/elsewhere")
			a := alloc.New(alloc.Options{Reserved: func(namespace, name string) *shim.Reservation {
				if name == "10.0.0.2" {
					return stale // the copy has not seen its deletion
				}
				r, _ := api.GetReservation(context.Background(), namespace, name)
				return r
			}})
			ips, err := a.Allocate(context.Background(), req(api, ipam("10.0.0.0/30"), "c1"))
			if tc.want == "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "Could not allocate IP in range")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, ips[0].IP.String())
		})
	}
}

// A reservation of the pod that names an earlier container (whereabouts
// v0.7.0's CRD requires containerid; the agent writes it on every version)
// is kept for the new sandbox as it is, as whereabouts keeps it: nothing
// more is written for it (a write that could fail and leave the ADD half
// done), and the new sandbox's DEL releases it with the entry (shim.Owns).
func TestThePodsOwnReservationOfAnEarlierContainerIsKeptAsItIs(t *testing.T) {
	api := fake.New()
	old := fake.NewReservation("10.0.0.1", "longhorn-system/im-a")
	old.Spec.ContainerID = "old"
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}), old)
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1", ips[0].IP.String())
	o, err := api.GetReservation(context.Background(), ns, "10.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "old", o.Spec.ContainerID, "kept as it is")
	assert.Equal(t, "longhorn-system/im-a", o.Spec.PodRef)
}

func TestThePodsOwnReservationIsKept(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}),
		fake.NewReservation("10.0.0.1", "longhorn-system/im-a"))
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1", ips[0].IP.String(), "whereabouts keeps a reservation of the same pod")
	assert.NotNil(t, api.Lease(ns, "whereabouts"), "judged under whereabouts' Lease")
}

// whereabouts v0.8.0+ hands the pod's entry on this interface over to a new
// sandbox, keeping its reservation (the earlier container's), in the one
// write that allocates: so does the allocator, and the pod keeps its address
// without a moment without its entry (the ADD's reclaim leaves that entry
// to it). An entry of an earlier sandbox on another interface, or without
// an ifname, still in the pool the allocator writes on is one the reclaim did
// not see (it looked at a copy that was behind): the allocator writes
// nothing and says so, and the plugin releases it on a fresh read before it
// asks again.
func TestAnEntryOfAnEarlierSandboxIsLeftToTheReclaim(t *testing.T) {
	for _, ifname := range []string{"lhnet2", ""} {
		t.Run("ifname "+ifname, func(t *testing.T) {
			api := fake.New()
			pool := map[string]shim.IPAllocation{"7": {ContainerID: "old", PodRef: "longhorn-system/im-a", IfName: ifname}}
			api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", pool), fake.NewReservation("10.0.0.7", "longhorn-system/im-a"))
			n := patches(api)
			_, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "new"))
			require.ErrorIs(t, err, shim.ErrEarlierSandbox)
			assert.Contains(t, err.Error(), "offsets 7")
			assert.Equal(t, int32(0), n.Load(), "nothing written")
			assert.Equal(t, pool, api.Pool(ns, "10.0.0.0-24").Spec.Allocations)
		})
	}
	t.Run("ifname lhnet1, the request's: handed over", func(t *testing.T) {
		api := fake.New()
		api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{"7": {ContainerID: "old", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}),
			fake.NewReservation("10.0.0.7", "longhorn-system/im-a"))
		n := patches(api)
		ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "new"))
		require.NoError(t, err)
		assert.Equal(t, "10.0.0.7", ips[0].IP.String(), "the pod keeps its address")
		assert.Equal(t, map[string]shim.IPAllocation{"7": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}},
			api.Pool(ns, "10.0.0.0-24").Spec.Allocations)
		assert.Equal(t, int32(1), n.Load(), "one write")
		o, err := api.GetReservation(context.Background(), ns, "10.0.0.7")
		require.NoError(t, err)
		assert.Equal(t, "longhorn-system/im-a", o.Spec.PodRef, "its reservation kept")
	})
}

func TestAnADDRunAgainGetsItsAddressWithoutAWrite(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{
		"4": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
	}))
	n := patches(api)
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.4", ips[0].IP.String())
	assert.Equal(t, int32(0), n.Load())
	assert.Len(t, api.AllReservations(ns), 1, "its reservation is made if it was missing")
}

func TestAGoneClientIsDroppedBeforeTheWrite(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	n := patches(api)
	release := gate(api)
	a := alloc.New(alloc.Options{})
	c := ipam("10.0.0.0/24")
	done := make(chan error, 2)
	go func() { _, err := a.Allocate(context.Background(), req(api, c, "first")); done <- err }()
	waitFor(t, func() bool { return n.Load() >= 1 })
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, err := a.Allocate(ctx, req(api, forPod(c, "im-gone"), "gone")); done <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	release()
	var errs []string
	for range 2 {
		if err := <-done; err != nil {
			errs = append(errs, err.Error())
		}
	}
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "context canceled")
	assert.Len(t, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, 1, "nothing written for the ADD whose client went away")
}

func TestAStaleBaseIsReadAgainFresh(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	// Another writer fills .1 to .3; the watch cache still serves the empty pool.
	for i := 1; i <= 3; i++ {
		p := api.Pool(ns, "10.0.0.0-24")
		p.Spec.Allocations[fmt.Sprint(i)] = shim.IPAllocation{ContainerID: fmt.Sprint("x", i), PodRef: "default/x", IfName: "net1"}
		_, err := api.UpdatePool(ns, p)
		require.NoError(t, err)
	}
	api.CacheLag = func() int { return 3 }
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.4", ips[0].IP.String())
	assert.Len(t, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, 4)
}

func TestMultiRangeAllocatesEachAndKeepsWhatAFailureLeaves(t *testing.T) {
	api := fake.New()
	c := ipam("10.0.0.0/24")
	_, n6, _ := net.ParseCIDR("fd00::/126")
	c.IPRanges = append(c.IPRanges, wbtypes.RangeConfiguration{Range: n6.String(), RangeStart: n6.IP})
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, c, "c1"))
	require.NoError(t, err)
	require.Len(t, ips, 2)
	assert.Equal(t, "10.0.0.1/24", ips[0].String())
	assert.Equal(t, "fd00::1/126", ips[1].String())

	// whereabouts' fd00::/126 holds ::1 and ::2; one more pod fills it, the
	// next fails in it after its IPv4 address was written (as whereabouts
	// leaves it).
	for i := range 2 {
		_, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, forPod(c, fmt.Sprint("p", i)), fmt.Sprint("d", i)))
		if i < 1 {
			require.NoError(t, err)
		} else {
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "error at storage engine: Could not allocate IP in range"), err.Error())
		}
	}
	assert.Len(t, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, 3)
	assert.Len(t, api.Pool(ns, "fd00---126").Spec.Allocations, 2)
}

func TestNoPodNameIsWhereaboutsOwnRefusal(t *testing.T) {
	c := ipam("10.0.0.0/24")
	c.PodName = ""
	_, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(fake.New(), c, "c1"))
	require.EqualError(t, err, "error at storage engine: IPAM client initialization error: no pod name")
}

// Delegate records each address in the attachment's checkpoint before the
// patch that writes its entry: whereabouts v0.7.0's CRD prunes the entry's
// ifname, and a DEL after the agent and the plugin died right after the
// patch finds the entry only by the recorded address.
func TestDelegateRecordsTheAddressBeforeItWritesTheEntry(t *testing.T) {
	api := fake.New()
	api.PruneIfName = true
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	cp := checkpoint.Dir(t.TempDir())
	require.NoError(t, cp.Write(checkpoint.Record{ContainerID: "c1", IfName: "lhnet1", PodRef: "longhorn-system/im-a", Network: "storagenetwork",
		Namespace: ns, Pools: []checkpoint.Pool{{Name: "10.0.0.0-24", Range: "10.0.0.0/24"}}}))
	var recorded [][]string
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && c.Resource == fake.Pools {
			rec, ok, err := cp.Read("c1", "lhnet1")
			require.NoError(t, err)
			require.True(t, ok)
			recorded = append(recorded, rec.IPs)
		}
		return nil
	}
	d := alloc.Delegate{Batcher: alloc.New(alloc.Options{}), Load: func([]byte, string) (*wbtypes.IPAMConfig, string, error) {
		return ipam("10.0.0.0/24"), "0.3.1", nil
	}}
	cfg := &conf.Config{CNIVersion: "0.3.1", Options: conf.Options{CheckpointDir: string(cp)}}
	_, err := d.Add(context.Background(), store(api), cfg, &skel.CmdArgs{ContainerID: "c1", IfName: "lhnet1"})
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"10.0.0.1/24"}}, recorded, "the address was in the checkpoint when its entry was written (as the result gives it, with the range's prefix)")
}

// The agent's copy still shows a pool that was deleted (an operator, or
// whereabouts' cleanup; the informer has not delivered the deletion): the
// patch finds it gone. whereabouts never fails an ADD for a pool that does
// not exist: it creates it, and so does the agent, then allocates there.
func TestAPoolDeletedUnderTheCopyIsCreatedAgain(t *testing.T) {
	api := fake.New()
	objs := cache.New()
	gone := fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{
		"5": {ContainerID: "x", PodRef: "default/x", IfName: "eth1"}})
	gone.Namespace, gone.ResourceVersion = ns, "630"
	objs.SawPool(gone)
	objs.Listed(ns)
	s := shim.New(cache.API{API: api, Objects: objs}, ns, shim.Options{Clock: quick{}, LeaseRetry: time.Millisecond})
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), alloc.Request{Store: s, IPAM: ipam("10.0.0.0/24"), ContainerID: "c1", IfName: "lhnet1"})
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1", ips[0].IP.String(), "the lowest address of the pool created again")
	p := api.Pool(ns, "10.0.0.0-24")
	require.NotNil(t, p, "the pool exists again")
	assert.Equal(t, map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, p.Spec.Allocations)
}

// A round's choice that a conflict made the group give up (its patch wrote
// nothing) leaves the checkpoint when the next round chooses another: the
// record names only what the pool may hold. Left there, on whereabouts
// v0.7.0's CRD (the ifname pruned) it named the address another interface
// of the sandbox got next, and the release of a lost ADD of this one took
// that interface's entry (the simulation, seed 3147 on v0.7.0). Both ways:
// Add reading the record, AddRecording keeping it.
func TestAChoiceGivenUpOnAConflictLeavesTheCheckpoint(t *testing.T) {
	for _, recording := range []bool{false, true} {
		t.Run(fmt.Sprintf("recording %v", recording), func(t *testing.T) {
			api := fake.New()
			api.PruneIfName = true
			objs := cache.New()
			stale := fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{})
			api.Put(stale)
			copied := api.Pool(ns, "10.0.0.0-24")
			objs.SawPool(copied)
			objs.Listed(ns)
			// Since the copy: another interface of the sandbox got .1.
			p := api.Pool(ns, "10.0.0.0-24")
			p.Spec.Allocations = map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}}
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
			s := shim.New(cache.API{API: api, Objects: objs}, ns, shim.Options{Clock: quick{}, LeaseRetry: time.Millisecond})

			cp := checkpoint.Dir(t.TempDir())
			rec := checkpoint.Record{ContainerID: "c1", IfName: "lhnet2", PodRef: "longhorn-system/im-a", Network: "storagenetwork-b",
				Namespace: ns, Pools: []checkpoint.Pool{{Name: "10.0.0.0-24", Range: "10.0.0.0/24"}}}
			d := alloc.Delegate{Batcher: alloc.New(alloc.Options{}), Load: func([]byte, string) (*wbtypes.IPAMConfig, string, error) {
				return ipam("10.0.0.0/24"), "0.3.1", nil
			}}
			cfg := &conf.Config{CNIVersion: "0.3.1", Options: conf.Options{CheckpointDir: string(cp)}}
			args := &skel.CmdArgs{ContainerID: "c1", IfName: "lhnet2"}
			if recording {
				_, err = d.AddRecording(context.Background(), s, cfg, args, rec)
			} else {
				require.NoError(t, cp.Write(rec))
				_, err = d.Add(context.Background(), s, cfg, args)
			}
			require.NoError(t, err)
			got, ok, err := cp.Read("c1", "lhnet2")
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, []string{"10.0.0.2/24"}, got.IPs, "only the address written; .1, chosen on the stale copy, is the other interface's")
		})
	}
}

// A give-up removes the member's entry only while it is still the member's
// own: between its write and the give-up, the entry at that offset may have
// been released and written again for another container (a DEL and another
// ADD of the exec path). That one stays.
func TestAGiveUpRemovesOnlyTheMembersOwnEntry(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}),
		fake.NewReservation("10.0.0.1", "default/elsewhere"))
	intruder := shim.IPAllocation{ContainerID: "intruder", PodRef: "default/intruder", IfName: "eth1"}
	done := false
	api.Hook = func(c *fake.Call) error {
		if !done && c.Verb == "create" && c.Resource == fake.Reservations && c.Name == "10.0.0.1" {
			done = true
			p := api.Pool(ns, "10.0.0.0-24")
			p.Spec.Allocations["1"] = intruder
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
		}
		return nil
	}
	ips, err := alloc.New(alloc.Options{}).Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), "c1"))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2", ips[0].IP.String())
	assert.Equal(t, map[string]shim.IPAllocation{
		"1": intruder,
		"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
	}, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, "the entry written for another container since stays")
}

// Two sandboxes of one pod in one group (which the kubelet never makes; a
// lost ADD and the runtime's retry may): the second would take over the
// entry the first adds, so it waits for the next round, where it takes over
// the first's entry as whereabouts would (the same pod, the same
// interface). Each is answered, with the one address; neither is left
// waiting, and the pool holds the second's entry.
func TestAMemberThatWouldTakeOverAnotherMembersEntryIsAnswered(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	var mu sync.Mutex
	var first func()
	a := alloc.New(alloc.Options{Go: func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = f // the queue's worker: started once both wait
			return
		}
		go f()
	}})
	type answer struct {
		ips []net.IPNet
		err error
	}
	answers := make(chan answer, 2)
	for _, id := range []string{"c1", "c2"} {
		go func() {
			ips, err := a.Allocate(context.Background(), req(api, ipam("10.0.0.0/24"), id))
			answers <- answer{ips, err}
		}()
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return first != nil }, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the second joins the queue
	mu.Lock()
	go first()
	mu.Unlock()
	var got []answer
	for range 2 {
		select {
		case ans := <-answers:
			got = append(got, ans)
		case <-time.After(10 * time.Second):
			t.Fatalf("a member was answered with neither an address nor an error (answers so far: %v)", got)
		}
	}
	for _, ans := range got {
		require.NoError(t, ans.err)
		assert.Equal(t, "10.0.0.1", ans.ips[0].IP.String())
	}
	entries := api.Pool(ns, "10.0.0.0-24").Spec.Allocations
	require.Len(t, entries, 1)
	assert.Contains(t, []string{"c1", "c2"}, entries["1"].ContainerID, "one sandbox's entry")
}

// A member that leaves the group after a round whose patch conflicted (its
// client gone, its range full on the fresh read, the rounds spent) takes
// that round's choice out of its record: nothing was written for it, and on
// a CRD that prunes the ifname its DEL would release the entry a sandbox's
// other interface holds at that address (whereabouts v0.7.0, two
// interfaces of one sandbox on one pool).
func TestAMemberThatLeavesAfterAConflictLeavesNoChoiceInItsRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		// rng is the range; other is what another writer adds after the copy.
		rng    string
		other  map[string]shim.IPAllocation
		rounds int
		cancel bool // the client goes at the first patch
	}{
		{name: "client gone after the conflict", rng: "10.0.0.0/24", cancel: true,
			other: map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}}},
		{name: "range full on the fresh read", rng: "10.0.0.0/30",
			other: map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}, "2": {ContainerID: "x", PodRef: "default/x"}}},
		{name: "rounds spent on conflicts", rng: "10.0.0.0/24", rounds: 1,
			other: map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := strings.ReplaceAll(tc.rng, "/", "-")
			api := fake.New()
			api.PruneIfName = true
			objs := cache.New()
			api.Put(fake.NewPool(pool, tc.rng, map[string]shim.IPAllocation{}))
			objs.SawPool(api.Pool(ns, pool))
			objs.Listed(ns)
			// Since the copy: another interface of the sandbox got .1 (and
			// another pod what else there is).
			p := api.Pool(ns, pool)
			p.Spec.Allocations = tc.other
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			api.Hook = func(c *fake.Call) error {
				if tc.cancel && c.Verb == "patch" && c.Resource == fake.Pools {
					cancel()
				}
				return nil
			}
			s := shim.New(cache.API{API: api, Objects: objs}, ns, shim.Options{Clock: quick{}, LeaseRetry: time.Millisecond})
			cp := checkpoint.Dir(t.TempDir())
			rec := checkpoint.Record{ContainerID: "c1", IfName: "lhnet2", PodRef: "longhorn-system/im-a", Network: "storagenetwork-b",
				Namespace: ns, Pools: []checkpoint.Pool{{Name: pool, Range: tc.rng}}}
			require.NoError(t, cp.Write(rec))
			d := alloc.Delegate{Batcher: alloc.New(alloc.Options{Rounds: tc.rounds}), Load: func([]byte, string) (*wbtypes.IPAMConfig, string, error) {
				return ipam(tc.rng), "0.3.1", nil
			}}
			cfg := &conf.Config{CNIVersion: "0.3.1", Options: conf.Options{CheckpointDir: string(cp)}}
			_, err = d.Add(ctx, s, cfg, &skel.CmdArgs{ContainerID: "c1", IfName: "lhnet2"})
			require.Error(t, err, "the member is answered with an error")
			got, ok, err := cp.Read("c1", "lhnet2")
			require.NoError(t, err)
			require.True(t, ok)
			assert.Empty(t, got.IPs, "nothing was written for lhnet2: .1, chosen on the stale copy, is lhnet1's")
			assert.Equal(t, tc.other, api.Pool(ns, pool).Spec.Allocations, "the pool as the other writer left it")
		})
	}
}

// The plugin asks the allocator again for the same ADD when a range finds
// an earlier sandbox of the pod that its reclaim's copy did not show
// (shim.ErrEarlierSandbox): on whereabouts v0.7.0's CRD the entry the first
// ask wrote in an earlier range has lost its ifname, and the second ask
// must know it by the address its record names, not allocate a second
// address beside it nor forget the first from the record (the simulation,
// seeds 13527 and 6018 on v0.7.0 with a dual-stack NAD).
func TestAnADDAskedAgainKeepsTheAddressItWroteWhenTheCRDPrunedItsIfName(t *testing.T) {
	api := fake.New()
	api.PruneIfName = true
	api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	cp := checkpoint.Dir(t.TempDir())
	rec := checkpoint.Record{ContainerID: "c1", IfName: "net1", PodRef: "longhorn-system/im-a", Network: "dualnetwork",
		Namespace: ns, Pools: []checkpoint.Pool{{Name: "10.0.0.0-24", Range: "10.0.0.0/24"}}}
	d := alloc.Delegate{Batcher: alloc.New(alloc.Options{}), Load: func([]byte, string) (*wbtypes.IPAMConfig, string, error) {
		return ipam("10.0.0.0/24"), "0.3.1", nil
	}}
	cfg := &conf.Config{CNIVersion: "0.3.1", Options: conf.Options{CheckpointDir: string(cp)}}
	args := &skel.CmdArgs{ContainerID: "c1", IfName: "net1"}
	for ask := 1; ask <= 2; ask++ {
		res, err := d.AddRecording(context.Background(), store(api), cfg, args, rec)
		require.NoError(t, err, "ask %d", ask)
		r, err := current.NewResultFromResult(res)
		require.NoError(t, err)
		require.Len(t, r.IPs, 1)
		assert.Equal(t, "10.0.0.1/24", r.IPs[0].Address.String(), "ask %d", ask)
	}
	assert.Equal(t, map[string]shim.IPAllocation{"1": {ContainerID: "c1", PodRef: "longhorn-system/im-a"}},
		api.Pool(ns, "10.0.0.0-24").Spec.Allocations, "one entry for the attachment")
	got, ok, err := cp.Read("c1", "net1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []string{"10.0.0.1/24"}, got.IPs, "the record names the address the pool holds")
}
