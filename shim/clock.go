package shim

import (
	"context"
	"math/rand/v2"
	"time"
)

// Clock is the time the store waits by: the real one, or the simulation's.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx ends.
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Backoff is how a conflicting write is retried: Steps attempts in all,
// waiting Duration, then Factor times more each time up to Cap, each wait
// stretched by up to Jitter of itself.
type Backoff struct {
	Steps    int
	Duration time.Duration
	Factor   float64
	Jitter   float64
	Cap      time.Duration
}

// DefaultBackoff retries a conflicting write up to 12 times over about 2.5 s:
// enough for a storm of writers on one pool, bounded for the runtime's timeout.
var DefaultBackoff = Backoff{Steps: 12, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 0.5, Cap: 500 * time.Millisecond}

// wait is the pause before retry n (n >= 1).
func (b Backoff) wait(n int, random func() float64) time.Duration {
	d := float64(b.Duration)
	for i := 1; i < n; i++ {
		d *= b.Factor
		if b.Cap > 0 && d > float64(b.Cap) {
			d = float64(b.Cap)
			break
		}
	}
	if b.Jitter > 0 {
		d += d * b.Jitter * random()
	}
	return time.Duration(d)
}

func defaultRandom() float64 { return rand.Float64() }
