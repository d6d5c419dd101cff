package shim_test

import (
	"context"
	"errors"
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

var leases = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

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
		{name: "ours already (a crash under it): taken, no transition", held: lease("harvester-ipam/test", 5, 3), wantTransitions: 3},
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
