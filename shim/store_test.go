package shim_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

const ns = "kube-system"

type alloc = whereaboutsv1alpha1.IPAllocation

const storage = "192.168.50.0-24"

// storageNetwork is a pool as Longhorn pods leave it after crash loops.
func storageNetwork() []any {
	return []any{
		fake.NewPool(storage, "192.168.50.0/24", map[string]alloc{
			"3": {ContainerID: "current", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"5": {ContainerID: "old2", PodRef: "longhorn-system/im-a"},                   // written before v0.8: no ifname
			"6": {ContainerID: "old3", PodRef: "longhorn-system/im-a", IfName: "lhnet9"}, // the ifname changed since
			"7": {ContainerID: "other", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
			"8": {ContainerID: "old1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}, // same ID, another pod
		}),
		fake.NewReservation("192.168.50.3", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.4", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.5", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.6", "longhorn-system/im-b"), // a reservation of another pod: stays
		fake.NewReservation("192.168.50.7", "longhorn-system/im-b"),
		fake.NewReservation("192.168.50.8", "longhorn-system/im-b"),
	}
}

// clock is a test clock: Sleep moves it on at once.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }
func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.now = c.now.Add(d)
	return runaway(c.now)
}

// testEpoch is when every test clock starts.
var testEpoch = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// runaway fails a wait that takes a test clock a day past its start: no test
// waits that long, so a loop that waits for ever (a planted bug, say) fails
// at once instead of hanging until the test binary's timeout.
func runaway(now time.Time) error {
	if now.Sub(testEpoch) > 24*time.Hour {
		return errors.New("test clock: waited more than a day: a loop that never ends")
	}
	return nil
}

// recClock records the waits; Sleep moves it on at once, or fails as a
// cancelled context does when err is set.
type recClock struct {
	now   time.Time
	waits []time.Duration
	err   error
}

func (c *recClock) Now() time.Time { return c.now }
func (c *recClock) Sleep(_ context.Context, d time.Duration) error {
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	if c.err != nil {
		return c.err
	}
	if len(c.waits) > 100000 {
		return errors.New("test clock: a loop that never ends")
	}
	return nil
}

func newStore(objs ...any) (*shim.Store, *fake.API, *clock) {
	api := fake.New()
	api.Put(objs...)
	c := &clock{now: testEpoch}
	s := shim.New(api, ns, shim.Options{
		Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2, Jitter: 1}, Clock: c,
		Random: func() float64 { return 0.5 }, Identity: "harvester-ipam/test",
	})
	return s, api, c
}

func offsets(t *testing.T, api *fake.API, name string) []string {
	t.Helper()
	p := api.Pool(ns, name)
	require.NotNil(t, p)
	require.NotNil(t, p.Spec.Allocations, "spec.allocations must never be written as null")
	var out []string
	for off := range p.Spec.Allocations {
		out = append(out, off)
	}
	sort.Strings(out)
	return out
}

func reservations(api *fake.API) []string {
	var out []string
	for _, o := range api.AllReservations(ns) {
		out = append(out, o.Name)
	}
	return out
}

func ipsOf(as []shim.Allocation) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.IP.String())
	}
	sort.Strings(out)
	return out
}

// release plans, then runs the two steps, as the plugin does.
func release(t *testing.T, s *shim.Store, poolName, network string, pick shim.Picker) ([]shim.Allocation, []string) {
	t.Helper()
	ctx := context.Background()
	plan, err := s.Plan(ctx, poolName, network, pick)
	require.NoError(t, err)
	deleted, err := s.ReleaseReservations(ctx, plan)
	require.NoError(t, err)
	removed, err := s.RemoveAllocations(ctx, plan)
	require.NoError(t, err)
	return removed, deleted
}

// spyAPI is the fake API server, and what each request asked for.
type spyAPI struct {
	*fake.API
	deadlines []time.Duration // how long each pool GET was given
	limits    []int64         // the page size of each pool LIST
}

func (s *spyAPI) GetPool(ctx context.Context, namespace, name string, from shim.Source) (*shim.Pool, error) {
	if d, ok := ctx.Deadline(); ok {
		s.deadlines = append(s.deadlines, time.Until(d))
	} else {
		s.deadlines = append(s.deadlines, 0)
	}
	return s.API.GetPool(ctx, namespace, name, from)
}

func (s *spyAPI) ListPools(ctx context.Context, namespace string, page shim.Page) ([]shim.Pool, string, error) {
	s.limits = append(s.limits, page.Limit)
	return s.API.ListPools(ctx, namespace, page)
}

func conflictOnPatch(api *fake.API) *int {
	patches := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" {
			patches++
			return apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, storage, errors.New("modified"))
		}
		return nil
	}
	return &patches
}

