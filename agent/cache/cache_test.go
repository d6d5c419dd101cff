package cache_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

const ns = "kube-system"

func pool(rv string, allocs map[string]shim.IPAllocation) *shim.Pool {
	p := fake.NewPool("10.0.0.0-24", "10.0.0.0/24", allocs)
	p.ResourceVersion = rv
	return p
}

func TestAnOlderVersionNeverReplacesANewerOne(t *testing.T) {
	for _, tc := range []struct {
		name      string
		have, got string
		want      string
	}{
		{"newer arrives", "5", "7", "7"},
		{"older arrives late", "7", "5", "7"},
		{"the same again", "7", "7", "7"},
		{"not numbers: the incoming wins", "abc", "5", "5"},
		{"numbers compared as numbers", "9", "10", "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cache.New()
			o.SawPool(pool(tc.have, nil))
			o.SawPool(pool(tc.got, nil))
			assert.Equal(t, tc.want, o.Pool(ns, "10.0.0.0-24").ResourceVersion)
		})
	}
}

func TestADeletionOlderThanWhatIsHeldIsIgnored(t *testing.T) {
	o := cache.New()
	o.SawPool(pool("9", nil))
	o.GonePool(ns, "10.0.0.0-24", "8")
	assert.NotNil(t, o.Pool(ns, "10.0.0.0-24"), "a deletion event of an older version")
	o.GonePool(ns, "10.0.0.0-24", "9")
	assert.Nil(t, o.Pool(ns, "10.0.0.0-24"))

	r := fake.NewReservation("10.0.0.4", "default/a")
	r.ResourceVersion = "3"
	o.SawReservation(r)
	o.GoneReservation(ns, "10.0.0.4", "")
	assert.Nil(t, o.Reservation(ns, "10.0.0.4"), "a deletion of unknown version removes it")
}

func TestTheAPIServesCachedReadsAndRecordsWrites(t *testing.T) {
	f := fake.New()
	f.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	o := cache.New()
	api := cache.API{API: f, Objects: o}
	ctx := context.Background()

	// Not held: the read goes to the server's watch cache, and is not kept
	// (it may lag; only fresh reads and write answers are kept).
	p, err := api.GetPool(ctx, ns, "10.0.0.0-24", shim.Cache)
	require.NoError(t, err)
	require.NotNil(t, p)
	assert.Nil(t, o.Pool(ns, "10.0.0.0-24"))

	// A fresh read is kept, and then served from the copy.
	p, err = api.GetPool(ctx, ns, "10.0.0.0-24", shim.Fresh)
	require.NoError(t, err)
	calls := 0
	f.Hook = func(*fake.Call) error { calls++; return nil }
	got, err := api.GetPool(ctx, ns, "10.0.0.0-24", shim.Cache)
	require.NoError(t, err)
	assert.Same(t, o.Pool(ns, "10.0.0.0-24"), got)
	assert.Equal(t, 0, calls, "served without a request")

	// A patch's answer replaces it: the next ADD chooses on what was written.
	written, err := api.PatchPool(ctx, ns, "10.0.0.0-24", shim.Guarded(p.ResourceVersion,
		shim.PatchOp{Op: "add", Path: "/spec/allocations/1", Value: shim.IPAllocation{ContainerID: "c", PodRef: "d/p"}}))
	require.NoError(t, err)
	assert.Equal(t, written.ResourceVersion, o.Pool(ns, "10.0.0.0-24").ResourceVersion)

	// Reservations created and deleted through it are seen at once.
	r, err := api.CreateReservation(ctx, ns, fake.NewReservation("10.0.0.1", "d/p"))
	require.NoError(t, err)
	require.NotNil(t, o.Reservation(ns, "10.0.0.1"))
	require.NoError(t, api.DeleteReservation(ctx, ns, "10.0.0.1", shim.Preconditions{UID: r.UID, ResourceVersion: r.ResourceVersion}))
	assert.Nil(t, o.Reservation(ns, "10.0.0.1"))
}

// lw is a ListerWatcher over a fixed list and a fake watch.
func lw(list runtime.Object, w *watch.FakeWatcher) toolscache.ListerWatcher {
	return &toolscache.ListWatch{
		ListFunc:  func(metav1.ListOptions) (runtime.Object, error) { return list, nil },
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return w, nil },
	}
}

