package shim_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/shim/names"
)

func TestPatchRemovalsCountsOnlyRemovals(t *testing.T) {
	p := shim.Guarded("7",
		shim.PatchOp{Op: "remove", Path: "/spec/allocations/4"},
		shim.PatchOp{Op: "add", Path: "/metadata/annotations/x", Value: "y"},
		shim.PatchOp{Op: "remove", Path: "/spec/allocations/5"})
	assert.Equal(t, 2, p.Removals())
	assert.Equal(t, 0, shim.Guarded("7").Removals())
}

func TestAllocationsAreSortedByAddress(t *testing.T) {
	as, err := shim.Allocations(pool("p", "10.0.0.0/16", map[string]alloc{
		"300": {ContainerID: "c"}, "9": {ContainerID: "a"}, "10": {ContainerID: "b"}, "256": {ContainerID: "d"}, "2": {ContainerID: "e"},
	}))
	require.NoError(t, err)
	var got []string
	for _, a := range as {
		got = append(got, a.IP.String())
	}
	assert.Equal(t, []string{"10.0.0.2", "10.0.0.9", "10.0.0.10", "10.0.1.0", "10.0.1.44"}, got)
	assert.Len(t, as[0].IP, 4, "an IPv4 address in its 4-byte form")
}

// manyOld is a pool of n entries of earlier sandboxes of ns/p, each with its
// reservation.
func manyOld(n int) []any {
	allocs := map[string]alloc{"1": {ContainerID: "current", PodRef: "ns/p", IfName: "eth1"}}
	var objs []any
	for i := 2; i < 2+n; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: "ns/p", IfName: "eth1"}
		objs = append(objs, orip(fmt.Sprintf("10.0.0.%d", i), "ns/p"))
	}
	return append(objs, pool("10.0.0.0-24", "10.0.0.0/24", allocs))
}

// Up to 20 planned entries, their reservations are looked up one by one
// before the Lease is taken; more are listed in one request.
func TestReservationsAreLookedUpOneByOneUpTo20(t *testing.T) {
	for _, tt := range []struct {
		entries, wantGets, wantLists int
	}{
		{20, 20 + 20, 0}, // each looked up before the Lease, then read again under it
		{21, 21, 1},
	} {
		t.Run(strconv.Itoa(tt.entries), func(t *testing.T) {
			s, api, _ := newStore(manyOld(tt.entries)...)
			gets, lists := 0, 0
			api.Hook = func(c *fake.Call) error {
				if c.Resource == fake.Reservations {
					switch c.Verb {
					case "get":
						gets++
					case "list":
						lists++
					}
				}
				return nil
			}
			removed, deleted := release(t, s, "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current"))
			assert.Len(t, removed, tt.entries)
			assert.Len(t, deleted, tt.entries)
			assert.Equal(t, tt.wantGets, gets)
			assert.Equal(t, tt.wantLists, lists)
		})
	}
}

// A failed release names the first eight addresses and counts the rest.
func TestAFailedReleaseNamesItsAddresses(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want string
	}{
		{8, "release 10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5, 10.0.0.6, 10.0.0.7, 10.0.0.8, 10.0.0.9 from pool kube-system/10.0.0.0-24"},
		// In the plan's order: by offset, as text.
		{10, "release 10.0.0.10, 10.0.0.11, 10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5, 10.0.0.6, 10.0.0.7, and 2 more from pool kube-system/10.0.0.0-24"},
	} {
		s, api, _ := newStore(manyOld(tt.n)...)
		plan, err := s.Plan(context.Background(), "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current"))
		require.NoError(t, err)
		api.Hook = func(c *fake.Call) error {
			if c.Verb == "patch" {
				return errors.New("etcdserver: request timed out")
			}
			return nil
		}
		_, err = s.RemoveAllocations(context.Background(), plan)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tt.want)
	}
}

func TestOwns(t *testing.T) {
	a := shim.Allocation{IPAllocation: alloc{ContainerID: "c1", PodRef: "ns/p"}}
	for _, tt := range []struct {
		podRef, container string
		want              bool
	}{
		{"ns/p", "", true},
		{"ns/p", "c1", true},
		{"ns/p", "c2", false},
		{"ns/q", "", false},
		{"ns/q", "c1", false},
	} {
		o := orip("10.0.0.1", tt.podRef)
		o.Spec.ContainerID = tt.container
		assert.Equal(t, tt.want, shim.Owns(o, a), "%+v", tt)
	}
}

