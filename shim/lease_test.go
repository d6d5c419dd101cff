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
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

var leases = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func lease(holder string, seconds int32, transitions int32) *shim.Lease {
	now := metav1.NewMicroTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	return &shim.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: names.Lease, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds,
			LeaseTransitions: &transitions, AcquireTime: &now, RenewTime: &now},
	}
}

// How the Lease is taken, as client-go's elector takes it: what is on the
// record after, how long we waited, and what fails.
func TestTakingTheLease(t *testing.T) {
	noDuration := lease("kube-system/whereabouts-node1", 1, 3)
	noDuration.Spec.LeaseDurationSeconds = nil
	noTransitions := lease("", 1, 0)
	noTransitions.Spec.LeaseTransitions = nil
	for _, tt := range []struct {
		name            string
		held            *shim.Lease
		hook            func(n int, c *fake.Call) error // n: the how-many-th lease request
		wantErr         string
		wantWait        time.Duration
		wantTransitions int32
	}{
		{name: "none yet: created, no transition", wantTransitions: 0},
		{name: "handed back: taken, one more transition", held: lease("", 1, 3), wantTransitions: 4},
		{name: "no transitions recorded: the first", held: noTransitions, wantTransitions: 1},
		// Our name on a record this store did not write: another process of
		// the same name (a crashed one, whose requests may still land) holds
		// it as much as anyone else: waited out, and taken from it.
		{name: "under our name, not written by us: waited out, one more transition", held: lease("harvester-ipam/test", 5, 3), wantWait: 5025 * time.Millisecond, wantTransitions: 4},
		{name: "held without a duration: expired at once", held: noDuration, wantTransitions: 4},
		// Looked at again every 75 ms (50 ms and half again at random).
		{name: "held for 2 s: taken once its record is 2 s old", held: lease("kube-system/whereabouts-node1", 2, 3), wantWait: 2025 * time.Millisecond, wantTransitions: 4},
		{
			name: "created by another first: looked at again, then taken",
			hook: func(n int, c *fake.Call) error {
				if n == 2 && c.Verb == "create" {
					return apierrors.NewAlreadyExists(leases, names.Lease)
				}
				return nil
			},
			wantTransitions: 0,
		},
		{
			name: "taken by another first: looked at again",
			held: lease("", 1, 3),
			hook: func(n int, c *fake.Call) error {
				if n == 2 && c.Verb == "update" {
					return apierrors.NewConflict(leases, names.Lease, errors.New("modified"))
				}
				return nil
			},
			wantTransitions: 4,
		},
		{
			name:    "the read fails",
			hook:    func(_ int, c *fake.Call) error { return errors.New("connection refused") },
			wantErr: "get lease kube-system/whereabouts: connection refused",
		},
		{
			name: "the create fails",
			hook: func(_ int, c *fake.Call) error {
				if c.Verb == "create" {
					return errors.New("forbidden")
				}
				return nil
			},
			wantErr: "create lease kube-system/whereabouts: forbidden",
		},
		{
			name: "the take fails",
			held: lease("", 1, 3),
			hook: func(_ int, c *fake.Call) error {
				if c.Verb == "update" {
					return errors.New("forbidden")
				}
				return nil
			},
			wantErr: "take lease kube-system/whereabouts: forbidden",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := storageNetwork()
			if tt.held != nil {
				objs = append(objs, tt.held)
			}
			s, api, c := newStore(objs...)
			start := c.now
			n := 0
			api.Hook = func(call *fake.Call) error {
				if call.Resource != fake.Leases || tt.hook == nil {
					return nil
				}
				n++
				return tt.hook(n, call)
			}
			var during *shim.Lease
			err := s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
				during = api.Lease(ns, names.Lease)
				return nil
			})
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, tt.wantErr, err.Error())
				return
			}
			require.NoError(t, err)
			require.NotNil(t, during)
			assert.Equal(t, "harvester-ipam/test", *during.Spec.HolderIdentity)
			assert.EqualValues(t, 5, *during.Spec.LeaseDurationSeconds)
			require.NotNil(t, during.Spec.LeaseTransitions)
			assert.Equal(t, tt.wantTransitions, *during.Spec.LeaseTransitions)
			assert.Equal(t, start.Add(tt.wantWait), during.Spec.AcquireTime.Time.UTC(), "acquired after the wait")
			assert.Equal(t, during.Spec.AcquireTime, during.Spec.RenewTime)
			assert.Equal(t, tt.wantWait, c.now.Sub(start))
		})
	}
}

