package cli

import (
	"math/big"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/harvester/harvester-ipam/reconcile"
)

// metrics are the loop's series, in a registry of its own (nothing another
// package registers globally leaks in), served at /metrics only. The chart's
// alerts and dashboard use these names: change none without them.
type metrics struct {
	reg *prometheus.Registry

	releases    *prometheus.CounterVec
	errors      prometheus.Counter
	passes      prometheus.Counter
	candidates  prometheus.Gauge
	lastRun     prometheus.Gauge
	lastSuccess prometheus.Gauge
	duration    prometheus.Gauge
	requests    prometheus.Gauge
	pools       *poolCollector
}

func newMetrics(poolNamespace string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harvester_ipam_reconciler_releases_total",
			Help: "Entries released: stale pool allocations (kind=allocation) and orphaned reservations (kind=reservation).",
		}, []string{"kind"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harvester_ipam_reconciler_errors_total",
			Help: "Passes that failed, and entries a pass could not handle.",
		}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harvester_ipam_reconciler_passes_total",
			Help: "Passes run.",
		}),
		candidates: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harvester_ipam_reconciler_candidates",
			Help: "Stale entries (allocations, reservations, orphaned pools) the last pass found.",
		}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harvester_ipam_reconciler_last_run_timestamp_seconds",
			Help: "When the last pass ended (Unix seconds).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harvester_ipam_reconciler_last_success_timestamp_seconds",
			Help: "When the last pass that handled everything ended (Unix seconds); 0 before the first.",
		}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harvester_ipam_reconciler_pass_duration_seconds",
			Help: "How long the last pass took.",
		}),
		requests: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harvester_ipam_reconciler_api_requests",
			Help: "API requests the last pass made.",
		}),
		pools: &poolCollector{namespace: poolNamespace},
	}
	// Both kinds are there from the start: a rate() needs the zero.
	m.releases.WithLabelValues("allocation")
	m.releases.WithLabelValues("reservation")
	m.reg.MustRegister(m.releases, m.errors, m.passes, m.candidates, m.lastRun, m.lastSuccess, m.duration, m.requests, m.pools,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe records one pass. A pass that failed leaves the pool gauges as the
// last good pass left them: dropping them would resolve a "nearly full"
// alert because the API server was unreachable; the last-success gauge says
// how old they are.
func (m *metrics) observe(rep *reconcile.Report, err error, took time.Duration, requests int64) {
	now := time.Now()
	m.passes.Inc()
	m.lastRun.Set(float64(now.Unix()))
	m.duration.Set(took.Seconds())
	m.requests.Set(float64(requests))
	if err != nil {
		m.errors.Inc()
		return
	}
	m.candidates.Set(float64(rep.Candidates()))
	m.releases.WithLabelValues("allocation").Add(float64(len(rep.Released)))
	m.releases.WithLabelValues("reservation").Add(float64(len(rep.DeletedORIPs)))
	m.errors.Add(float64(len(rep.Errors)))
	if len(rep.Errors) == 0 {
		m.lastSuccess.Set(float64(now.Unix()))
	}
	m.pools.set(rep.Stats)
}

// handler serves the registry at /metrics, and nothing anywhere else.
func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	return mux
}

// poolCollector makes the per-pool gauges from the last pass's figures at
// each scrape: a pool that is gone from the pass is gone from the gauges, with
// no series to delete by hand.
type poolCollector struct {
	namespace string
	mu        sync.Mutex
	stats     []reconcile.PoolStats
}

var (
	poolLabels = []string{"namespace", "pool"}
	poolSize   = prometheus.NewDesc("harvester_ipam_pool_size",
		"Addresses whereabouts may hand out of the pool: the range's usable addresses within range_start/range_end, without the excludes of the NAD that names it (the range's alone when no NAD naming it was read).", poolLabels, nil)
	poolAllocated = prometheus.NewDesc("harvester_ipam_pool_allocated",
		"Entries in the pool's spec.allocations.", poolLabels, nil)
	poolStale = prometheus.NewDesc("harvester_ipam_pool_stale",
		"Entries the reconciler judges stale (pod, sandbox or node gone), not yet released.", poolLabels, nil)
	poolFree = prometheus.NewDesc("harvester_ipam_pool_free",
		"Addresses whereabouts can still hand out: size minus the entries inside it, never negative.", poolLabels, nil)
	poolStaleOldest = prometheus.NewDesc("harvester_ipam_pool_stale_oldest_seconds",
		"How long the pool's oldest recorded stale entry has been stale; 0 when none.", poolLabels, nil)
)

func (c *poolCollector) set(stats []reconcile.PoolStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats = stats
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolSize, poolAllocated, poolStale, poolFree, poolStaleOldest} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.stats {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, c.namespace, s.Pool)
		}
		g(poolSize, bigFloat(s.Size))
		g(poolAllocated, float64(s.Allocated))
		g(poolStale, float64(s.Stale))
		g(poolFree, bigFloat(s.Free))
		g(poolStaleOldest, s.OldestStale.Seconds())
	}
}

// bigFloat is a count as a float: an IPv6 range's exceeds any integer type.
func bigFloat(n *big.Int) float64 {
	if n == nil {
		return 0
	}
	f, _ := new(big.Float).SetInt(n).Float64()
	return f
}
