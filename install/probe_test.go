package install

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What the installer reads of a binary it probes: one supported version is
// enough when it is the one required; the about line is skel's first line of
// stderr, trimmed.
func TestProbeReadsWhatTheBinaryPrints(t *testing.T) {
	one := script(t, t.TempDir(), "one", `#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then echo '{"cniVersion":"0.3.1","supportedVersions":["0.3.1"]}'; exit 0; fi
printf '\n  whereabouts v0.7.0: about\nmore\n' >&2
`)
	about, supported, err := probe(context.Background(), one, Options{Require: []string{"0.3.1"}, Timeout: 10 * time.Second})
	require.NoError(t, err, "a binary of one CNI version, the one required")
	assert.Equal(t, []string{"0.3.1"}, supported)
	assert.Equal(t, "whereabouts v0.7.0: about", about)
}

// The probed binary, which may be anything found in the host's bin dir, runs
// with a PATH of the system's directories and nothing of the installer's
// environment (its service account's host and port, its own settings).
func TestProbeRunsTheBinaryInAFixedEnvironment(t *testing.T) {
	dir := t.TempDir()
	p := script(t, dir, "p", `#!/bin/sh
env > "$0.env"
echo '{"cniVersion":"0.3.1","supportedVersions":["0.3.1"]}'
`)
	t.Setenv("HARVESTER_IPAM_INSTALLER_ONLY", "x")
	_, err := versions(context.Background(), p, Options{Require: []string{"0.3.1"}, Timeout: 10 * time.Second})
	require.NoError(t, err)
	b, err := os.ReadFile(p + ".env")
	require.NoError(t, err)
	env := string(b)
	assert.Contains(t, strings.Split(env, "\n"), "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	assert.Contains(t, strings.Split(env, "\n"), "CNI_COMMAND=VERSION")
	assert.NotContains(t, env, "HARVESTER_IPAM_INSTALLER_ONLY")
}

// A binary that fails says why in the error, its output trimmed and cut at
// 500 bytes.
func TestRunErrorSaysWhatTheBinaryPrinted(t *testing.T) {
	p := script(t, t.TempDir(), "p", "#!/bin/sh\necho '  boom  ' >&2\nexit 1\n")
	_, err := run(context.Background(), p, 10*time.Second)
	require.Error(t, err)
	assert.True(t, strings.HasSuffix(err.Error(), ": boom"), "%q", err)

	for _, tt := range []struct{ in, want string }{
		{" \n" + strings.Repeat("a", 500) + "\n", strings.Repeat("a", 500)},
		{strings.Repeat("a", 501), strings.Repeat("a", 500) + "..."},
	} {
		assert.Equal(t, tt.want, trim([]byte(tt.in)))
	}
}

// fileSum takes any non-empty regular file, however small.
func TestFileSum(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one")
	require.NoError(t, os.WriteFile(one, []byte("x"), 0o600))
	_, err := fileSum(one)
	assert.NoError(t, err, "a file of one byte")
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = fileSum(empty)
	assert.ErrorContains(t, err, "is not a non-empty regular file")
	_, err = fileSum(dir)
	assert.ErrorContains(t, err, "is not a non-empty regular file")
}

// An installer waiting for another's lock on the bin dir gives up when its
// context ends: it never blocks in flock.
func TestLockDirWaitsUntilItsContextEnds(t *testing.T) {
	dir := t.TempDir()
	held, err := os.Open(dir)
	require.NoError(t, err)
	defer held.Close()
	require.NoError(t, syscall.Flock(int(held.Fd()), syscall.LOCK_EX))

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		unlock, err := lockDir(ctx, dir)
		if err == nil {
			unlock()
		}
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "wait for another installer's lock on "+dir)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(30 * time.Second):
		t.Fatal("lockDir still waits after its context ended: it blocks in flock")
	}
}

// A timeout is the caller's, however short; only zero means the default.
func TestProbeTimeoutIsTheCallers(t *testing.T) {
	o := Options{Source: plugin(t, "v1"), BinDir: t.TempDir(), Timeout: time.Nanosecond}
	_, err := Install(context.Background(), o)
	assert.ErrorContains(t, err, "no answer within 1ns")
}

// syncDir says when the directory to fsync is not there.
func TestSyncDir(t *testing.T) {
	assert.NoError(t, syncDir(t.TempDir()))
	assert.Error(t, syncDir(filepath.Join(t.TempDir(), "missing")))
}