// Waiting for the Lease ends with the verb's context, saying who holds it.
func TestWaitingForTheLeaseEndsWithTheVerb(t *testing.T) {
	api := fake.New()
	api.Put(append(storageNetwork(), lease("kube-system/whereabouts-node1", 5, 3))...)
	c := &recClock{now: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC), err: context.DeadlineExceeded}
	s := shim.New(api, ns, shim.Options{Clock: c, Identity: "me"})
	err := s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
		t.Fatal("not while another holds it")
		return nil
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "wait for lease kube-system/whereabouts held by kube-system/whereabouts-node1")
}

// The Lease is handed back even when the verb's context is done, and only
// as we last wrote it: a Lease changed since is not ours to touch.
func TestTheLeaseIsHandedBack(t *testing.T) {
	s, api, c := newStore(storageNetwork()...)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.Locked(ctx, func(context.Context, *shim.Locked) error {
		cancel()
		c.now = c.now.Add(time.Second)
		return nil
	}))
	l := api.Lease(ns, names.Lease)
	assert.Equal(t, "", *l.Spec.HolderIdentity)
	assert.EqualValues(t, 1, *l.Spec.LeaseDurationSeconds)
	assert.Equal(t, c.now, l.Spec.RenewTime.Time.UTC())
	assert.Equal(t, c.now, l.Spec.AcquireTime.Time.UTC())

	// Taken over under us (we were too slow): left as the new holder wrote it.
	err := s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
		other := api.Lease(ns, names.Lease)
		holder := "kube-system/whereabouts-node2"
		other.Spec.HolderIdentity = &holder
		_, err := api.UpdateLease(context.Background(), other)
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, "kube-system/whereabouts-node2", *api.Lease(ns, names.Lease).Spec.HolderIdentity)
}

