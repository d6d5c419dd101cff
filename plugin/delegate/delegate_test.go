package delegate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plugin writes a delegate named name into a CNI_PATH of its own: a shell
// script that notes its start (and counts its starts), copies its stdin to a
// file and then runs body. It returns the directory the script writes into.
func plugin(t *testing.T, name, body string) string {
	t.Helper()
	dir := t.TempDir()
	// The script says it started last of all: a test that kills it then
	// finds its start counted and stdin as read so far (nothing), not a race.
	script := "#!/bin/sh\n" +
		": > " + dir + "/stdin\n" +
		"echo start >> " + dir + "/starts\n" +
		"echo \"$CNI_COMMAND $CNI_CONTAINERID\" > " + dir + "/started\n" +
		"cat > " + dir + "/stdin\n" +
		body + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755))
	t.Setenv("CNI_PATH", dir)
	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_CONTAINERID", "c1")
	return dir
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "(none)"
	}
	require.NoError(t, err)
	return string(b)
}

// waitFor polls for a file the script writes: the process runs on its own.
func waitFor(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s never appeared: the delegate did not start", path)
}

// running starts the delegate a script of body plays and waits until it
// runs: it returns the script's directory and the started delegate.
func running(t *testing.T, body string) (string, *Early) {
	t.Helper()
	dir := plugin(t, "whereabouts", body)
	e := Start(context.Background(), "whereabouts", "ADD", nil)
	require.True(t, e.Started())
	waitFor(t, filepath.Join(dir, "started"))
	return dir, e
}

const result = `{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}`

// The delegate is started before the config exists, runs as ADD with the
// process's environment, and gets its config only when DelegateAdd writes
// it: nothing before, exactly the config after.
func TestTheStartedDelegateGetsItsConfigOnlyAtItsRun(t *testing.T) {
	dir, e := running(t, "echo '"+result+"'")
	ctx := context.Background()
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, "", read(t, filepath.Join(dir, "stdin")), "the config is not written before the run")

	conf := []byte(`{"cniVersion":"1.0.0","name":"storagenetwork","ipam":{"type":"whereabouts"}}`)
	res, err := invoke.DelegateAdd(ctx, "whereabouts", conf, e)
	require.NoError(t, err)
	assert.Equal(t, "ADD c1\n", read(t, filepath.Join(dir, "started")))
	assert.Equal(t, string(conf), read(t, filepath.Join(dir, "stdin")))
	assert.Contains(t, resultString(t, res), "10.0.0.2/24")
	assert.Equal(t, "start\n", read(t, filepath.Join(dir, "starts")), "the started process ran the ADD: no second exec")
	assert.False(t, e.Started(), "the process is used once")
	e.Abandon() // after the run: nothing to do, and no panic
}

func resultString(t *testing.T, r types.Result) string {
	t.Helper()
	var b strings.Builder
	require.NoError(t, r.PrintTo(&b))
	return b.String()
}

// What the delegate writes to stderr beside a success is passed on, as
// invoke passes it on; with nowhere to pass it, it is dropped.
func TestTheStartedDelegatesStderrIsPassedOn(t *testing.T) {
	plugin(t, "whereabouts", "echo 'a warning' >&2; echo '"+result+"'")
	ctx := context.Background()
	var stderr strings.Builder
	e := Start(ctx, "whereabouts", "ADD", &stderr)
	_, err := invoke.DelegateAdd(ctx, "whereabouts", []byte(`{"cniVersion":"1.0.0"}`), e)
	require.NoError(t, err)
	assert.Equal(t, "a warning\n", stderr.String())

	e = Start(ctx, "whereabouts", "ADD", nil)
	_, err = invoke.DelegateAdd(ctx, "whereabouts", []byte(`{"cniVersion":"1.0.0"}`), e)
	require.NoError(t, err)
}

// Abandoned (the ADD failed before the delegate's turn): the process is
// killed without a byte of config, so it can have done nothing.
func TestAnAbandonedDelegateNeverGetsItsConfig(t *testing.T) {
	dir, e := running(t, "echo ran > "+"$(dirname $0)/ran")
	e.Abandon()
	e.Abandon()
	assert.False(t, e.Started())
	assert.Equal(t, "", read(t, filepath.Join(dir, "stdin")))
	assert.Equal(t, "(none)", read(t, filepath.Join(dir, "ran")), "killed before it went on")
}