// Holders indexes only the pools that may hold the network's reservations
// (in doubt, yes), and skips one it cannot read.
func TestHolders(t *testing.T) {
	pools := []shim.Pool{
		*pool("10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"4": {ContainerID: "a", PodRef: "ns/a"}}),
		*pool("blue-10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"5": {ContainerID: "b", PodRef: "ns/b"}}),
		*pool("red-10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"6": {ContainerID: "r", PodRef: "ns/r"}}),
		*pool("10.0.1.0-24", "10.0.1.0/24", map[string]alloc{"x": {ContainerID: "c", PodRef: "ns/c"}}), // unreadable
	}
	h := shim.Holders(pools, "")
	assert.Len(t, h, 3, "the unnamed network: any pool may hold its addresses")
	h = shim.Holders(pools, "blue")
	require.Len(t, h, 1, "blue's pool only")
	held := h[names.Reservation(net.ParseIP("10.0.0.5"), "blue")]
	require.Len(t, held, 1)
	assert.Equal(t, "ns/b", held[0].PodRef)
}

// A reservation that changes under every delete is read and judged again,
// Backoff.Steps times, then given up with an error that says so.
func TestAReservationThatKeepsChangingIsGivenUp(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	deletes := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "delete" && c.Resource == fake.Reservations {
			deletes++
			if deletes > 100 {
				return errors.New("a loop that never ends") // fail now, not at the test binary's timeout
			}
			return apierrors.NewConflict(schema.GroupResource{Resource: "overlappingrangeipreservations"}, c.Name, errors.New("changed"))
		}
		return nil
	}
	plan, err := s.Plan(context.Background(), storage, "", shim.Attachment("old1", "lhnet1", nil))
	require.NoError(t, err)
	_, err = s.ReleaseReservations(context.Background(), plan)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "delete reservation kube-system/192.168.50.4: it kept changing under 4 attempts")
	assert.Equal(t, 4, deletes)
	assert.EqualValues(t, 3, s.Retried())
	assert.Contains(t, reservations(api), "192.168.50.4")
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "the Lease is handed back")
}

// Under the Lease, a request is made only while the Lease is ours: it is
// renewed once held 1.5 s; a renewal that fails is forgiven within 3 s of
// the last good write, unless the Lease was taken (409).
func TestTheLeaseIsKept(t *testing.T) {
	timeout := errors.New("etcdserver: request timed out")
	taken := apierrors.NewConflict(schema.GroupResource{Resource: "leases"}, names.Lease, errors.New("modified"))
	for _, tt := range []struct {
		name       string
		after      time.Duration // the clock moves on by this before the request
		renewErr   error
		wantUpdate bool // a renewal was sent
		wantErr    string
	}{
		{"held 1.499 s: no renewal", 1499 * time.Millisecond, nil, false, ""},
		{"held 1.5 s: renewed", 1500 * time.Millisecond, nil, true, ""},
		{"renewal fails within 3 s: still ours", 2999 * time.Millisecond, timeout, true, ""},
		{"renewal fails at 3 s: lost", 3 * time.Second, timeout, true, "renew lease kube-system/whereabouts: etcdserver: request timed out"},
		{"taken by another: lost at once", 1500 * time.Millisecond, taken, true, "renew lease kube-system/whereabouts"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, c := newStore(storageNetwork()...)
			updates := 0
			err := s.Locked(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				c.now = c.now.Add(tt.after)
				api.Hook = func(call *fake.Call) error {
					if call.Resource == fake.Leases && call.Verb == "update" {
						updates++
						return tt.renewErr
					}
					return nil
				}
				defer func() { api.Hook = nil }()
				o, err := l.Reservation(ctx, "192.168.50.4")
				if err == nil {
					assert.NotNil(t, o)
				}
				return err
			})
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
			}
			assert.Equal(t, tt.wantUpdate, updates > 0, "renewal sent")
			if tt.wantUpdate && tt.renewErr == nil {
				l := api.Lease(ns, names.Lease)
				assert.Equal(t, "", *l.Spec.HolderIdentity, "handed back after")
				assert.Equal(t, c.now, l.Spec.RenewTime.Time.UTC())
			}
		})
	}
}

// Under the Lease, the pools are listed once to judge every candidate
// reservation of a release, and again only for one that changed under its
// delete.
func TestThePoolsAreListedOnceUnderTheLease(t *testing.T) {
	s, api, _ := newStore(manyOld(5)...)
	lists := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "list" && c.Resource == fake.Pools {
			lists++
		}
		return nil
	}
	plan, err := s.Plan(context.Background(), "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current"))
	require.NoError(t, err)
	deleted, err := s.ReleaseReservations(context.Background(), plan)
	require.NoError(t, err)
	assert.Len(t, deleted, 5)
	assert.Equal(t, 1, lists)
}

func TestPlanEmpty(t *testing.T) {
	assert.True(t, shim.Plan{Pool: "p"}.Empty())
	assert.False(t, shim.Plan{Pool: "p", Entries: []shim.Allocation{{Offset: "1"}}}.Empty())
}

// A release reads the pool fresh once for each patch of at most 1000
// removals, and no more.
func TestEachChunkOfARemovalReadsThePoolOnce(t *testing.T) {
	for _, n := range []int{1, 1000, 1001} {
		allocs := map[string]alloc{}
		for i := 0; i < n; i++ {
			allocs[strconv.Itoa(2+i)] = alloc{ContainerID: "old", PodRef: "ns/p"}
		}
		s, api, _ := newStore(pool("10.0.0.0-16", "10.0.0.0/16", allocs))
		plan, err := s.Plan(context.Background(), "10.0.0.0-16", "", shim.EarlierSandboxes("ns/p", "new"))
		require.NoError(t, err)
		gets, patches := 0, 0
		api.Hook = func(c *fake.Call) error {
			switch {
			case c.Verb == "get" && c.Resource == fake.Pools:
				gets++
			case c.Verb == "patch":
				patches++
			}
			return nil
		}
		removed, err := s.RemoveAllocations(context.Background(), plan)
		require.NoError(t, err)
		assert.Len(t, removed, n)
		want := (n + 999) / 1000
		assert.Equal(t, want, patches, "%d entries", n)
		assert.Equal(t, want, gets, "%d entries", n)
	}
}