// Deleting a reservation under the Lease: gone or changed is no error, and
// nothing deleted; anything else is an error.
func TestDeleteReservationUnderTheLease(t *testing.T) {
	for _, tt := range []struct {
		name        string
		err         error
		wantDeleted bool
		wantErr     string
	}{
		{"deleted", nil, true, ""},
		{"gone already", apierrors.NewNotFound(schema.GroupResource{Resource: "overlappingrangeipreservations"}, "192.168.50.4"), false, ""},
		{"changed since it was read", apierrors.NewConflict(schema.GroupResource{Resource: "overlappingrangeipreservations"}, "192.168.50.4", errors.New("precondition")), false, ""},
		{"refused", errors.New("forbidden"), false, "delete reservation kube-system/192.168.50.4: forbidden"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(storageNetwork()...)
			err := s.Locked(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				o, err := l.Reservation(ctx, "192.168.50.4")
				require.NoError(t, err)
				require.NotNil(t, o)
				api.Hook = func(c *fake.Call) error {
					if c.Verb == "delete" {
						return tt.err
					}
					return nil
				}
				defer func() { api.Hook = nil }()
				deleted, err := l.DeleteReservation(ctx, o)
				assert.Equal(t, tt.wantDeleted, deleted)
				return err
			})
			if tt.wantErr != "" {
				assert.EqualError(t, err, tt.wantErr)
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, !tt.wantDeleted, contains(reservations(api), "192.168.50.4"))
		})
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// The judgement and the delete happen under whereabouts' Lease, taken as
// client-go's elector takes it and handed back as it hands it back.
func TestReservationsAreReleasedUnderWhereaboutsLease(t *testing.T) {
	s, api, _ := newStore(storageNetwork()...)
	var holders []string
	api.Hook = func(c *fake.Call) error {
		if c.Verb == "delete" {
			l := api.Lease(ns, names.Lease)
			require.NotNil(t, l, "the Lease exists when we delete")
			holders = append(holders, *l.Spec.HolderIdentity)
		}
		return nil
	}
	_, deleted := release(t, s, storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	assert.Len(t, deleted, 2)
	assert.Equal(t, []string{"harvester-ipam/test", "harvester-ipam/test"}, holders)
	l := api.Lease(ns, names.Lease)
	assert.Equal(t, "", *l.Spec.HolderIdentity, "handed back")
	assert.EqualValues(t, 1, *l.Spec.LeaseDurationSeconds)
	assert.EqualValues(t, 0, *l.Spec.LeaseTransitions, "created: no transition yet")
}

func TestTheLeaseProtocol(t *testing.T) {
	for _, tt := range []struct {
		name     string
		held     *shim.Lease
		renew    int // how many times whereabouts renews while we wait
		wantWait time.Duration
	}{
		{"no Lease yet: created", nil, 0, 0},
		{"handed back by whereabouts: taken at once", lease("", 1, 3), 0, 0},
		{"held by whereabouts that died: taken once its record is a second old", lease("kube-system/whereabouts-node1", 1, 3), 0, time.Second},
		{"held by whereabouts that renews it: we wait out each renewal", lease("kube-system/whereabouts-node1", 1, 3), 2, 2 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := storageNetwork()
			if tt.held != nil {
				objs = append(objs, tt.held)
			}
			s, api, c := newStore(objs...)
			start := c.now
			renewed := 0
			var lastRenewal time.Time
			api.Hook = func(call *fake.Call) error {
				// whereabouts renews every half second while it works.
				if call.Resource == fake.Leases && call.Verb == "get" && renewed < tt.renew && c.now.Sub(lastRenewal) >= 500*time.Millisecond && c.now.Sub(start) >= time.Duration(renewed)*time.Second {
					l := api.Lease(ns, names.Lease)
					if l != nil && *l.Spec.HolderIdentity != "harvester-ipam/test" && c.now.Sub(start) > 0 {
						l.Spec.RenewTime = &metav1.MicroTime{Time: c.now}
						_, err := api.UpdateLease(context.Background(), l)
						require.NoError(t, err)
						renewed++
						lastRenewal = c.now
					}
				}
				return nil
			}
			_, deleted := release(t, s, storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
			assert.Len(t, deleted, 2)
			waited := c.now.Sub(start)
			assert.GreaterOrEqual(t, waited, tt.wantWait)
			assert.Less(t, waited, tt.wantWait+500*time.Millisecond)
			l := api.Lease(ns, names.Lease)
			assert.Equal(t, "", *l.Spec.HolderIdentity, "handed back")
			want := int32(0)
			if tt.held != nil {
				want = *tt.held.Spec.LeaseTransitions + 1
			}
			assert.Equal(t, want, *l.Spec.LeaseTransitions)
		})
	}
}

// A long critical section renews the Lease; one taken from us ends it before
// the next delete.
func TestTheLeaseIsRenewedAndItsLossStopsTheDeletes(t *testing.T) {
	allocs := map[string]alloc{}
	var objs []any
	for i := 10; i < 40; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old", PodRef: "ns/p", IfName: "eth1"}
		objs = append(objs, fake.NewReservation(fmt.Sprintf("10.0.0.%d", i), "ns/p"))
	}
	objs = append(objs, fake.NewPool("10.0.0.0-24", "10.0.0.0/24", allocs))

	t.Run("renewed", func(t *testing.T) {
		s, api, c := newStore(objs...)
		renewals := 0
		api.Hook = func(call *fake.Call) error {
			if call.Verb == "delete" {
				c.now = c.now.Add(200 * time.Millisecond) // a slow API server
			}
			if call.Resource == fake.Leases && (call.Verb == "update" || call.Verb == "create") {
				renewals++
			}
			return nil
		}
		_, deleted := release(t, s, "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "new", ""))
		assert.Len(t, deleted, 30)
		assert.GreaterOrEqual(t, renewals, 1+3+1, "taken, renewed at least every 1.5 s of 6 s, handed back")
	})
	t.Run("lost", func(t *testing.T) {
		s, api, c := newStore(objs...)
		deletes := 0
		api.Hook = func(call *fake.Call) error {
			if call.Verb == "delete" {
				deletes++
				c.now = c.now.Add(200 * time.Millisecond)
				if deletes == 5 {
					l := api.Lease(ns, names.Lease)
					other := "kube-system/whereabouts-node2"
					l.Spec.HolderIdentity = &other
					_, err := api.UpdateLease(context.Background(), l)
					require.NoError(t, err)
				}
			}
			return nil
		}
		plan, err := s.Plan(context.Background(), "10.0.0.0-24", "", shim.EarlierSandboxes("ns/p", "new", ""))
		require.NoError(t, err)
		deleted, err := s.ReleaseReservations(context.Background(), plan)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "renew lease kube-system/whereabouts")
		assert.Len(t, deleted, 8, "those deleted before its loss was seen, at the first renewal")
		assert.Equal(t, 8, deletes, "no delete once the Lease is seen lost")
		assert.Equal(t, "kube-system/whereabouts-node2", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "not handed back: it is not ours")
	})
}

