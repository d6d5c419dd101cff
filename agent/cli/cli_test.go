package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/wire"
)

// defaults are the command's flags' defaults (cmd/harvester-ipam-agent).
func defaults() Options {
	return Options{
		Socket: wire.DefaultSocket, NodeFile: wire.NodeFile, Checkpoints: conf.DefaultCheckpointDir, Namespaces: "kube-system",
		MetricsAddr: "127.0.0.1:9422", MaxInFlight: 256, Summary: time.Minute, CheckEvery: 30 * time.Second, Grace: 25 * time.Second,
		NodeConfig: conf.DefaultNodeConfig, Version: "dev",
	}
}

// runAgent runs an agent as the command does, until stop (its SIGTERM); wait
// returns what Run returned.
func runAgent(o Options) (stop func(), wait func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	var once sync.Once
	var err error
	return cancel, func() error {
		once.Do(func() { err = <-done })
		return err
	}
}

// syncBuffer is an agent's stderr: written from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The agent, started against an API server it cannot reach: it binds its
// socket, tells the plugin where it is, declines (its probe fails, saying
// why) and, stopped, removes its socket.
func TestTheAgentStartsDeclinesAndStops(t *testing.T) {
	dir, err := os.MkdirTemp("", "hia")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	kc := filepath.Join(dir, "agent.kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: a, context: {cluster: c, user: u}}]
current-context: a
`), 0o600))
	sock := filepath.Join(dir, "run", "agent.sock")
	nodeFile := filepath.Join(dir, "net.d", "harvester-ipam.d", "agent.conf")
	checkpoints := filepath.Join(dir, "checkpoints")
	require.NoError(t, os.MkdirAll(checkpoints, 0o755)) // as a hostPath volume makes it
	o := defaults()
	o.Kubeconfig, o.Socket, o.NodeFile, o.MetricsAddr, o.Checkpoints = kc, sock, nodeFile, "", checkpoints
	log := &syncBuffer{}
	o.Stderr = log
	stop, wait := runAgent(o)
	defer stop()

	require.Eventually(t, func() bool { _, err := os.Stat(nodeFile); return err == nil }, 30*time.Second, 10*time.Millisecond)
	b, err := os.ReadFile(nodeFile)
	require.NoError(t, err)
	var nc wire.NodeConf
	require.NoError(t, json.Unmarshal(b, &nc))
	assert.Equal(t, sock, nc.Socket)
	st, err := os.Stat(nodeFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())

	st, err = os.Stat(checkpoints)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the checkpoint directory, root's only")

	err = Probe(context.Background(), sock, 2*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not serving: node agent declined: cannot reach the pools as itself: namespace kube-system")

	stop() // SIGTERM
	require.NoError(t, wait(), "%s", log.String())
	_, err = os.Lstat(sock)
	assert.True(t, os.IsNotExist(err), "the socket is removed")
	assert.Contains(t, log.String(), "stopping: no new requests")
}

// The agent holds whereabouts' Lease under a name of its own start: its
// pod's UID (the downward API's POD_UID; the host name, the pod's name,
// without it) and a random part, so that two agents of a node (a rollout,
// two releases, a crashed one's replacement: pid 1 in every container, and
// the same pod's UID after a container restart) are never one holder.
func TestTheAgentsLeaseIdentityIsItsStartsOwn(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	for _, tt := range []struct {
		name       string
		env        map[string]string
		wantPrefix string
	}{
		{"the pod's UID", map[string]string{"POD_UID": "0f8d5f1e-7c4b-4a57-9d1e-3b7f3e2c9a10"}, "harvester-ipam-agent/n1/0f8d5f1e-7c4b-4a57-9d1e-3b7f3e2c9a10/"},
		{"no POD_UID: the host name", nil, "harvester-ipam-agent/n1/" + host + "/"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			a, b := identity("n1", getenv), identity("n1", getenv)
			assert.NotEqual(t, a, b, "two starts with the same pod UID and pid")
			for _, id := range []string{a, b} {
				require.True(t, strings.HasPrefix(id, tt.wantPrefix), id)
				assert.Regexp(t, `^[0-9a-f]{8}$`, strings.TrimPrefix(id, tt.wantPrefix), "a random part")
			}
		})
	}
}

// A rollout on a node: the new agent starts while the old one holds the
// metrics port (both in the host's network); once the old one stops, the new
// one binds it and serves its metrics.
func TestAfterARolloutTheNewAgentServesTheMetrics(t *testing.T) {
	dir, err := os.MkdirTemp("", "hia")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	kc := filepath.Join(dir, "agent.kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: a, context: {cluster: c, user: u}}]
current-context: a
`), 0o600))
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := free.Addr().String()
	require.NoError(t, free.Close())
	scrape := func() error {
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}
	run := func(log *syncBuffer) (stop func(), wait func() error) {
		o := defaults()
		o.Kubeconfig, o.Socket, o.NodeFile, o.Checkpoints, o.MetricsAddr = kc, filepath.Join(dir, "run", "agent.sock"), "", filepath.Join(dir, "checkpoints"), addr
		o.Stderr = log
		stop, wait = runAgent(o)
		t.Cleanup(func() { stop(); _ = wait() })
		return stop, wait
	}
	var oldLog, newLog syncBuffer
	stopOld, waitOld := run(&oldLog)
	require.Eventually(t, func() bool { return scrape() == nil }, 30*time.Second, 10*time.Millisecond, "the old agent's metrics")
	_, _ = run(&newLog)
	time.Sleep(3 * time.Second) // the new agent has tried more than once
	stopOld()                   // SIGTERM
	require.NoError(t, waitOld(), "%s", oldLog.String())
	require.Eventually(t, func() bool { return scrape() == nil }, 10*time.Second, 50*time.Millisecond,
		"the new agent serves the metrics once the old one let go (its log: %s)", newLog.String())
	assert.Equal(t, 1, strings.Count(newLog.String(), "address already in use"), "one line for the failed binds: %s", newLog.String())
	assert.Contains(t, newLog.String(), "metrics: serving "+addr)
}