func TestWatchFillsTheCopyFromInformers(t *testing.T) {
	p := pool("4", map[string]shim.IPAllocation{"1": {ContainerID: "c", PodRef: "d/p"}})
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "whereabouts"}}
	pools := &shim.PoolList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}, Items: []shim.Pool{*p}}
	r := fake.NewReservation("10.0.0.1", "d/p")
	r.ResourceVersion = "3"
	res := &shim.ReservationList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}, Items: []shim.Reservation{*r}}
	pw, rw := watch.NewFake(), watch.NewFake()

	o := cache.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, listed := o.Pools(ns)
	assert.False(t, listed, "nothing listed yet")
	require.NoError(t, o.Watch(ctx, ns, lw(pools, pw), lw(res, rw)))
	all, listed := o.Pools(ns)
	assert.True(t, listed, "listed once Watch returns")
	require.Len(t, all, 1)
	_, listed = o.Pools("elsewhere")
	assert.False(t, listed, "another namespace is not")

	got := o.Pool(ns, "10.0.0.0-24")
	require.NotNil(t, got)
	assert.Empty(t, got.ManagedFields, "managedFields dropped")
	require.NotNil(t, o.Reservation(ns, "10.0.0.1"))

	next := pool("6", map[string]shim.IPAllocation{})
	pw.Modify(next)
	rw.Delete(r)
	waitFor(t, func() bool {
		p := o.Pool(ns, "10.0.0.0-24")
		return p.ResourceVersion == "6" && o.Reservation(ns, "10.0.0.1") == nil
	})
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

// The copy follows the pools as of a write only once its informer has
// delivered that write or a later one: the agent's own write's answer never
// counts (it says nothing of pools created before it that the informer has
// not delivered yet).
func TestTheCopyFollowsAWriteOnlyOnceTheWatchDeliveredIt(t *testing.T) {
	p := pool("4", nil)
	pools := &shim.PoolList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}, Items: []shim.Pool{*p}}
	res := &shim.ReservationList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}}
	pw, rw := watch.NewFake(), watch.NewFake()
	o := cache.New()
	assert.False(t, o.Follows(ns, "4"), "nothing listed")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, o.Watch(ctx, ns, lw(pools, pw), lw(res, rw)))
	assert.True(t, o.Follows(ns, "4"), "the list delivered version 4")
	assert.True(t, o.Follows(ns, "3"))

	// The agent's own patch answered at 7: the copy holds it, but not
	// what the watch has yet to deliver.
	o.SawPool(pool("7", nil))
	assert.False(t, o.Follows(ns, "7"), "an answer to the agent's own write is not the watch")
	assert.False(t, o.Follows(ns, "x"), "not a version")
	assert.False(t, o.Follows("elsewhere", "1"), "another namespace")

	short, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	assert.False(t, o.WaitFollows(short, ns, "7"), "the wait ends with its context")

	done := make(chan bool)
	go func() { done <- o.WaitFollows(context.Background(), ns, "7") }()
	other := fake.NewPool("10.0.0.0-25", "10.0.0.0/25", nil)
	other.ResourceVersion = "6"
	pw.Add(other)
	pw.Modify(pool("7", nil))
	select {
	case ok := <-done:
		assert.True(t, ok, "the watch delivered 7")
	case <-time.After(10 * time.Second):
		t.Fatal("WaitFollows never returned")
	}
	all, _ := o.Pools(ns)
	assert.Len(t, all, 2, "the pool written before 7 is in the copy")
}

// After the API server restarts, a watch can fail (refused while its
// authorizer warms up) and the informer keep a copy that no longer follows
// the cluster until it lists again: meanwhile Following says so, and the
// agent declines. A list brings it back.
func TestAFailedWatchStopsTheCopyFollowingUntilItListsAgain(t *testing.T) {
	gate := make(chan struct{})
	watchers := make(chan *watch.FakeWatcher, 16)
	lists := map[string]int{}
	var mu sync.Mutex
	lwOf := func(resource string, list runtime.Object) toolscache.ListerWatcher {
		return &toolscache.ListWatch{
			ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
				mu.Lock()
				lists[resource]++
				again := lists[resource] > 1
				mu.Unlock()
				if again {
					<-gate
				}
				return list, nil
			},
			WatchFunc: func(metav1.ListOptions) (watch.Interface, error) {
				w := watch.NewFake()
				if resource == "pools" {
					watchers <- w
				}
				return w, nil
			},
		}
	}
	pools := &shim.PoolList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}, Items: []shim.Pool{*pool("4", nil)}}
	res := &shim.ReservationList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}}
	o := cache.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, o.Watch(ctx, ns, lwOf("pools", pools), lwOf("reservations", res)))
	require.NoError(t, o.Following(), "listed and watching")

	w := <-watchers
	w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `ippools.whereabouts.cni.cncf.io is forbidden: User "system:serviceaccount:kube-system:harvester-ipam-agent" cannot watch resource "ippools"`})
	waitFor(t, func() bool { return o.Following() != nil })
	assert.ErrorContains(t, o.Following(), "kube-system/ippools")
	assert.ErrorContains(t, o.Following(), "forbidden")

	close(gate) // the reflector's list again succeeds
	waitFor(t, func() bool { return o.Following() == nil })
}