// Under the Lease, a request is made only while the Lease is ours: it is
// renewed once held 30% of its duration (1.5 s of 5 s). A renewal that
// fails is forgiven only when the next request, bounded by the 2 s of a
// call under the Lease, still lands within 60% of the duration of the last
// good write, judged by the clock after the failed renewal (a renewal that
// timed out took its time); else, and when the Lease was taken (409), the
// hold is lost, and no request is made under it.
func TestTheLeaseIsKept(t *testing.T) {
	timeout := errors.New("etcdserver: request timed out")
	taken := apierrors.NewConflict(schema.GroupResource{Resource: "leases"}, names.Lease, errors.New("modified"))
	for _, tt := range []struct {
		name         string
		leaseSeconds int32         // our record's duration (0: 5 s)
		after        time.Duration // the clock moves on by this before the request
		renewErr     error
		renewTakes   time.Duration // the clock moves on by this during the renewal
		wantUpdate   bool          // a renewal was sent
		wantErr      string
	}{
		{name: "held 1.499 s: no renewal", after: 1499 * time.Millisecond},
		{name: "held 1.5 s: renewed", after: 1500 * time.Millisecond, wantUpdate: true},
		{name: "renewal fails at 1.5 s: 1.5 + 2 s passes 3 s: lost", after: 1500 * time.Millisecond, renewErr: timeout, wantUpdate: true,
			wantErr: "renew lease kube-system/whereabouts: etcdserver: request timed out"},
		{name: "15 s: renewal fails at once at 4.5 s: still ours", leaseSeconds: 15, after: 4500 * time.Millisecond, renewErr: timeout, wantUpdate: true},
		{name: "15 s: renewal fails after 2.4 s: 6.9 + 2 s within 9 s: still ours", leaseSeconds: 15, after: 4500 * time.Millisecond, renewErr: timeout, renewTakes: 2400 * time.Millisecond, wantUpdate: true},
		{name: "15 s: renewal times out after 2.5 s: 7 + 2 s reaches 9 s: lost", leaseSeconds: 15, after: 4500 * time.Millisecond, renewErr: timeout, renewTakes: 2500 * time.Millisecond, wantUpdate: true,
			wantErr: "renew lease kube-system/whereabouts: etcdserver: request timed out"},
		{name: "taken by another: lost at once", after: 1500 * time.Millisecond, renewErr: taken, wantUpdate: true, wantErr: "renew lease kube-system/whereabouts"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			c := &clock{now: testEpoch}
			s := shim.New(api, ns, shim.Options{
				Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2, Jitter: 1}, Clock: c,
				Random: func() float64 { return 0.5 }, Identity: "harvester-ipam/test", LeaseSeconds: tt.leaseSeconds,
			})
			updates, reads := 0, 0
			err := s.Locked(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				c.now = c.now.Add(tt.after)
				api.Hook = func(call *fake.Call) error {
					if call.Resource == fake.Leases && call.Verb == "update" {
						updates++
						c.now = c.now.Add(tt.renewTakes) // a slow API server
						return tt.renewErr
					}
					if call.Resource == fake.Reservations {
						reads++
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
				assert.Equal(t, 1, reads)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Equal(t, 0, reads, "no request under a lost hold")
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
	plan, err := s.Plan(context.Background(), storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
	require.NoError(t, err)
	_, err = s.ReleaseReservations(context.Background(), plan)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "delete reservation kube-system/192.168.50.4: it kept changing under 4 attempts")
	assert.Equal(t, 4, deletes)
	assert.EqualValues(t, 3, s.Retried())
	assert.Contains(t, reservations(api), "192.168.50.4")
	assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "the Lease is handed back")
}

// A Lease someone else holds (and renews) is looked at again every
// LeaseRetry, stretched by up to as much again at random; 50 ms by default.
func TestTheLeaseIsLookedAtAgainEveryRetry(t *testing.T) {
	for _, tt := range []struct {
		retry time.Duration
		want  time.Duration
	}{
		{0, 75 * time.Millisecond},
		{200 * time.Millisecond, 300 * time.Millisecond},
	} {
		api := fake.New()
		api.Put(append(storageNetwork(), lease("kube-system/whereabouts-node1", 1, 3))...)
		c := &recClock{now: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)}
		s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, LeaseRetry: tt.retry, Identity: "me"})
		require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error { return nil }))
		require.NotEmpty(t, c.waits)
		for _, w := range c.waits {
			assert.Equal(t, tt.want, w)
		}
		assert.GreaterOrEqual(t, time.Duration(len(c.waits))*tt.want, time.Second, "until the holder's record was a second old")
		assert.Less(t, time.Duration(len(c.waits)-1)*tt.want, time.Second, "and not longer")
		l := api.Lease(ns, names.Lease)
		assert.EqualValues(t, 4, *l.Spec.LeaseTransitions, "taken from another holder: one more transition")
	}
}

