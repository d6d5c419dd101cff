package cache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30 s")
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

// stream is a watch the test writes to. Its Stop leaves it open, as a
// connection with events in flight does: the watch's filter may still see
// an event of a watch the reflector stopped. end closes it.
type stream struct {
	mu    sync.Mutex
	ch    chan watch.Event
	ended bool
}

func newStream() *stream { return &stream{ch: make(chan watch.Event, 8)} }

func (w *stream) ResultChan() <-chan watch.Event { return w.ch }
func (w *stream) Stop()                          {}

func (w *stream) send(t watch.EventType, obj runtime.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.ch <- watch.Event{Type: t, Object: obj}
	}
}

func (w *stream) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.ended = true
		close(w.ch)
	}
}

// script is a ListerWatcher of pools whose lists after the first wait for
// the test (so that what the copy says meanwhile is seen), and whose
// watches are what the test hands out, one a call: a stream, or an error
// the watch is refused with.
type script struct {
	mu      sync.Mutex
	lists   int
	list    runtime.Object
	relist  chan error // a list after the first waits for its answer here (nil: the list)
	watches chan any   // *stream or error
	done    chan struct{}
}

func newScript(list runtime.Object) *script {
	return &script{list: list, relist: make(chan error), watches: make(chan any), done: make(chan struct{})}
}

func (s *script) listed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

func (s *script) lw() toolscache.ListerWatcher {
	return &toolscache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
			s.mu.Lock()
			s.lists++
			again := s.lists > 1
			s.mu.Unlock()
			if again {
				select {
				case err := <-s.relist:
					if err != nil {
						return nil, err
					}
				case <-s.done:
					return nil, errors.New("test over")
				}
			}
			return s.list.DeepCopyObject(), nil
		},
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) {
			select {
			case w := <-s.watches:
				if err, ok := w.(error); ok {
					return nil, err
				}
				return w.(*stream), nil
			case <-s.done:
				return nil, errors.New("test over")
			}
		},
	}
}

// serve hands out the next watch, and returns it.
func (s *script) serve(t *testing.T) *stream {
	t.Helper()
	w := newStream()
	select {
	case s.watches <- w:
	case <-time.After(10 * time.Second):
		t.Fatal("the reflector asked for no watch in 10 s")
	}
	return w
}

// refuse refuses the next watch with err.
func (s *script) refuse(t *testing.T, err error) {
	t.Helper()
	select {
	case s.watches <- err:
	case <-time.After(10 * time.Second):
		t.Fatal("the reflector asked for no watch in 10 s")
	}
}

func status(code int32, reason metav1.StatusReason, message string) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: message}
}

