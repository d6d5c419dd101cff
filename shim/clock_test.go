package shim_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

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
		// The smallest cap is a cap.
		name:    "a cap of a nanosecond",
		backoff: shim.Backoff{Steps: 3, Duration: 10 * time.Millisecond, Factor: 2, Cap: time.Nanosecond},
		want:    []time.Duration{ms(10), time.Nanosecond},
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
