package main

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/agent/wire"
)

// build builds the command into a directory of the test's.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "harvester-ipam-agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func runBin(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	require.NoError(t, err)
	return string(out), 0
}

func TestFlags(t *testing.T) {
	bin := build(t)
	out, code := runBin(t, bin, "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "harvester-ipam-agent probe")
	assert.Contains(t, out, "-socket")
	out, code = runBin(t, bin, "--version")
	assert.Equal(t, 0, code)
	assert.Equal(t, "harvester-ipam-agent dev\n", out)
	out, code = runBin(t, bin, "serve")
	assert.Equal(t, 2, code)
	assert.Contains(t, out, `unexpected argument "serve"`)
	out, code = runBin(t, bin, "--namespace", " , ", "--kubeconfig", "/nonexistent")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--namespace names no namespace")
	out, code = runBin(t, bin, "probe", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "not serving: node agent at")
}

// The agent, started against an API server it cannot reach: it binds its
// socket, tells the plugin where it is, declines (its probe fails, saying
// why) and, stopped, removes its socket.
func TestTheAgentStartsDeclinesAndStops(t *testing.T) {
	bin := build(t)
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
	cmd := exec.Command(bin, "--kubeconfig", kc, "--socket", sock, "--node-file", nodeFile, "--metrics-addr", "", "--checkpoint-dir", checkpoints)
	var log strings.Builder
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()

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

	out, code := runBin(t, bin, "probe", "--socket", sock)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "not serving: node agent declined: cannot reach the pools as itself: namespace kube-system")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "%s", log.String())
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
	bin := build(t)
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
	start := func(log *strings.Builder) *exec.Cmd {
		cmd := exec.Command(bin, "--kubeconfig", kc, "--socket", filepath.Join(dir, "run", "agent.sock"), "--node-file", "",
			"--checkpoint-dir", filepath.Join(dir, "checkpoints"), "--metrics-addr", addr)
		cmd.Stderr = log
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	var oldLog, newLog strings.Builder
	old := start(&oldLog)
	require.Eventually(t, func() bool { return scrape() == nil }, 30*time.Second, 10*time.Millisecond, "the old agent's metrics")
	_ = start(&newLog)
	time.Sleep(3 * time.Second) // the new agent has tried more than once
	require.NoError(t, old.Process.Signal(syscall.SIGTERM))
	require.NoError(t, old.Wait(), "%s", oldLog.String())
	require.Eventually(t, func() bool { return scrape() == nil }, 10*time.Second, 50*time.Millisecond,
		"the new agent serves the metrics once the old one let go (its log: %s)", newLog.String())
	assert.Equal(t, 1, strings.Count(newLog.String(), "address already in use"), "one line for the failed binds: %s", newLog.String())
	assert.Contains(t, newLog.String(), "metrics: serving "+addr)
}