// manyOld is a pool of n entries of earlier sandboxes of ns/p, each with its
// reservation.
func manyOld(n int) []any {
	allocs := map[string]alloc{"1": {ContainerID: "current", PodRef: "ns/p", IfName: "eth1"}}
	var objs []any
	for i := 2; i < 2+n; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: "ns/p", IfName: "eth1"}
		objs = append(objs, fake.NewReservation(fmt.Sprintf("10.0.0.%d", i), "ns/p"))
	}
	return append(objs, fake.NewPool("10.0.0.0-24", "10.0.0.0/24", allocs))
}

func TestRelease(t *testing.T) {
	ip := func(s string) []net.IP { return []net.IP{net.ParseIP(s)} }
	for _, tt := range []struct {
		name        string
		pick        shim.Picker
		wantRemoved []string
		wantDeleted []string
		wantPool    []string
	}{{
		name: "earlier sandboxes of the pod, any ifname, an empty one too",
		pick: shim.EarlierSandboxes("longhorn-system/im-a", "current", ""),
		// .3 is the current sandbox's; .7 and .8 are another pod's, even with the ID old1;
		// .6's reservation is another pod's.
		wantRemoved: []string{"192.168.50.4", "192.168.50.5", "192.168.50.6"},
		wantDeleted: []string{"192.168.50.4", "192.168.50.5"},
		wantPool:    []string{"3", "7", "8"},
	}, {
		name:     "the current sandbox is never its own earlier sandbox",
		pick:     shim.EarlierSandboxes("longhorn-system/im-c", "current", ""),
		wantPool: []string{"3", "4", "5", "6", "7", "8"},
	}, {
		name:        "one attachment, by ifname",
		pick:        shim.Attachment("old1", "lhnet1", nil, nil),
		wantRemoved: []string{"192.168.50.4", "192.168.50.8"},
		wantDeleted: []string{"192.168.50.4", "192.168.50.8"},
		wantPool:    []string{"3", "5", "6", "7"},
	}, {
		name:        "one attachment without ifname, by the address its checkpoint recorded",
		pick:        shim.Attachment("old2", "lhnet1", ip("192.168.50.5"), nil),
		wantRemoved: []string{"192.168.50.5"},
		wantDeleted: []string{"192.168.50.5"},
		wantPool:    []string{"3", "4", "6", "7", "8"},
	}, {
		name:     "a recorded address the container no longer holds",
		pick:     shim.Attachment("old2", "lhnet1", ip("192.168.50.9"), nil),
		wantPool: []string{"3", "4", "5", "6", "7", "8"},
	}, {
		name:     "an entry without ifname that nothing recorded as the attachment's",
		pick:     shim.Attachment("old2", "lhnet1", nil, nil),
		wantPool: []string{"3", "4", "5", "6", "7", "8"},
	}, {
		name:     "an attachment never seen releases nothing",
		pick:     shim.Attachment("never", "lhnet1", nil, nil),
		wantPool: []string{"3", "4", "5", "6", "7", "8"},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(storageNetwork()...)
			removed, deleted := release(t, s, storage, "", tt.pick)
			assert.Equal(t, tt.wantRemoved, ipsOf(removed))
			assert.Equal(t, tt.wantDeleted, deleted)
			assert.Equal(t, tt.wantPool, offsets(t, api, storage))
			for _, name := range tt.wantDeleted {
				assert.NotContains(t, reservations(api), name)
			}
			assert.Len(t, reservations(api), 6-len(tt.wantDeleted), "nothing else deleted")
		})
	}
}

func TestReleaseEverythingLeavesAnEmptyMap(t *testing.T) {
	s, api, _ := newStore(fake.NewPool("10.0.0.0-30", "10.0.0.0/30", map[string]alloc{"1": {ContainerID: "a", PodRef: "ns/p", IfName: "eth1"}}))
	removed, _ := release(t, s, "10.0.0.0-30", "", shim.EarlierSandboxes("ns/p", "b", ""))
	assert.Equal(t, []string{"10.0.0.1"}, ipsOf(removed))
	assert.Empty(t, offsets(t, api, "10.0.0.0-30")) // and not null: checked inside
}

func TestPoolWritesAreGuardedPatches(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	var sent []shim.Patch
	var rvs []string
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" {
			sent = append(sent, c.Patch)
			rvs = append(rvs, api.Pool(ns, storage).ResourceVersion)
		}
		return nil
	}
	release(t, s, storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, s.SetPoolAnnotation(context.Background(), storage, "a/b", func(*shim.Pool) string { return "c" }))
	require.Len(t, sent, 2)
	assert.Equal(t, []shim.PatchOp{
		{Op: "test", Path: "/metadata/resourceVersion", Value: rvs[0]},
		{Op: "remove", Path: "/spec/allocations/4"}, {Op: "remove", Path: "/spec/allocations/8"},
	}, sent[0].Ops())
	assert.Equal(t, []shim.PatchOp{
		{Op: "test", Path: "/metadata/resourceVersion", Value: rvs[1]},
		{Op: "add", Path: "/metadata/annotations", Value: map[string]string{"a/b": "c"}},
	}, sent[1].Ops())
	assert.Equal(t, []string{"3", "5", "6", "7"}, offsets(t, api, storage))
}