// The delegate's failure reads as invoke's own would: its CNI error with its
// code, or its stderr when it printed no error.
func TestTheStartedDelegatesFailuresReadAsInvokes(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       types.Error
	}{{
		name: "a CNI error",
		body: `echo '{"cniVersion":"1.0.0","code":11,"msg":"Could not allocate IP in range"}'; exit 1`,
		want: types.Error{Code: 11, Msg: "Could not allocate IP in range"},
	}, {
		name: "stderr only",
		body: `echo 'panic: boom' >&2; exit 2`,
		want: types.Error{Msg: `netplugin failed: "panic: boom\n"`},
	}, {
		name: "nothing said",
		body: `exit 3`,
		want: types.Error{Msg: "netplugin failed with no error message: exit status 3"},
	}, {
		// One byte is something said: not "no error message".
		name: "one byte on stderr",
		body: `printf x >&2; exit 2`,
		want: types.Error{Msg: `netplugin failed: "x"`},
	}, {
		name: "one byte on stdout",
		body: `printf x; exit 1`,
		want: types.Error{Msg: `netplugin failed but error parsing its diagnostic message "x": invalid character 'x' looking for beginning of value`},
	}, {
		name: "not a CNI error",
		body: `echo 'oops'; exit 1`,
		want: types.Error{Msg: `netplugin failed but error parsing its diagnostic message "oops\n": invalid character 'o' looking for beginning of value`},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := plugin(t, "whereabouts", tt.body)
			ctx := context.Background()
			e := Start(ctx, "whereabouts", "ADD", nil)
			require.True(t, e.Started())
			_, err := invoke.DelegateAdd(ctx, "whereabouts", []byte(`{"cniVersion":"1.0.0"}`), e)
			var ce *types.Error
			require.True(t, errors.As(err, &ce), "%v", err)
			assert.Equal(t, tt.want, *ce)
			assert.Equal(t, "start\n", read(t, filepath.Join(dir, "starts")), "the started process failed, not a second one")

			// invoke's own exec says the same of the same plugin
			_, rawErr := invoke.DelegateAdd(ctx, "whereabouts", []byte(`{"cniVersion":"1.0.0"}`), nil)
			assert.Equal(t, rawErr, err)
		})
	}
}

// A run of another plugin, or with another environment, is not given to the
// started process (which is ended): it is run as invoke runs it.
func TestAnotherRunIsInvokes(t *testing.T) {
	dir, e := running(t, "echo '"+result+"'")
	ctx := context.Background()
	t.Setenv("CNI_CONTAINERID", "c2") // the environment changed since the start

	res, err := invoke.DelegateAdd(ctx, "whereabouts", []byte(`{"cniVersion":"1.0.0"}`), e)
	require.NoError(t, err)
	assert.Contains(t, resultString(t, res), "10.0.0.2/24")
	assert.Equal(t, "ADD c2\n", read(t, filepath.Join(dir, "started")), "run anew, with the environment of the run")
	assert.Equal(t, "start\nstart\n", read(t, filepath.Join(dir, "starts")))
	assert.False(t, e.Started())
}

// A delegate that is not on CNI_PATH is not started; the run says what
// invoke says.
func TestADelegateNotFoundIsInvokesError(t *testing.T) {
	plugin(t, "whereabouts", "true")
	ctx := context.Background()
	e := Start(ctx, "whereabouts-typo", "ADD", nil)
	assert.False(t, e.Started())
	_, err := invoke.DelegateAdd(ctx, "whereabouts-typo", []byte(`{"cniVersion":"1.0.0"}`), e)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `failed to find plugin "whereabouts-typo" in path`)
}

// invoke looks the delegate up again before it runs it (DelegateAdd calls
// FindInPath): the started one answers from what Start found, without a
// second walk of CNI_PATH; any other plugin or path list is looked up as
// invoke does.
func TestFindInPathAnswersForTheStartedDelegate(t *testing.T) {
	dir, e := running(t, "echo '"+result+"'")
	defer e.Abandon()
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	require.NoError(t, os.Rename(filepath.Join(dir, "whereabouts"), filepath.Join(dir, "moved")))
	got, err := e.FindInPath("whereabouts", paths)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "whereabouts"), got, "the started process's binary, found once")
	_, err = e.FindInPath("whereabouts", append([]string{t.TempDir()}, paths...))
	assert.ErrorContains(t, err, "failed to find plugin", "another path list: invoke's lookup")
	got, err = e.FindInPath("moved", paths)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "moved"), got)
}
