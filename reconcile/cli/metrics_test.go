package cli

import (
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

func scrape(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Code, string(b)
}

func stats(pool string, size, free int64, allocated, stale int, oldest time.Duration) reconcile.PoolStats {
	return reconcile.PoolStats{Pool: pool, Range: "x", Allocated: allocated, Stale: stale, OldestStale: oldest,
		Usage: reconcile.Usage{Size: big.NewInt(size), Free: big.NewInt(free)}}
}

// The metrics the chart's alerts and dashboard use, at /metrics only; a
// pool gone from a pass is gone from the gauges; a failed pass keeps the
// last good figures and counts an error.
func TestMetrics(t *testing.T) {
	m := newMetrics("kube-system")
	h := m.handler()
	for _, path := range []string{"/", "/healthz", "/metrics/", "/metricsx"} {
		code, _ := scrape(t, h, path)
		assert.Equal(t, http.StatusNotFound, code, path)
	}

	rep := &reconcile.Report{
		Rows:         make([]reconcile.Row, 3),
		Released:     make([]shim.Allocation, 2),
		DeletedORIPs: []string{"192.168.50.9"},
		Stats: []reconcile.PoolStats{
			stats("192.168.50.0-27", 28, 3, 25, 2, 90*time.Minute),
			stats("10.9.0.0-24", 254, 254, 0, 0, 0),
		},
	}
	m.observe(rep, nil, 1500*time.Millisecond, 17)
	code, body := scrape(t, h, "/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, line := range []string{
		`harvester_ipam_pool_size{namespace="kube-system",pool="192.168.50.0-27"} 28`,
		`harvester_ipam_pool_allocated{namespace="kube-system",pool="192.168.50.0-27"} 25`,
		`harvester_ipam_pool_stale{namespace="kube-system",pool="192.168.50.0-27"} 2`,
		`harvester_ipam_pool_free{namespace="kube-system",pool="192.168.50.0-27"} 3`,
		`harvester_ipam_pool_stale_oldest_seconds{namespace="kube-system",pool="192.168.50.0-27"} 5400`,
		`harvester_ipam_pool_stale_oldest_seconds{namespace="kube-system",pool="10.9.0.0-24"} 0`,
		`harvester_ipam_reconciler_releases_total{kind="allocation"} 2`,
		`harvester_ipam_reconciler_releases_total{kind="reservation"} 1`,
		`harvester_ipam_reconciler_errors_total 0`,
		`harvester_ipam_reconciler_passes_total 1`,
		`harvester_ipam_reconciler_pass_duration_seconds 1.5`,
		`harvester_ipam_reconciler_candidates 3`,
		`harvester_ipam_reconciler_api_requests 17`,
		"# TYPE harvester_ipam_reconciler_releases_total counter",
		"# TYPE harvester_ipam_pool_free gauge",
	} {
		assert.Contains(t, body, line+"\n")
	}
	for _, prefix := range []string{"harvester_ipam_reconciler_last_success_timestamp_seconds 1.", "harvester_ipam_reconciler_last_run_timestamp_seconds 1."} {
		assert.Contains(t, body, prefix, "a Unix time")
	}

	// The old range's pool was deleted: its series go with it.
	rep.Stats = rep.Stats[:1]
	rep.Released, rep.DeletedORIPs = nil, nil
	m.observe(rep, nil, time.Second, 5)
	_, body = scrape(t, h, "/metrics")
	assert.NotContains(t, body, `pool="10.9.0.0-24"`)
	assert.Contains(t, body, `harvester_ipam_reconciler_releases_total{kind="allocation"} 2`+"\n", "a counter")

	// A pass that fails keeps the pools as the last good pass left them.
	m.observe(nil, errors.New("list pools: connection refused"), time.Second, 1)
	_, body = scrape(t, h, "/metrics")
	assert.Contains(t, body, `harvester_ipam_pool_free{namespace="kube-system",pool="192.168.50.0-27"} 3`+"\n")
	assert.Contains(t, body, "harvester_ipam_reconciler_errors_total 1\n")
	assert.Contains(t, body, "harvester_ipam_reconciler_passes_total 3\n")
}