// The smallest settings are settings, not "use the default": a Lease of
// one second (whereabouts' own elector holds its record about that long),
// and a look every nanosecond.
func TestTheSmallestLeaseSettingsHold(t *testing.T) {
	api := fake.New()
	api.Put(append(storageNetwork(), lease("kube-system/whereabouts-node1", 1, 3))...)
	// The holder hands the Lease back after our third look.
	looks := 0
	api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Leases && c.Verb == "get" {
			if looks++; looks == 3 {
				l := api.Lease(ns, names.Lease)
				free := ""
				l.Spec.HolderIdentity = &free
				api.Put(l)
			}
		}
		return nil
	}
	c := &recClock{now: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)}
	s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, LeaseSeconds: 1, LeaseRetry: time.Nanosecond, Identity: "me"})
	require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
		l := api.Lease(ns, names.Lease)
		assert.Equal(t, "me", *l.Spec.HolderIdentity)
		assert.EqualValues(t, 1, *l.Spec.LeaseDurationSeconds, "our record: one second")
		return nil
	}))
	assert.Equal(t, []time.Duration{time.Nanosecond, time.Nanosecond}, c.waits, "looked at again every nanosecond (1.5 ns, truncated)")
}

// A reservation is looked up before the Lease and deleted under it as it was
// read: one that whereabouts deleted and made again for another pod in
// between (another object, same name) is read again and left, and so is one
// of the pod whose new sandbox took the address meanwhile.
func TestAReservationIsDeletedOnlyAsItWasRead(t *testing.T) {
	for _, tt := range []struct {
		name    string
		between func(api *fake.API)
		want    []string // deleted
		podRef  string   // of 192.168.50.4 after
	}{
		{name: "unchanged", between: func(*fake.API) {}, want: []string{"192.168.50.4", "192.168.50.8"}},
		{
			name: "another pod's now",
			between: func(api *fake.API) {
				api.Remove(fake.Reservations, ns, "192.168.50.4")
				api.Put(fake.NewReservation("192.168.50.4", "longhorn-system/im-z"))
			},
			want:   []string{"192.168.50.8"},
			podRef: "longhorn-system/im-z",
		},
		{
			name: "the pod's new sandbox holds the address",
			between: func(api *fake.API) {
				p := api.Pool(ns, storage)
				p.Spec.Allocations["4"] = alloc{ContainerID: "newer", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
				_, err := api.UpdatePool(ns, p)
				require.NoError(t, err)
			},
			want:   []string{"192.168.50.8"},
			podRef: "longhorn-system/im-a",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, api, _ := newStore(storageNetwork()...)
			plan, err := s.Plan(context.Background(), storage, "", shim.Attachment("old1", "lhnet1", nil, nil))
			require.NoError(t, err)
			once := false
			api.Hook = func(c *fake.Call) error {
				// Whereabouts, just before we take the Lease.
				if c.Resource == fake.Leases && !once {
					once = true
					tt.between(api)
				}
				return nil
			}
			deleted, err := s.ReleaseReservations(context.Background(), plan)
			require.NoError(t, err)
			assert.Equal(t, tt.want, deleted)
			var o *shim.Reservation
			for _, r := range api.AllReservations(ns) {
				if r.Name == "192.168.50.4" {
					o = &r
				}
			}
			if tt.podRef == "" {
				assert.Nil(t, o)
			} else {
				require.NotNil(t, o)
				assert.Equal(t, tt.podRef, o.Spec.PodRef)
			}
		})
	}
}

