package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The test binary runs as the command when asked, so a test sees exactly
// what an operator's shell sees: the exit status and stderr.
func TestMain(m *testing.M) {
	if os.Getenv("RECONCILER_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"harvester-ipam-reconciler"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "RECONCILER_TEST_RUN_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err, "%s", out)
	return 0, string(out)
}

// A word the command does not know is refused before anything runs: a
// mistyped "inspect" must not become a releasing pass.
func TestStrayArgumentsAreRefused(t *testing.T) {
	// The kubeconfig does not exist: a command that got past its flags
	// fails on it (exit 1) without reaching any cluster.
	kc := "--kubeconfig=" + t.TempDir() + "/missing"
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"inspct", kc}, 2, `unexpected argument "inspct"`},
		{[]string{kc, "inspect"}, 2, `unexpected argument "inspect" (inspect comes first)`},
		{[]string{"--dry-run", "inspect", kc}, 2, `unexpected argument "inspect"`},
		{[]string{"inspect", kc, "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--need", "3", kc}, 2, "--need takes a count above 0, with inspect"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{kc}, 1, "kubeconfig:"},
		{[]string{"inspect", kc}, 1, "kubeconfig:"},
		// A pass's flags after inspect: it would only inspect, and say
		// nothing of the pass the operator asked for.
		{[]string{"inspect", "--grace", "0", "--dry-run", kc}, 2, "inspect writes nothing and takes no --dry-run, --grace: a pass's dry run is harvester-ipam-reconciler --grace 0 --dry-run, without inspect"},
		{[]string{"inspect", "--grace=0", kc}, 2, "takes no --grace"},
		{[]string{"inspect", "--interval", "1m", kc}, 2, "takes no --interval"},
		{[]string{"--grace", "0", "--dry-run", kc}, 1, "kubeconfig:"},
	} {
		code, out := runMain(t, tc.args...)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, out)
		assert.Contains(t, out, tc.says, "%v", tc.args)
	}
}

// --help explains each mode (a pass, a dry run, inspect, --need) and every
// exit code; --version names the build; neither reaches a cluster.
func TestHelpAndVersion(t *testing.T) {
	code, out := runMain(t, "--help")
	assert.Equal(t, 0, code, out)
	for _, want := range []string{"inspect [--need N]", "--grace 0 --dry-run", "Exit status: 0", "1 the pass or the", "2 bad", "3 (inspect --need)", "kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler inspect", "standby"} {
		assert.Contains(t, out, want)
	}
	code, out = runMain(t, "inspect", "-h")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "Exit status")
	code, out = runMain(t, "--version")
	assert.Equal(t, 0, code, out)
	assert.Equal(t, "harvester-ipam-reconciler dev\n", out)
}

// standby, the chart's diagnostics container, runs until it is stopped and
// then exits 0 at once, reaching no cluster: it only holds the container
// where an operator's kubectl exec runs the reconciler under its own limits.
func TestStandbyWaitsUntilStopped(t *testing.T) {
	cmd := exec.Command(os.Args[0], "standby")
	cmd.Env = append(os.Environ(), "RECONCILER_TEST_RUN_MAIN=1", "KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// Its first line says it catches SIGTERM now: a SIGTERM before it would
	// kill it (the default), however long a busy machine takes to start it.
	first, err := bufio.NewReader(stderr).ReadString('\n')
	require.NoError(t, err, "standby says it stands by")
	assert.Contains(t, first, "standing by until stopped")
	var out strings.Builder
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, stderr); close(copied) }()
	done := make(chan error, 1)
	go func() { <-copied; done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("standby exited by itself: %v: %s", err, out.String())
	case <-time.After(500 * time.Millisecond):
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		assert.NoError(t, err, "exit 0 when stopped: %s", out.String())
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("standby did not stop on SIGTERM")
	}
	assert.Empty(t, out.String(), "nothing logged: the container's log stays empty")

	code, msg := runMain(t, "standby", "extra")
	assert.Equal(t, 2, code, msg)
}
