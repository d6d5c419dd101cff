package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In a rollout the new agent starts while the old one (the host's network,
// the same port) still serves its metrics: the new one binds once the old
// one lets go, saying so in two lines (the first failure, then the bind),
// not one a try; and, stopped, it lets go of the port in turn.
func TestTheMetricsBindOnceThePortIsFree(t *testing.T) {
	old, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := old.Addr().String()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.probe(outcomeServed)

	var log syncBuffer
	logf := func(format string, a ...any) { fmt.Fprintf(&log, format+"\n", a...) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeMetrics(ctx, addr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), 20*time.Millisecond, logf)
	}()
	defer func() {
		cancel()
		<-done
	}()
	time.Sleep(200 * time.Millisecond) // several tries
	require.NoError(t, old.Close())

	scrape := func() (string, error) {
		c := &http.Client{Timeout: time.Second}
		resp, err := c.Get("http://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s", resp.Status)
		}
		return string(b), err
	}
	var body string
	require.Eventually(t, func() bool { body, err = scrape(); return err == nil }, 10*time.Second, 10*time.Millisecond,
		"the metrics are served once the old agent lets go of %s (log: %q)", addr, log.String())
	assert.Contains(t, body, `harvester_ipam_agent_probes_total{result="served"} 1`)
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, 2, "a line for the first failure and one for the bind: %q", log.String())
	assert.Contains(t, lines[0], "address already in use")
	assert.Contains(t, lines[1], "serving "+addr)

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeMetrics did not return once stopped")
	}
	next, err := net.Listen("tcp", addr)
	require.NoError(t, err, "a stopped agent lets go of the port")
	next.Close()
}

// Stopped before the port is ever free, it gives up trying.
func TestTheMetricsStopTryingWhenTheAgentStops(t *testing.T) {
	old, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer old.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeMetrics(ctx, old.Addr().String(), http.NotFoundHandler(), 20*time.Millisecond, func(string, ...any) {})
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeMetrics did not return once stopped")
	}
}