// gateClock is a syncClock whose waits say so on waiting, then wait until
// open is closed.
type gateClock struct {
	syncClock
	waiting chan struct{}
	open    chan struct{}
}

func (c *gateClock) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case c.waiting <- struct{}{}:
	default:
	}
	select {
	case <-c.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.syncClock.Sleep(ctx, d)
}

// Two holders of one name (two agents of a node, each pid 1 in its
// container) are two holders: the second finds the Lease under its own
// name in a record it did not write, and waits for it as for any other
// holder's, never taking a turn while the first is in its own.
func TestTwoHoldersOfOneNameNeverShareATurn(t *testing.T) {
	const name = "harvester-ipam-agent/n1/1"
	type locker func(context.Context, func(context.Context, *shim.Locked) error) error
	store := func(api shim.API, c shim.Clock) (locker, func()) {
		s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Identity: name})
		return s.Locked, func() {}
	}
	group := func(api shim.API, c shim.Clock) (locker, func()) {
		g := &shim.Group{Identity: name}
		s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Group: g})
		return s.Locked, func() { require.NoError(t, g.Wait(context.Background())) }
	}
	for _, tt := range []struct {
		name          string
		first, second func(shim.API, shim.Clock) (locker, func())
	}{
		{"two stores", store, store},
		{"two groups", group, group},
		{"a store, then a group", store, group},
		{"a group, then a store", group, store},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			c := &gateClock{syncClock: syncClock{now: testEpoch}, waiting: make(chan struct{}, 1), open: make(chan struct{})}
			first, waitFirst := tt.first(api, c)
			second, waitSecond := tt.second(api, c)
			var inside, most atomic.Int32
			enter := func() {
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
			}
			secondIn := make(chan struct{})
			secondDone := make(chan error, 1)
			err := first(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				enter()
				defer inside.Add(-1)
				require.NoError(t, l.Keep(ctx))
				go func() {
					secondDone <- second(context.Background(), func(ctx context.Context, l *shim.Locked) error {
						enter()
						defer inside.Add(-1)
						close(secondIn)
						return l.Keep(ctx)
					})
				}()
				select {
				case <-c.waiting:
				case <-secondIn:
					t.Error("the second took a turn while the first was in its own")
				case <-time.After(10 * time.Second):
					t.Error("the second neither waited nor took a turn")
				}
				return nil
			})
			require.NoError(t, err)
			close(c.open)
			waitFirst()
			require.NoError(t, <-secondDone)
			waitSecond()
			assert.EqualValues(t, 1, most.Load(), "never two in a turn at once")
			assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "handed back")
		})
	}
}

// handBackFails is the API server, failing the first hand back of the
// Lease as a timeout does (not applied).
type handBackFails struct {
	*fake.API
	mu     sync.Mutex
	failed bool
}

func (a *handBackFails) UpdateLease(ctx context.Context, l *shim.Lease) (*shim.Lease, error) {
	a.mu.Lock()
	fail := !a.failed && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == ""
	if fail {
		a.failed = true
	}
	a.mu.Unlock()
	if fail {
		return nil, errors.New("etcdserver: request timed out")
	}
	return a.API.UpdateLease(ctx, l)
}

// A group whose hand back failed left the Lease under its name, in the
// record it wrote: while nobody wrote it since, it is still the group's,
// taken at once with no transition. Once another process of the same name
// wrote it (renewed it), it is that holder's: waited out, one more
// transition.
func TestAGroupTakesItsNameOnTheLeaseOnlyAsItWroteIt(t *testing.T) {
	const name = "harvester-ipam-agent/n1/1"
	for _, tt := range []struct {
		name            string
		sameNameWrites  bool
		wantWait        time.Duration
		wantTransitions int32
	}{
		{name: "as it wrote it: taken at once, no transition", wantTransitions: 0},
		{name: "written since under its name: waited out, one more transition", sameNameWrites: true, wantWait: 5 * time.Second, wantTransitions: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := &handBackFails{API: fake.New()}
			api.Put(storageNetwork()...)
			c := &syncClock{now: testEpoch}
			g := &shim.Group{Identity: name}
			s := shim.New(api, ns, shim.Options{Clock: c, Random: func() float64 { return 0.5 }, Group: g})
			nothing := func(context.Context, *shim.Locked) error { return nil }
			require.NoError(t, s.Locked(context.Background(), nothing))
			require.NoError(t, g.Wait(context.Background()))
			l := api.Lease(ns, names.Lease)
			require.Equal(t, name, *l.Spec.HolderIdentity, "not handed back")
			if tt.sameNameWrites {
				l.Spec.RenewTime = &metav1.MicroTime{Time: c.Now()}
				_, err := api.API.UpdateLease(context.Background(), l)
				require.NoError(t, err)
			}
			start := c.Now()
			var during *shim.Lease
			require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
				during = api.Lease(ns, names.Lease)
				return nil
			}))
			require.NoError(t, g.Wait(context.Background()))
			waited := c.Now().Sub(start)
			assert.GreaterOrEqual(t, waited, tt.wantWait)
			assert.Less(t, waited, tt.wantWait+100*time.Millisecond)
			assert.Equal(t, tt.wantTransitions, *during.Spec.LeaseTransitions)
			assert.Equal(t, "", *api.Lease(ns, names.Lease).Spec.HolderIdentity, "handed back")
		})
	}
}