// Another writer changes the pool between our read and our write: the patch's
// test fails (422) or the server says 409; we read again and retry, bounded.
func TestRemoveRetriesConflicts(t *testing.T) {
	gr := schema.GroupResource{Group: "whereabouts.cni.cncf.io", Resource: "ippools"}
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"409 conflict", apierrors.NewConflict(gr, storage, errors.New("the object has been modified"))},
		{"422 failed resourceVersion test", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "IPPool"}, storage, nil)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(storageNetwork()...)
			gets, patches := 0, 0
			api.Hook = func(c *fake.Call) error {
				if c.Resource != fake.Pools {
					return nil
				}
				switch c.Verb {
				case "get":
					gets++
				case "patch":
					patches++
					if patches <= 2 {
						return tt.err
					}
				}
				return nil
			}
			plan, err := s.Plan(context.Background(), storage, "", shim.EarlierSandboxes("longhorn-system/im-a", "current", ""))
			require.NoError(t, err)
			removed, err := s.RemoveAllocations(context.Background(), plan)
			require.NoError(t, err)
			assert.Equal(t, []string{"192.168.50.4", "192.168.50.5", "192.168.50.6"}, ipsOf(removed))
			assert.Equal(t, []string{"3", "7", "8"}, offsets(t, api, storage))
			assert.Equal(t, 3, patches)
			assert.Equal(t, 3, gets, "the plan's read, written on first, then a fresh read for every attempt after a conflict")
			assert.EqualValues(t, 2, s.Retried())
		})
	}
}

// Between the plan and the write, whereabouts v0.8 hands the old sandbox's
// entry to a new sandbox of the pod: that entry is the new sandbox's now.
func TestRemoveKeepsAnEntryThatChangedHands(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	plan, err := s.Plan(context.Background(), storage, "", shim.EarlierSandboxes("longhorn-system/im-a", "current", ""))
	require.NoError(t, err)
	p := api.Pool(ns, storage)
	p.Spec.Allocations["4"] = alloc{ContainerID: "newer", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
	_, err = api.UpdatePool(ns, p)
	require.NoError(t, err)
	removed, err := s.RemoveAllocations(context.Background(), plan)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.5", "192.168.50.6"}, ipsOf(removed))
	assert.Equal(t, []string{"3", "4", "7", "8"}, offsets(t, api, storage))
}

func TestRemoveGivesUpAfterBoundedRetries(t *testing.T) {
	s, api, c := newStore(storageNetwork()...)
	start := c.now
	patches := 0
	api.Hook = func(call *fake.Call) error {
		if call.Verb == "patch" {
			patches++
			return apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, storage, errors.New("modified"))
		}
		return nil
	}
	plan, err := s.Plan(context.Background(), storage, "", shim.EarlierSandboxes("longhorn-system/im-a", "current", ""))
	require.NoError(t, err)
	_, err = s.RemoveAllocations(context.Background(), plan)
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "the last error is returned: %v", err)
	assert.Contains(t, err.Error(), "release 192.168.50.4, 192.168.50.5, 192.168.50.6 from pool kube-system/192.168.50.0-24")
	assert.Equal(t, 4, patches, "the plan's read counts as the first attempt")
	assert.Equal(t, 3*time.Millisecond+6*time.Millisecond, c.now.Sub(start), "the plan's read, stale, is read again at once; then backoff 2, 4 ms, each stretched by a jitter of half itself")
	assert.Equal(t, []string{"3", "4", "5", "6", "7", "8"}, offsets(t, api, storage))
}

func TestAPoolThatDoesNotExistHoldsNothing(t *testing.T) {
	s, _, _ := newStore()
	removed, deleted := release(t, s, storage, "", shim.Attachment("a", "eth1", nil, nil))
	assert.Empty(t, removed)
	assert.Empty(t, deleted)
	p, err := s.Pool(context.Background(), storage)
	require.NoError(t, err)
	assert.Nil(t, p)
}

func TestPoolDeletedUnderTheWrite(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	plan, err := s.Plan(context.Background(), storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" {
			api.Remove(fake.Pools, ns, storage)
		}
		return nil
	}
	removed, err := s.RemoveAllocations(context.Background(), plan)
	require.NoError(t, err)
	assert.Empty(t, removed)
}

func TestAnUnreachableStoreSaysSo(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	api.Hook = func(*fake.Call) error { return errors.New("dial tcp 127.0.0.1:6443: connect: connection refused") }
	_, err := s.Plan(context.Background(), storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "get pool kube-system/192.168.50.0-24")
	assert.Contains(t, err.Error(), "connection refused")
	for _, f := range []func() error{
		func() error { _, err := s.Pools(context.Background()); return err },
		func() error { _, err := s.Reservations(context.Background()); return err },
		func() error { _, err := s.Reservation(context.Background(), "x"); return err },
		func() error { _, err := s.CachedPool(context.Background(), storage); return err },
		func() error { return s.Ping(context.Background()) },
	} {
		assert.ErrorContains(t, f(), "connection refused")
	}
}

