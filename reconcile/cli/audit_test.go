package cli

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An audit whose informers are refused at start (an API server restarting,
// its RBAC not yet bound) is tried again, each try under a context of its
// own that ends when the try fails (its informers stop), the pause doubling
// up to its bound, until one runs; the log says why each time. Before, the
// first refusal left the Deployment without its audit for good.
func TestTheAuditIsTriedAgainUntilItRuns(t *testing.T) {
	var log bytes.Buffer
	var tries []context.Context
	var pauses []time.Duration
	start := func(ctx context.Context) error {
		tries = append(tries, ctx)
		if len(tries) < 4 {
			return errors.New("audit: timed out waiting for the pools to list")
		}
		return nil
	}
	pause := func(_ context.Context, d time.Duration) error { pauses = append(pauses, d); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keepAuditing(ctx, &log, start, pause, 10*time.Second, 30*time.Second)

	require.Len(t, tries, 4)
	for i, c := range tries[:3] {
		assert.Error(t, c.Err(), "try %d's context ended with it", i+1)
	}
	assert.NoError(t, tries[3].Err(), "the audit that runs keeps its context")
	assert.Equal(t, []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}, pauses)
	assert.Equal(t, 3, bytes.Count(log.Bytes(), []byte("harvester-ipam-reconciler: the audit does not run: audit: timed out waiting for the pools to list; trying again in ")))
	cancel()
	assert.Error(t, tries[3].Err(), "and ends with the reconciler")
}

// A reconciler stopped while it waits to try again stops trying.
func TestTheAuditIsNotTriedAgainOnceTheReconcilerStops(t *testing.T) {
	tries := 0
	start := func(context.Context) error { tries++; return errors.New("refused") }
	ctx, cancel := context.WithCancel(context.Background())
	pause := func(ctx context.Context, _ time.Duration) error { cancel(); return ctx.Err() }
	keepAuditing(ctx, &bytes.Buffer{}, start, pause, time.Second, time.Minute)
	assert.Equal(t, 1, tries)
}