// Every write of a turn under the Lease is bounded by the 2 s that a
// request under it may take, not the store's 10 s call timeout: a
// reservation's create made under the Lease must not land after the 5 s
// Lease may have passed to whereabouts. Alone and in a Group. (A read that
// lands late changes nothing: it keeps the store's timeout; so does a
// release's removal of its own entries, safe whenever it lands:
// TestAReleaseInOneTurnOutlastsASlowPatchOfItsEntries.)
func TestRequestsUnderTheLeaseAreBoundedByItsCallTimeout(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("group %v", group), func(t *testing.T) {
			api := fake.New()
			var under, outside time.Duration
			api.Hook = func(c *fake.Call) error {
				if c.Resource == fake.Reservations && c.Verb == "create" {
					d, ok := c.Ctx.Deadline()
					require.True(t, ok, "a deadline on every request")
					if under == 0 {
						under = time.Until(d)
					} else {
						outside = time.Until(d)
					}
				}
				return nil
			}
			o := shim.Options{LeaseRetry: time.Millisecond}
			if group {
				o.Group = &shim.Group{Identity: "g"}
			}
			s := shim.New(api, "kube-system", o)
			spec := shim.ReservationSpec{PodRef: "default/p", ContainerID: "c1"}
			require.NoError(t, s.Locked(context.Background(), func(ctx context.Context, l *shim.Locked) error {
				_, err := s.Reserve(ctx, "10.0.0.1", spec)
				return err
			}))
			_, err := s.Reserve(context.Background(), "10.0.0.2", spec)
			require.NoError(t, err)
			assert.LessOrEqual(t, under, 2*time.Second, "under the Lease")
			assert.Greater(t, outside, 2*time.Second, "outside it, the store's call timeout")
		})
	}
}

// Options.Turn is told of each turn under the Lease, with the identity it
// is held as: it begins with the Lease held, and ends before the Lease is
// handed back, also when the turn panics; alone and in a Group.
func TestOptionsTurnSeesEachTurnUnderTheLease(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("group %v", group), func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			holderNow := func() string {
				if l := api.Lease(ns, names.Lease); l != nil && l.Spec.HolderIdentity != nil {
					return *l.Spec.HolderIdentity
				}
				return ""
			}
			var events []string
			o := shim.Options{Clock: &syncClock{now: testEpoch}, Random: func() float64 { return 0.5 }, Identity: "harvester-ipam/n1/7",
				Turn: func(holder string) func() {
					events = append(events, "begin "+holder+" held by "+holderNow())
					return func() { events = append(events, "end "+holder+" held by "+holderNow()) }
				}}
			want := "harvester-ipam/n1/7"
			var g *shim.Group
			if group {
				g = &shim.Group{Identity: "harvester-ipam-agent/n1/u/1"}
				o.Group, want = g, g.Identity
			}
			s := shim.New(api, ns, o)
			require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
				events = append(events, "fn")
				return nil
			}))
			assert.PanicsWithValue(t, "boom", func() {
				_ = s.Locked(context.Background(), func(context.Context, *shim.Locked) error { panic("boom") })
			})
			if g != nil {
				require.NoError(t, g.Wait(context.Background()))
			}
			held := " held by " + want
			assert.Equal(t, []string{"begin " + want + held, "fn", "end " + want + held, "begin " + want + held, "end " + want + held}, events)
			assert.Equal(t, "", holderNow(), "handed back")
		})
	}
}