// The reservation of a released address stays while another entry gives the
// address to the same pod: a new sandbox took it again, or another attachment
// in an overlapping range of the same network (hole 3). Judged again, whole,
// when it changed under the delete.
func TestReservationsStayWhileThePodHoldsTheAddress(t *testing.T) {
	for _, tt := range []struct {
		name       string
		extra      []any
		network    string
		meanwhile  func(t *testing.T, api *fake.API)
		underDel   func(t *testing.T, api *fake.API) // runs at the first delete of .4, which then fails with 409
		wantKept   bool
		wantDelete int
	}{{
		name: "a new sandbox of the pod took the address before the judgement",
		meanwhile: func(t *testing.T, api *fake.API) {
			p := api.Pool(ns, storage)
			p.Spec.Allocations["4"] = alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
		},
		wantKept: true,
	}, {
		name: "recreated for the same pod under the delete: judged again",
		underDel: func(t *testing.T, api *fake.API) {
			p := api.Pool(ns, storage)
			p.Spec.Allocations["4"] = alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
			api.Remove(fake.Reservations, ns, "192.168.50.4")
			_, err = api.CreateReservation(context.Background(), ns, fake.NewReservation("192.168.50.4", "longhorn-system/im-a"))
			require.NoError(t, err)
		},
		wantKept: true, wantDelete: 1,
	}, {
		name: "recreated for another pod under the delete: not ours any more",
		underDel: func(t *testing.T, api *fake.API) {
			api.Remove(fake.Reservations, ns, "192.168.50.4")
			_, err := api.CreateReservation(context.Background(), ns, fake.NewReservation("192.168.50.4", "longhorn-system/im-z"))
			require.NoError(t, err)
		},
		wantKept: true, wantDelete: 1,
	}, {
		name: "held for the pod in another pool of the network (an overlapping range)",
		extra: []any{fake.NewPool("192.168.50.0-25", "192.168.50.0/25", map[string]alloc{
			"4": {ContainerID: "other-attachment", PodRef: "longhorn-system/im-a", IfName: "lhnet2"},
		})},
		wantKept: true,
	}, {
		name:    "held for the pod in a node slice of the network",
		network: "blue",
		extra: []any{
			fake.NewPool("blue-"+storage, "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}),
			fake.NewPool("blue-node-1-192.168.50.0-26", "192.168.50.0/26", map[string]alloc{"4": {ContainerID: "x", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}),
			fake.NewReservation("blue-192.168.50.4", "longhorn-system/im-a"),
		},
		wantKept: true,
	}, {
		name:    "held in a pool of another network: not the same reservation",
		network: "blue",
		extra: []any{
			fake.NewPool("blue-"+storage, "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}),
			fake.NewPool("green-"+storage, "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "x", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}),
			fake.NewReservation("blue-192.168.50.4", "longhorn-system/im-a"),
		},
		wantKept: false, wantDelete: 1,
	}, {
		name: "held for the pod in a pool of a node slice of an unnamed network: in doubt, kept",
		extra: []any{fake.NewPool("node-1-192.168.50.0-26", "192.168.50.0/26", map[string]alloc{
			"4": {ContainerID: "x", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		})},
		wantKept: true,
	}, {
		name:     "held for another pod elsewhere: the reservation is still ours to free",
		extra:    []any{fake.NewPool("192.168.50.0-25", "192.168.50.0/25", map[string]alloc{"4": {ContainerID: "y", PodRef: "longhorn-system/im-z"}})},
		wantKept: false, wantDelete: 1,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(append(storageNetwork(), tt.extra...)...)
			poolName, reservation := storage, "192.168.50.4"
			if tt.network != "" {
				poolName, reservation = tt.network+"-"+storage, tt.network+"-192.168.50.4"
			}
			plan, err := s.Plan(context.Background(), poolName, tt.network, shim.Exactly(map[string]alloc{"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}))
			require.NoError(t, err)
			require.Len(t, plan.Entries, 1)
			if tt.meanwhile != nil {
				tt.meanwhile(t, api)
			}
			deletes := 0
			api.Hook = func(c *fake.Call) error {
				if c.Verb == "delete" && c.Name == reservation {
					deletes++
					if deletes == 1 && tt.underDel != nil {
						tt.underDel(t, api)
					}
				}
				return nil
			}
			_, err = s.ReleaseReservations(context.Background(), plan)
			require.NoError(t, err)
			if tt.wantKept {
				assert.Contains(t, reservations(api), reservation)
			} else {
				assert.NotContains(t, reservations(api), reservation)
			}
			assert.Equal(t, tt.wantDelete, deletes, "deletes sent")
		})
	}
}

// whereabouts v0.8.0 and later hand a pod's entry on an interface to its
// next sandbox and keep its reservation as it is: one the node agent wrote
// names the earlier container. The new sandbox's DEL releases the entry and
// the reservation with it (the pod's, held by no other entry of the pod), or
// the reservation stays with no entry (TestAPIServerRestartDuringAStorm on
// the agent, with the hand-over: "reservation ... has no allocation").
func TestAReservationNamingAnEarlierSandboxGoesWithThePodsLastEntry(t *testing.T) {
	old := fake.NewReservation("192.168.50.4", "longhorn-system/im-a")
	old.Spec.ContainerID = "earlier"
	s, api, _ := newStore(fake.NewPool(storage, "192.168.50.0/24", map[string]alloc{
		"4": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}), old)
	removed, deleted := release(t, s, storage, "", shim.Attachment("new", "lhnet1", nil, nil))
	assert.Len(t, removed, 1)
	assert.Equal(t, []string{"192.168.50.4"}, deleted)
	assert.NotContains(t, reservations(api), "192.168.50.4")
}

// Whereabouts' own DEL deleted the reservation already: nothing to judge, and
// no Lease is taken (whereabouts waits for nobody).
func TestNoLeaseWithoutAReservationToJudge(t *testing.T) {
	s, api, _ := newStore(fake.NewPool(storage, "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "old1", PodRef: "ns/p", IfName: "eth1"}}))
	var calls []string
	api.Hook = func(c *fake.Call) error { calls = append(calls, c.Verb+" "+c.Resource+" "+c.Name); return nil }
	removed, deleted := release(t, s, storage, "", shim.Attachment("old1", "eth1", nil, nil))
	assert.Len(t, removed, 1)
	assert.Empty(t, deleted)
	assert.Equal(t, []string{
		"get ippools " + storage, "get overlappingrangeipreservations 192.168.50.4",
		"patch ippools " + storage, // on the plan's read
	}, calls)
	assert.Nil(t, api.Lease(ns, names.Lease))
}

// Many releases: the reservations are listed once, not read one by one, and
// the pool is written in patches the API server takes.
func TestManyReleases(t *testing.T) {
	allocs := map[string]alloc{"1": {ContainerID: "current", PodRef: "ns/p", IfName: "eth1"}}
	var objs []any
	for i := 2; i < 2502; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: "ns/p", IfName: "eth1"}
		if i%100 == 0 {
			ip, _ := shim.OffsetIP(net.ParseIP("10.0.0.0"), strconv.Itoa(i))
			objs = append(objs, fake.NewReservation(names.Reservation(ip, ""), "ns/p"))
		}
	}
	objs = append(objs, fake.NewPool("10.0.0.0-16", "10.0.0.0/16", allocs))
	s, api, _ := newStore(objs...)
	var sizes []int
	gets := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" {
			p := api.Pool(ns, "10.0.0.0-16")
			sizes = append(sizes, len(p.Spec.Allocations))
		}
		if c.Verb == "get" && c.Resource == fake.Reservations {
			gets++
		}
		return nil
	}
	removed, deleted := release(t, s, "10.0.0.0-16", "", shim.EarlierSandboxes("ns/p", "current", ""))
	assert.Len(t, removed, 2500)
	assert.Len(t, deleted, 25)
	assert.Equal(t, []int{2501, 1501, 501}, sizes, "patches of at most 1000 removals")
	assert.Equal(t, []string{"1"}, offsets(t, api, "10.0.0.0-16"))
	assert.Equal(t, 0, gets, "listed once before the Lease, and deleted as listed (the delete's preconditions)")
}

func TestSetPoolAnnotation(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	ctx := context.Background()
	set := func(v string) {
		require.NoError(t, s.SetPoolAnnotation(ctx, storage, "x/y", func(*shim.Pool) string { return v }))
	}
	set("1")
	assert.Equal(t, "1", api.Pool(ns, storage).Annotations["x/y"])
	rv := api.Pool(ns, storage).ResourceVersion
	set("1")
	assert.Equal(t, rv, api.Pool(ns, storage).ResourceVersion, "no write when nothing changes")
	set("2")
	assert.Equal(t, "2", api.Pool(ns, storage).Annotations["x/y"])
	// Another annotation beside the one there: both kept.
	require.NoError(t, s.SetPoolAnnotation(ctx, storage, "x/z", func(*shim.Pool) string { return "3" }))
	assert.Equal(t, map[string]string{"x/y": "2", "x/z": "3"}, api.Pool(ns, storage).Annotations)
	require.NoError(t, s.SetPoolAnnotation(ctx, storage, "x/z", func(*shim.Pool) string { return "" }))
	set("")
	assert.NotContains(t, api.Pool(ns, storage).Annotations, "x/y")
	set("")

	// Raced: the value is computed again from the fresh read.
	races := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && races == 0 {
			races++
			p := api.Pool(ns, storage)
			p.Spec.Allocations["9"] = alloc{ContainerID: "z", PodRef: "ns/z"}
			_, err := api.UpdatePool(ns, p)
			require.NoError(t, err)
		}
		return nil
	}
	require.NoError(t, s.SetPoolAnnotation(ctx, storage, "x/n", func(p *shim.Pool) string { return strconv.Itoa(len(p.Spec.Allocations)) }))
	assert.Equal(t, "7", api.Pool(ns, storage).Annotations["x/n"])
	assert.EqualValues(t, 1, s.Retried())
	require.NoError(t, s.SetPoolAnnotation(ctx, "missing", "x/n", func(*shim.Pool) string { return "1" }))
}

func TestMarkReservationIsGuarded(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	ctx := context.Background()
	o, err := s.Reservation(ctx, "192.168.50.4")
	require.NoError(t, err)
	ok, err := s.MarkReservation(ctx, o, "x/since", "t0")
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = s.MarkReservation(ctx, o, "x/since", "t1")
	require.NoError(t, err)
	assert.False(t, ok, "changed since it was read: left alone")
	o, _ = s.Reservation(ctx, "192.168.50.4")
	assert.Equal(t, "t0", o.Annotations["x/since"])
	ok, err = s.MarkReservation(ctx, o, "x/since", "")
	require.NoError(t, err)
	assert.True(t, ok)
	o, _ = s.Reservation(ctx, "192.168.50.4")
	assert.NotContains(t, o.Annotations, "x/since")
	ok, err = s.MarkReservation(ctx, o, "x/since", "")
	require.NoError(t, err)
	assert.True(t, ok, "nothing to remove")
	api.Remove(fake.Reservations, ns, "192.168.50.4")
	ok, err = s.MarkReservation(ctx, o, "x/since", "t2")
	require.NoError(t, err)
	assert.False(t, ok, "gone")
}

func TestReadsArePaged(t *testing.T) {
	var objs []any
	for i := 0; i < 7; i++ {
		objs = append(objs, fake.NewPool(fmt.Sprintf("p%d", i), "10.0.0.0/24", map[string]alloc{}), fake.NewReservation(fmt.Sprintf("10.0.0.%d", i), "ns/p"))
	}
	api := fake.New()
	api.Put(objs...)
	for _, tt := range []struct {
		pageSize int64
		lists    int
	}{
		{3, 6}, // three pages each
		{1, 14},
		{0, 2}, // the default, 500
	} {
		s := shim.New(api, ns, shim.Options{PageSize: tt.pageSize})
		lists := 0
		api.Hook = func(c *fake.Call) error {
			if c.Verb == "list" {
				lists++
			}
			return nil
		}
		ps, err := s.Pools(context.Background())
		require.NoError(t, err)
		assert.Len(t, ps, 7)
		os, err := s.Reservations(context.Background())
		require.NoError(t, err)
		assert.Len(t, os, 7)
		assert.Equal(t, tt.lists, lists, "pages of %d", tt.pageSize)
	}

	_, err := shim.ListAll(context.Background(), 1, func(_ context.Context, p shim.Page) ([]int, string, error) {
		return []int{1}, "stuck", nil
	})
	assert.ErrorContains(t, err, "did not advance")
}

func TestInSharesOptionsAndCounts(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	assert.Same(t, s, s.In(""))
	assert.Same(t, s, s.In(ns))
	o := s.In("harvester-system")
	assert.Equal(t, "harvester-system", o.Namespace())
	api.Put(fake.NewPool(storage, "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "a", PodRef: "ns/p"}}))
	other := api.Pool(ns, storage)
	other.Namespace = "harvester-system"
	api.Put(other)
	patches := 0
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" {
			patches++
			if patches == 1 {
				return apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, storage, errors.New("x"))
			}
		}
		return nil
	}
	_, err := o.RemoveAllocations(context.Background(), shim.Plan{Pool: storage, Entries: []shim.Allocation{{Pool: storage, Offset: "4", IP: net.ParseIP("192.168.50.4"), IPAllocation: alloc{ContainerID: "a", PodRef: "ns/p"}}}})
	require.NoError(t, err)
	assert.EqualValues(t, 1, s.Retried(), "a retry in another namespace counts in the store's log")
}

// A pool is deleted only as it was judged: the delete carries the UID and
// resourceVersion of the fresh read the judgement saw, so a pool written in
// between (an ADD took an address) or deleted and created again stays, and
// the caller judges it again next time. A 409 is not an error, nor retried.
func TestDeletePoolIsGuarded(t *testing.T) {
	const name = "old-10.9.0.0-24"
	empty := func() *shim.Pool { return fake.NewPool(name, "10.9.0.0/24", map[string]alloc{}) }
	tests := []struct {
		name        string
		mayGo       bool
		between     func(api *fake.API) // after the judgement, as the delete is sent
		fail        error
		wantDeleted bool
		wantErr     string
		wantLeft    bool
		wantDeletes int
	}{
		{name: "judged and unchanged", mayGo: true, wantDeleted: true, wantDeletes: 1},
		{name: "judged to stay", mayGo: false, wantLeft: true},
		{name: "written in between", mayGo: true, wantLeft: true, wantDeletes: 1, between: func(api *fake.API) {
			p := api.Pool(ns, name)
			p.Spec.Allocations["4"] = alloc{ContainerID: "new", PodRef: "longhorn-system/im-new", IfName: "lhnet1"}
			if _, err := api.UpdatePool(ns, p); err != nil {
				panic(err)
			}
		}},
		{name: "deleted and created again in between", mayGo: true, wantLeft: true, wantDeletes: 1, between: func(api *fake.API) {
			api.Remove(fake.Pools, ns, name)
			api.Put(empty())
		}},
		{name: "already gone", mayGo: true, wantDeletes: 1, between: func(api *fake.API) { api.Remove(fake.Pools, ns, name) }},
		{name: "the API server fails", mayGo: true, fail: errors.New("connection refused"), wantErr: "delete pool kube-system/" + name + ": connection refused", wantLeft: true, wantDeletes: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(empty())
			deletes := 0
			api.Hook = func(c *fake.Call) error {
				if c.Verb != "delete" || c.Resource != fake.Pools {
					return nil
				}
				deletes++
				if tt.between != nil {
					tt.between(api)
				}
				return tt.fail
			}
			deleted, err := s.DeletePool(context.Background(), name, func(p *shim.Pool) bool {
				assert.NotEmpty(t, p.ResourceVersion, "judged on a read")
				return tt.mayGo
			})
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.wantDeleted, deleted)
			assert.Equal(t, tt.wantLeft, api.Pool(ns, name) != nil)
			assert.Equal(t, tt.wantDeletes, deletes, "one delete at most, never retried")
		})
	}
}

// The zero Options are the documented defaults: 10 s a request, pages of
// 500, this process's identity on a Lease of 5 s.
func TestTheDefaults(t *testing.T) {
	api := &spyAPI{API: fake.New()}
	api.Put(storageNetwork()...)
	s := shim.New(api, ns, shim.Options{})
	_, err := s.Pool(context.Background(), storage)
	require.NoError(t, err)
	require.Len(t, api.deadlines, 1)
	assert.InDelta(t, float64(10*time.Second), float64(api.deadlines[0]), float64(time.Second), "a request's timeout")
	_, err = s.Pools(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{500}, api.limits, "a page")

	host, _ := os.Hostname()
	var during shim.Lease
	require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
		during = *api.Lease(ns, names.Lease)
		return nil
	}))
	assert.Equal(t, fmt.Sprintf("harvester-ipam/%s/%d", host, os.Getpid()), *during.Spec.HolderIdentity)
	assert.EqualValues(t, 5, *during.Spec.LeaseDurationSeconds)
	after := api.Lease(ns, names.Lease)
	assert.Equal(t, "", *after.Spec.HolderIdentity, "handed back")
	assert.EqualValues(t, 1, *after.Spec.LeaseDurationSeconds)

	// Options of its own are kept.
	api.deadlines, api.limits = nil, nil
	s = shim.New(api, ns, shim.Options{CallTimeout: time.Minute, PageSize: 2})
	_, err = s.Pool(context.Background(), storage)
	require.NoError(t, err)
	assert.InDelta(t, float64(time.Minute), float64(api.deadlines[0]), float64(time.Second))
	_, err = s.Pools(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{2}, api.limits)

	// The shortest is kept too: a nanosecond is no default of 10 s.
	api.deadlines = nil
	s = shim.New(api, ns, shim.Options{CallTimeout: time.Nanosecond})
	_, _ = s.Pool(context.Background(), storage)
	require.Len(t, api.deadlines, 1)
	assert.LessOrEqual(t, api.deadlines[0], time.Nanosecond)
}

