package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/harvester/harvester-ipam/shim/reconcile"
)

// metrics serves the loop's state in Prometheus' text format; a handful of
// series do not warrant the client library's weight.
type metrics struct {
	mu                          sync.Mutex
	candidates, requests        int
	releasedAllocs, deletedORIP int
	errors, passes              int
	lastRun, lastSuccess        time.Time
	duration                    time.Duration
}

func (m *metrics) observe(rep *reconcile.Report, err error, took time.Duration, requests int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.passes++
	m.lastRun = time.Now()
	m.duration = took
	m.requests = int(requests)
	if err != nil {
		m.errors++
		return
	}
	m.candidates = rep.Candidates()
	m.releasedAllocs += len(rep.Released)
	m.deletedORIP += len(rep.DeletedORIPs)
	m.errors += len(rep.Errors)
	if len(rep.Errors) == 0 {
		m.lastSuccess = m.lastRun
	}
}

func (m *metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	p := func(name, typ, help string, v any, labels string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s%s %v\n", name, help, name, typ, name, labels, v)
	}
	p("harvester_ipam_reconciler_candidates", "gauge", "Stale entries found by the last pass.", m.candidates, "")
	fmt.Fprintf(w, "# HELP harvester_ipam_reconciler_releases_total Entries released.\n# TYPE harvester_ipam_reconciler_releases_total counter\n")
	fmt.Fprintf(w, "harvester_ipam_reconciler_releases_total{kind=\"allocation\"} %d\n", m.releasedAllocs)
	fmt.Fprintf(w, "harvester_ipam_reconciler_releases_total{kind=\"reservation\"} %d\n", m.deletedORIP)
	p("harvester_ipam_reconciler_errors_total", "counter", "Passes that failed and entries a pass could not handle.", m.errors, "")
	p("harvester_ipam_reconciler_passes_total", "counter", "Passes run.", m.passes, "")
	p("harvester_ipam_reconciler_last_run_timestamp_seconds", "gauge", "When the last pass ended.", unix(m.lastRun), "")
	p("harvester_ipam_reconciler_last_success_timestamp_seconds", "gauge", "When the last pass that handled everything ended.", unix(m.lastSuccess), "")
	p("harvester_ipam_reconciler_pass_duration_seconds", "gauge", "How long the last pass took.", m.duration.Seconds(), "")
	p("harvester_ipam_reconciler_api_requests", "gauge", "API requests the last pass made.", m.requests, "")
}

func unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}
