package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a request, the metrics' outcome label.
const (
	outcomeServed    = "served"    // done, and answered with its result
	outcomeFailed    = "failed"    // done, and answered with its CNI error
	outcomeDeclined  = "declined"  // not taken: the plugin did it alone
	outcomeAbandoned = "abandoned" // received or acknowledged, and the client never said go
	outcomeLost      = "lost"      // done, and the client was gone before the answer
	outcomeRefused   = "refused"   // a peer that is not root
)

// Metrics counts the agent's requests: by command, outcome and (for a
// decline) reason, and the time each served one took, from its connection
// to its answer; and its probes (the readiness probe's, every few seconds),
// by result alone, apart from the verbs and the summary. Nil counts nothing.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	probes   *prometheus.CounterVec
	// declining is the reason the server declines every request now
	// ("": none), set by New; nil until then.
	declining atomic.Pointer[func() string]

	mu    sync.Mutex
	since map[string]int // outcome [reason] -> count since the last Summary
}

// NewMetrics registers the agent's series in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harvester_ipam_agent_requests_total",
			Help: "Requests to the node agent, by CNI command and outcome (served, failed, declined, abandoned, lost, refused), and for declines the reason.",
		}, []string{"command", "outcome", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "harvester_ipam_agent_request_duration_seconds",
			Help:    "Time from a request's connection to its answer, for requests the agent did (served or failed).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"command", "outcome"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harvester_ipam_agent_probes_total",
			Help: "Probes of the node agent (harvester-ipam-agent probe, its readiness probe), by result: served, or declined while it cannot serve.",
		}, []string{"result"}),
		since: map[string]int{},
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.probes)
		for _, reason := range DecliningReasons {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "harvester_ipam_agent_declining",
				Help:        "1 while the node agent declines every request, its readiness probe's too, for this reason (stopping; unhealthy: it cannot reach the pools as itself; behind: its copy of the pools may not follow the cluster), else 0. The plugin then does every verb alone.",
				ConstLabels: prometheus.Labels{"reason": reason},
			}, func() float64 {
				if f := m.declining.Load(); f != nil && (*f)() == reason {
					return 1
				}
				return 0
			}))
		}
	}
	return m
}

// DecliningReasons are the reasons the agent declines every request for,
// each a series of harvester_ipam_agent_declining.
var DecliningReasons = []string{"stopping", "unhealthy", "behind"}

// declines tells m why the server declines every request now.
func (m *Metrics) declines(reason func() string) {
	if m != nil {
		m.declining.Store(&reason)
	}
}

func (m *Metrics) count(command, outcome, reason string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(command, outcome, reason).Inc()
	key := outcome
	if reason != "" {
		key += " (" + reason + ")"
	}
	m.mu.Lock()
	m.since[key]++
	m.mu.Unlock()
}

func (m *Metrics) probe(result string) {
	if m == nil {
		return
	}
	m.probes.WithLabelValues(result).Inc()
}

func (m *Metrics) refused() { m.count("", outcomeRefused, "") }

func (m *Metrics) observe(command, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(command, outcome).Observe(d.Seconds())
}

// Summary is one line of what happened since the last Summary ("" when
// nothing did): for the log, where metrics are not scraped.
func (m *Metrics) Summary() string {
	if m == nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.since) == 0 {
		return ""
	}
	var parts []string
	for k, n := range m.since {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	m.since = map[string]int{}
	return strings.Join(parts, ", ")
}

// ServeMetrics serves h (the registry's /metrics) at addr until ctx ends.
// The agent runs in the host's network: in a rollout the new agent starts
// while the old one still holds the port, so a bind that fails is tried
// again every retry until it succeeds or ctx ends; the log says so twice,
// at the first failure and at the bind, not at every try. Once ctx ends the
// port is let go at once, for the next agent.
func ServeMetrics(ctx context.Context, addr string, h http.Handler, retry time.Duration, logf func(format string, a ...any)) {
	var lc net.ListenConfig
	failed := false
	for {
		l, err := lc.Listen(ctx, "tcp", addr)
		if err == nil {
			if failed {
				logf("metrics: serving %s", addr)
			}
			serveMetrics(ctx, l, h, logf)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if !failed {
			logf("metrics: %v; trying again every %s until it is free", err, retry)
			failed = true
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func serveMetrics(ctx context.Context, l net.Listener, h http.Handler, logf func(format string, a ...any)) {
	ms := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			ms.Close()
		case <-stopped:
		}
	}()
	if err := ms.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logf("metrics: %v", err)
	}
}