// A retry whose wait is cut short (the verb's deadline) says both why it
// retried and why it stopped.
func TestARetryCutShortSaysWhy(t *testing.T) {
	api := fake.New()
	api.Put(storageNetwork()...)
	c := &recClock{err: context.DeadlineExceeded}
	s := shim.New(api, ns, shim.Options{Clock: c})
	patches := conflictOnPatch(api)
	err := s.SetPoolAnnotation(context.Background(), storage, "k", func(*shim.Pool) string { return "v" })
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 1, *patches)
	assert.Len(t, c.waits, 1)
}

func TestPlanEmpty(t *testing.T) {
	assert.True(t, shim.Plan{Pool: "p"}.Empty())
	assert.False(t, shim.Plan{Pool: "p", Entries: []shim.Allocation{{Offset: "1"}}}.Empty())
}

// Up to 20 planned entries, their reservations are looked up one by one
// before the Lease is taken; more are listed in one request.
func TestReservationsAreLookedUpOneByOneUpTo20(t *testing.T) {
	for _, tt := range []struct {
		entries, wantGets, wantLists int
	}{
		{20, 20, 0}, // each looked up before the Lease, and deleted as read (the delete's preconditions)
		{21, 0, 1},
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
			removed, deleted := release(t, s, "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current", ""))
			assert.Len(t, removed, tt.entries)
			assert.Len(t, deleted, tt.entries)
			assert.Equal(t, tt.wantGets, gets)
			assert.Equal(t, tt.wantLists, lists)
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
	plan, err := s.Plan(context.Background(), "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current", ""))
	require.NoError(t, err)
	deleted, err := s.ReleaseReservations(context.Background(), plan)
	require.NoError(t, err)
	assert.Len(t, deleted, 5)
	assert.Equal(t, 1, lists)
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
		plan, err := s.Plan(context.Background(), "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "current", ""))
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

// A release writes its first patch on the read its plan was made on, each
// next one on the pool as the patch before left it: with nothing else
// writing the pool, it reads the pool no more, one patch of at most 1000
// removals after the other.
func TestEachChunkOfARemovalReadsThePoolOnce(t *testing.T) {
	for _, n := range []int{1, 1000, 1001} {
		allocs := map[string]alloc{}
		for i := 0; i < n; i++ {
			allocs[strconv.Itoa(2+i)] = alloc{ContainerID: "old", PodRef: "ns/p"}
		}
		s, api, _ := newStore(fake.NewPool("10.0.0.0-16", "10.0.0.0/16", allocs))
		plan, err := s.Plan(context.Background(), "10.0.0.0-16", "", shim.EarlierSandboxes("ns/p", "new", ""))
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
		assert.Equal(t, (n+999)/1000, patches, "%d entries", n)
		assert.Equal(t, 0, gets, "%d entries", n)
		assert.Empty(t, offsets(t, api, "10.0.0.0-16"))
	}
}

// A plan made on a read that is stale by the time of its write (the pool
// changed meanwhile) costs one failed patch, then a fresh read at once: no
// pause, since no writer is racing it now.
func TestARemovalOnAStalePlanReadsAgainAtOnce(t *testing.T) {
	s, api, c := newStore(storageNetwork()...)
	plan, err := s.Plan(context.Background(), storage, "", shim.EarlierSandboxes("longhorn-system/im-a", "current", ""))
	require.NoError(t, err)
	p := api.Pool(ns, storage)
	p.Spec.Allocations["20"] = alloc{ContainerID: "someone", PodRef: "ns/other", IfName: "eth1"}
	_, err = api.UpdatePool(ns, p)
	require.NoError(t, err)
	start := c.now
	var calls []string
	api.Hook = func(c *fake.Call) error { calls = append(calls, c.Verb+" "+c.Resource); return nil }
	removed, err := s.RemoveAllocations(context.Background(), plan)
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.4", "192.168.50.5", "192.168.50.6"}, ipsOf(removed))
	assert.Equal(t, []string{"20", "3", "7", "8"}, offsets(t, api, storage))
	assert.Equal(t, []string{"patch ippools", "get ippools", "patch ippools"}, calls)
	assert.Equal(t, time.Duration(0), c.now.Sub(start))
	assert.EqualValues(t, 1, s.Retried())
}

func TestOwns(t *testing.T) {
	a := shim.Allocation{IPAllocation: alloc{ContainerID: "c1", PodRef: "ns/p"}}
	for _, tt := range []struct {
		podRef, container string
		want              bool
	}{
		{"ns/p", "", true},
		{"ns/p", "c1", true},
		{"ns/p", "c2", true}, // an earlier sandbox's of the pod: the pod's (below)
		{"ns/q", "", false},
		{"ns/q", "c1", false},
	} {
		o := fake.NewReservation("10.0.0.1", tt.podRef)
		o.Spec.ContainerID = tt.container
		assert.Equal(t, tt.want, shim.Owns(o, a), "%+v", tt)
	}
}

// Holders indexes only the pools that may hold the network's reservations
// (in doubt, yes), and skips one it cannot read.
func TestHolders(t *testing.T) {
	pools := []shim.Pool{
		*fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"4": {ContainerID: "a", PodRef: "ns/a"}}),
		*fake.NewPool("blue-10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"5": {ContainerID: "b", PodRef: "ns/b"}}),
		*fake.NewPool("red-10.0.0.0-24", "10.0.0.0/24", map[string]alloc{"6": {ContainerID: "r", PodRef: "ns/r"}}),
		*fake.NewPool("10.0.1.0-24", "10.0.1.0/24", map[string]alloc{"x": {ContainerID: "c", PodRef: "ns/c"}}), // unreadable
	}
	h := shim.Holders(pools, "")
	assert.Len(t, h, 3, "the unnamed network: any pool may hold its addresses")
	h = shim.Holders(pools, "blue")
	require.Len(t, h, 1, "blue's pool only")
	held := h[names.Reservation(net.ParseIP("10.0.0.5"), "blue")]
	require.Len(t, held, 1)
	assert.Equal(t, "ns/b", held[0].PodRef)
}
