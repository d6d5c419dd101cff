package agent

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

func probe(t *testing.T, sock string) client.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return (&client.Client{Socket: sock}).Do(ctx, wire.NewRequest(wire.Probe, nil, nil))
}

// serving is a server on l that answers probes, stopped with the test.
func serving(t *testing.T, r *rig, l *Listener) *Server {
	t.Helper()
	srv, err := New(r.srv.o)
	require.NoError(t, err)
	require.NoError(t, srv.Check(context.Background()))
	go func() { _ = srv.Serve(l) }()
	return srv
}

func TestTheSocketIsRootsOnly(t *testing.T) {
	dir := filepath.Join(shortDir(t), "run")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	l, err := Listen(filepath.Join(dir, "agent.sock"))
	require.NoError(t, err)
	defer l.Close()
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.ModeDir|0o700, st.Mode(), "the directory, made 0700 though it was 0755")
	st, err = os.Lstat(l.Path())
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket|0o600, st.Mode())

	_, err = Listen("agent.sock")
	assert.ErrorContains(t, err, "not an absolute path")
	file := filepath.Join(shortDir(t), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err = Listen(filepath.Join(file, "agent.sock"))
	assert.Error(t, err, "a socket directory that is a file")
}

// An agent that died leaves its socket: a client is refused at once (and
// falls back), and the next agent takes the path over.
func TestAStaleSocketIsRefusedThenReplaced(t *testing.T) {
	r := newRig(t)
	sock := filepath.Join(shortDir(t), "agent.sock")
	dead, err := Listen(sock)
	require.NoError(t, err)
	require.NoError(t, dead.UnixListener.Close()) // died: the file stays
	_, err = os.Lstat(sock)
	require.NoError(t, err, "the stale socket is there")
	res := probe(t, sock)
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Contains(t, res.Reason, syscall.ECONNREFUSED.Error())

	// A bind that never got its rename is cleared too.
	require.NoError(t, os.WriteFile(sock+".1.tmp", nil, 0o600))
	l, err := Listen(sock)
	require.NoError(t, err)
	defer l.Close()
	serving(t, r, l)
	assert.Equal(t, client.Served, probe(t, sock).Outcome)
	_, err = os.Stat(sock + ".1.tmp")
	assert.True(t, os.IsNotExist(err), "the stale temporary name is removed")
}

// Two agents on a node during a rollout: the new one takes the path over,
// the old one goes on serving what it accepted, and when it stops it
// leaves the new one's socket alone; the new one removes its own.
func TestTwoAgentsOnANode(t *testing.T) {
	r := newRig(t)
	sock := filepath.Join(shortDir(t), "agent.sock")
	old, err := Listen(sock)
	require.NoError(t, err)
	oldSrv := serving(t, r, old)
	assert.Equal(t, client.Served, probe(t, sock).Outcome)

	fresh, err := Listen(sock)
	require.NoError(t, err)
	serving(t, r, fresh)
	assert.False(t, old.Owns())
	assert.True(t, fresh.Owns())
	oldSrv.stopping.Store(true) // the old agent declines all it still gets
	assert.Equal(t, client.Served, probe(t, sock).Outcome, "clients reach the new agent")

	require.NoError(t, old.Close())
	_, err = os.Lstat(sock)
	require.NoError(t, err, "the old agent left the new one's socket")
	assert.Equal(t, client.Served, probe(t, sock).Outcome)

	require.NoError(t, fresh.Close())
	_, err = os.Lstat(sock)
	assert.True(t, os.IsNotExist(err), "the new agent removed its own socket")
	res := probe(t, sock)
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Contains(t, res.Reason, syscall.ENOENT.Error())
}

// peerHelperEnv makes this test binary a client of the socket it names
// (TestPeerHelper), run as another user by TestANonRootPeerIsRefused.
const peerHelperEnv = "HARVESTER_IPAM_AGENT_PEER_HELPER"

func TestPeerHelper(t *testing.T) {
	sock := os.Getenv(peerHelperEnv)
	if sock == "" {
		return // a helper process only
	}
	res := probe(t, sock)
	os.Stdout.WriteString("outcome=" + res.Outcome.String() + " reason=" + res.Reason + "\n")
}

// Only root is served: a client of another uid, which reaches the socket
// (here through a directory open to all), is refused without an ack.
func TestANonRootPeerIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs a client as another user: run it as root")
	}
	r := newRig(t)
	open := shortDir(t)
	require.NoError(t, os.Chmod(open, 0o755))
	sock := filepath.Join(open, "agent.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, os.Chmod(sock, 0o777))
	go func() { _ = r.srv.Serve(l) }()

	// The test binary, where user nobody may run it.
	self, err := os.Executable()
	require.NoError(t, err)
	bin := filepath.Join(open, "agent.test")
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))

	run := func(uid uint32) string {
		cmd := exec.Command(bin, "-test.run=^TestPeerHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), peerHelperEnv+"="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	out := run(65534)
	// Closed on it, before or after its request was written: no ack.
	assert.Regexp(t, `outcome=fallback reason=node agent: (send the request|read its acknowledgement): (broken pipe|connection reset by peer|EOF)\n`, out, "uid 65534")
	r.counted("", outcomeRefused, "", 1)
	assert.Contains(t, r.log.String(), "refused a connection from uid 65534")

	out = run(0)
	assert.True(t, strings.Contains(out, "outcome=served"), "uid 0: %s", out)
}

// A second agent on the node (a second release of the chart) takes the
// socket's path over; when it stops it removes its socket, and the path is
// empty while this agent still runs: no client reaches it, and its
// readiness fails. It listens at the path again.
func TestAnAgentWhoseSocketWasTakenAwayListensAgain(t *testing.T) {
	r := newRig(t)
	sock := filepath.Join(shortDir(t), "agent.sock")
	mine, err := Listen(sock)
	require.NoError(t, err)
	srv, err := New(r.srv.o)
	require.NoError(t, err)
	require.NoError(t, srv.Check(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeAt(ctx, mine, 20*time.Millisecond) }()
	assert.Equal(t, client.Served, probe(t, sock).Outcome)

	other, err := Listen(sock)
	require.NoError(t, err)
	require.NoError(t, other.Close(), "the other agent stops: its socket goes with it")
	require.Eventually(t, func() bool { return probe(t, sock).Outcome == client.Served }, 5*time.Second, 20*time.Millisecond,
		"this agent serves at the path again")

	cancel()
	require.NoError(t, <-done)
	_, err = os.Lstat(sock)
	assert.True(t, os.IsNotExist(err), "stopped, it removes its own socket")
}