// The copy follows the cluster while its informer's watch runs from what it
// listed, and not otherwise. What client-go v0.34.1's reflector does after
// each way a watch fails decides how it comes back (tools/cache/reflector.go,
// Reflector.watch and isWatchErrorRetriable): after an error in the stream
// it lists again (a 410, or any error but a 429), or after a 429 it watches
// again from the last resourceVersion it saw, without a list; a watch
// refused at its start is watched again without a list when the refusal is
// a 429 or a refused connection (the API server restarting), and listed
// again otherwise (a 403 while a restarted API server's authorizer warms
// up). So the copy follows again once the informer has listed, or once a
// watch opened after the failure has delivered an event or a bookmark: the
// API server accepted that watch's resourceVersion, and what was written
// since comes in order. Until then the agent declines. Before, a failure
// that the reflector resumed from was never cleared (an in-stream 429: every
// verb declined for as long as the process ran), and a watch refused at its
// start with a 429 or a refused connection was never recorded.
func TestTheCopyFollowsAgainOnlyOnceItListsOrANewWatchDelivers(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "whereabouts.cni.cncf.io", Resource: "ippools"}, "",
		errors.New(`User "system:serviceaccount:kube-system:harvester-ipam-agent" cannot watch resource "ippools"`))
	// end ends the running watch as its timeout does (after an event: one
	// that ends at once, with none, is listed again), and refuses the next.
	end := func(t *testing.T, s *script, w *stream, err error) {
		w.send(watch.Modified, pool("5", nil))
		w.end()
		s.refuse(t, err)
	}
	for _, tc := range []struct {
		name string
		// fail makes the running watch w fail (or ends it and refuses the
		// next), and says what Following then names.
		fail func(t *testing.T, s *script, w *stream) string
		// relists: the reflector lists again; else it watches again
		// without a list, and that watch must deliver.
		relists bool
		// listsRefused counts the lists that fail refuses.
		listsRefused int
		// deliver is what the new watch delivers first (relists false).
		deliver func(w *stream)
	}{{
		name: "an in-stream 429: watched again without a list, following once that watch delivers an event",
		fail: func(t *testing.T, s *script, w *stream) string {
			w.send(watch.Error, status(429, metav1.StatusReasonTooManyRequests, "too many requests, please try again later"))
			return "too many requests"
		},
		deliver: func(w *stream) { w.send(watch.Modified, pool("8", nil)) },
	}, {
		name: "an in-stream 429: following once the new watch delivers a bookmark",
		fail: func(t *testing.T, s *script, w *stream) string {
			w.send(watch.Error, status(429, metav1.StatusReasonTooManyRequests, "too many requests, please try again later"))
			return "too many requests"
		},
		deliver: func(w *stream) {
			w.send(watch.Bookmark, &shim.Pool{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9"}})
		},
	}, {
		name: "an in-stream 410: listed again",
		fail: func(t *testing.T, s *script, w *stream) string {
			w.send(watch.Error, status(410, metav1.StatusReasonExpired, "too old resource version: 4 (120)"))
			return "too old resource version"
		},
		relists: true,
	}, {
		name: "an in-stream 403: listed again",
		fail: func(t *testing.T, s *script, w *stream) string {
			w.send(watch.Error, &forbidden.ErrStatus)
			return "forbidden"
		},
		relists: true,
	}, {
		name: "a watch that ends at once, then a list refused: not following until a list succeeds",
		fail: func(t *testing.T, s *script, w *stream) string {
			w.end() // no event: the reflector lists again
			waitFor(t, func() bool { return s.listed() == 2 })
			s.relist <- forbidden
			return "list: " + forbidden.Error()
		},
		relists:      true,
		listsRefused: 1,
	}, {
		name: "a watch refused at its start with a 403 (a restarted API server's authorizer warming up): listed again",
		fail: func(t *testing.T, s *script, w *stream) string {
			end(t, s, w, forbidden)
			return "forbidden"
		},
		relists: true,
	}, {
		name: "a watch refused at its start with a 429: watched again without a list",
		fail: func(t *testing.T, s *script, w *stream) string {
			end(t, s, w, apierrors.NewTooManyRequests("the watch cache is not ready", 1))
			return "not ready"
		},
		deliver: func(w *stream) { w.send(watch.Added, pool("8", nil)) },
	}, {
		name: "a watch whose connection is refused (the API server restarting): watched again without a list",
		fail: func(t *testing.T, s *script, w *stream) string {
			end(t, s, w, fmt.Errorf("Get \"https://10.53.0.1:443/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools\": dial tcp 10.53.0.1:443: connect: %w", syscall.ECONNREFUSED))
			return "connection refused"
		},
		deliver: func(w *stream) { w.send(watch.Modified, pool("8", nil)) },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(&shim.PoolList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}, Items: []shim.Pool{*pool("4", nil)}})
			defer close(s.done)
			rw := watch.NewFake()
			res := &shim.ReservationList{ListMeta: metav1.ListMeta{ResourceVersion: "4"}}
			o := cache.New()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watched := make(chan error, 1)
			go func() { watched <- o.Watch(ctx, ns, s.lw(), lw(res, rw)) }()
			w := s.serve(t)
			require.NoError(t, <-watched)
			require.NoError(t, o.Following(), "listed and watching")

			why := tc.fail(t, s, w)
			waitFor(t, func() bool { return o.Following() != nil })
			assert.ErrorContains(t, o.Following(), "kube-system/ippools")
			assert.ErrorContains(t, o.Following(), why)
			w.send(watch.Modified, pool("6", nil)) // the failed watch's own late event proves nothing

			if tc.relists {
				waitFor(t, func() bool { return s.listed() == 2+tc.listsRefused })
				assert.Error(t, o.Following(), "while it lists again")
				s.relist <- nil
				waitFor(t, func() bool { return o.Following() == nil })
				s.serve(t)
				return
			}
			next := s.serve(t)
			time.Sleep(50 * time.Millisecond)
			assert.Error(t, o.Following(), "a new watch that has delivered nothing yet, or the old one's late event")
			tc.deliver(next)
			waitFor(t, func() bool { return o.Following() == nil })
			assert.Equal(t, 1, s.listed(), "no list again")
			next.send(watch.Error, status(410, metav1.StatusReasonExpired, "too old resource version: 9 (120)"))
			waitFor(t, func() bool { return o.Following() != nil })
			next.send(watch.Modified, pool("11", nil)) // after its error, nothing of it counts
			time.Sleep(50 * time.Millisecond)
			assert.Error(t, o.Following(), "an event after the watch's error")
		})
	}
}

// What the agent's own requests answer (a patch, a create, a fresh read) is
// kept in the copy, but never counts as the watch having delivered it: only
// the informer's delivery says the copy holds every pool written before.
func TestTheAnswerToTheAgentsOwnWriteNeverMakesTheCopyFollow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		do   func(api cache.API) (*shim.Pool, error)
	}{
		{"a patch", func(api cache.API) (*shim.Pool, error) {
			return api.PatchPool(ctx, ns, "10.0.0.0-24", shim.Guarded(api.Objects.Pool(ns, "10.0.0.0-24").ResourceVersion,
				shim.PatchOp{Op: "add", Path: "/spec/allocations/1", Value: shim.IPAllocation{ContainerID: "c", PodRef: "d/p"}}))
		}},
		{"a create", func(api cache.API) (*shim.Pool, error) {
			return api.CreatePool(ctx, ns, fake.NewPool("10.0.1.0-24", "10.0.1.0/24", nil))
		}},
		{"a fresh read", func(api cache.API) (*shim.Pool, error) {
			return api.GetPool(ctx, ns, "10.0.0.0-25", shim.Fresh)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fake.New()
			f.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]shim.IPAllocation{}))
			listed := f.Pool(ns, "10.0.0.0-24")
			o := cache.New()
			o.SawPool(listed)
			o.WatchedPool(ns, listed.ResourceVersion)
			o.Listed(ns)
			require.True(t, o.Follows(ns, listed.ResourceVersion))
			// Written since the list, by another: not delivered yet.
			f.Put(fake.NewPool("10.0.0.0-25", "10.0.0.0/25", nil))

			p, err := tc.do(cache.API{API: f, Objects: o})
			require.NoError(t, err)
			assert.Same(t, p, o.Pool(ns, p.Name), "the answer is kept")
			assert.False(t, o.Follows(ns, p.ResourceVersion), "but is not the watch's")
			o.WatchedPool(ns, p.ResourceVersion)
			assert.True(t, o.Follows(ns, p.ResourceVersion), "once the watch delivers it")
		})
	}
}
