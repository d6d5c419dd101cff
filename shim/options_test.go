package shim_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// A conflicting write is tried Steps times in all, waiting Duration, then
// Factor times more each time up to Cap, each wait stretched by Jitter times
// the random draw; the zero Backoff is DefaultBackoff.
func TestRetriesBackOff(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, tt := range []struct {
		name    string
		backoff shim.Backoff
		random  float64
		want    []time.Duration
	}{{
		name:    "capped, with jitter",
		backoff: shim.Backoff{Steps: 6, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 50 * time.Millisecond},
		random:  0.5,
		want:    []time.Duration{ms(12.5), ms(25), ms(50), ms(62.5), ms(62.5)},
	}, {
		name:    "no cap, no jitter",
		backoff: shim.Backoff{Steps: 4, Duration: 10 * time.Millisecond, Factor: 3},
		random:  0.5,
		want:    []time.Duration{ms(10), ms(30), ms(90)},
	}, {
		name:    "one step: no retry",
		backoff: shim.Backoff{Steps: 1, Duration: 10 * time.Millisecond, Factor: 3},
		want:    nil,
	}, {
		name:   "the default: 12 attempts over about 2.5 s",
		random: 0,
		want: []time.Duration{ms(10), ms(15), ms(22.5), ms(33.75), ms(50.625), ms(75.9375), ms(113.90625), ms(170.859375),
			ms(256.2890625), ms(384.43359375), ms(500)},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.New()
			api.Put(storageNetwork()...)
			c := &recClock{}
			s := shim.New(api, ns, shim.Options{Backoff: tt.backoff, Clock: c, Random: func() float64 { return tt.random }})
			patches := conflictOnPatch(api)
			err := s.SetPoolAnnotation(context.Background(), storage, "k", func(*shim.Pool) string { return "v" })
			require.Error(t, err)
			assert.True(t, apierrors.IsConflict(err), "the last conflict is returned: %v", err)
			assert.Equal(t, len(tt.want)+1, *patches, "attempts")
			assert.EqualValues(t, len(tt.want), s.Retried())
			require.Len(t, c.waits, len(tt.want))
			for i := range tt.want {
				assert.InDelta(t, float64(tt.want[i]), float64(c.waits[i]), float64(time.Microsecond), "wait %d", i+1)
			}
		})
	}
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

func TestRealClock(t *testing.T) {
	var c shim.RealClock
	assert.WithinDuration(t, time.Now(), c.Now(), time.Second)
	start := time.Now()
	require.NoError(t, c.Sleep(context.Background(), 20*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	assert.ErrorIs(t, c.Sleep(ctx, time.Hour), context.Canceled)
	assert.Less(t, time.Since(start), time.Minute)
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
