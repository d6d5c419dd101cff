package delegate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/install/standin"
)

// playEnv, in a test's environment, makes this test binary, when it is
// exec'd at a plugin's name, play harvester-ipam standing in for
// whereabouts: as plugin.Funcs does, it refuses at once when it was started
// as a delegate (GuardEnv set); otherwise it hands its verb on to
// "whereabouts" with Find, Start and invoke, as the plugin's ADD and DEL do.
// Each start is counted in the directory playEnv names, and a chain of more
// than maxChain starts gives up, so that a test of a missing guard fails
// instead of hanging.
const playEnv = "HARVESTER_IPAM_DELEGATE_TEST_PLAY"

const maxChain = 4

func TestMain(m *testing.M) {
	if dir := os.Getenv(playEnv); dir != "" {
		os.Exit(playHarvesterIPAM(dir))
	}
	os.Exit(m.Run())
}

func playHarvesterIPAM(dir string) int {
	fail := func(err error) int {
		var ce *types.Error
		if !errors.As(err, &ce) {
			ce = types.NewError(types.ErrInternal, err.Error(), "")
		}
		_ = ce.Print()
		return 1
	}
	f, err := os.OpenFile(filepath.Join(dir, "self-starts"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fail(err)
	}
	_, _ = fmt.Fprintln(f, "start")
	_ = f.Close()
	if os.Getenv(GuardEnv) != "" {
		return fail(SelfError())
	}
	b, err := os.ReadFile(filepath.Join(dir, "self-starts"))
	if err != nil {
		return fail(err)
	}
	if n := strings.Count(string(b), "start"); n > maxChain {
		return fail(fmt.Errorf("harvester-ipam started itself %d times in a chain", n))
	}
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	switch cmd := os.Getenv("CNI_COMMAND"); cmd {
	case "ADD":
		e := Start(ctx, "whereabouts", cmd, os.Stderr)
		defer e.Abandon()
		res, err := invoke.DelegateAdd(ctx, "whereabouts", stdin, e)
		if err != nil {
			return fail(err)
		}
		_ = res.Print()
	case "DEL":
		if err := invoke.DelegateDel(ctx, "whereabouts", stdin, Plain(os.Stderr)); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("CNI_COMMAND %q", cmd))
	}
	return 0
}

// standIn puts this test binary, playing harvester-ipam, at whereabouts'
// name in dir (a symlink: the binary is the one running, as the stand-in is
// to itself), and returns the directory its starts are counted in.
func standIn(t *testing.T, dir, name string) string {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	require.NoError(t, os.Symlink(self, filepath.Join(dir, name)))
	play := t.TempDir()
	t.Setenv(playEnv, play)
	return play
}

const conf = `{"cniVersion":"1.0.0","name":"storagenetwork","ipam":{"type":"whereabouts"}}`

// run runs the verb of harvester-ipam's delegate as the plugin does: ADD on
// a delegate started early, DEL as invoke runs it.
func run(t *testing.T, verb string) (string, error) {
	t.Helper()
	ctx := context.Background()
	t.Setenv("CNI_COMMAND", verb)
	if verb == "DEL" {
		return "", invoke.DelegateDel(ctx, "whereabouts", []byte(conf), Plain(nil))
	}
	e := Start(ctx, "whereabouts", verb, nil)
	defer e.Abandon()
	res, err := invoke.DelegateAdd(ctx, "whereabouts", []byte(conf), e)
	if err != nil {
		return "", err
	}
	return resultString(t, res), nil
}

// Where harvester-ipam stands in for whereabouts, the delegate that runs is
// the real whereabouts kept aside, for ADD and DEL; harvester-ipam never
// runs itself.
func TestTheStandInsDelegateIsTheRealBinaryAside(t *testing.T) {
	for _, verb := range []string{"ADD", "DEL"} {
		t.Run(verb, func(t *testing.T) {
			dir := plugin(t, "whereabouts.real", "echo '"+result+"'")
			play := standIn(t, dir, "whereabouts")

			out, err := run(t, verb)
			require.NoError(t, err)
			if verb == "ADD" {
				assert.Contains(t, out, "10.0.0.2/24", "the real whereabouts' result")
			}
			assert.Equal(t, "start\n", read(t, filepath.Join(dir, "starts")), "the real whereabouts ran, once")
			assert.Equal(t, conf, read(t, filepath.Join(dir, "stdin")), "with the config")
			assert.Equal(t, "(none)", read(t, filepath.Join(play, "self-starts")), "harvester-ipam never ran itself")
		})
	}
}

// Find, case by case: a plain delegate is itself; harvester-ipam at the
// name means the binary aside; with nothing whole aside, an error that says
// what to do (try again later: whereabouts' pod writes its binary again),
// never harvester-ipam.
func TestFind(t *testing.T) {
	for _, tt := range []struct {
		name    string
		standIn bool
		aside   string // "script", "dir" or none
		want    string // the file found, by name; "" for an error
		wantErr string
	}{
		{name: "whereabouts itself", want: "whereabouts"},
		{name: "harvester-ipam at the name, whereabouts aside", standIn: true, aside: "script", want: "whereabouts.real"},
		{name: "harvester-ipam at the name, nothing aside", standIn: true,
			wantErr: "harvester-ipam stands in for whereabouts at %[1]s/whereabouts, but the real whereabouts is missing at %[1]s/whereabouts.real"},
		{name: "harvester-ipam at the name, a directory aside", standIn: true, aside: "dir",
			wantErr: "but the real whereabouts is missing at %[1]s/whereabouts.real"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			switch {
			case tt.standIn:
				standIn(t, dir, "whereabouts")
			default:
				require.NoError(t, os.WriteFile(filepath.Join(dir, "whereabouts"), []byte("#!/bin/sh\n"), 0o755))
			}
			switch tt.aside {
			case "script":
				require.NoError(t, os.WriteFile(filepath.Join(dir, "whereabouts.real"), []byte("#!/bin/sh\n"), 0o755))
			case "dir":
				require.NoError(t, os.Mkdir(filepath.Join(dir, "whereabouts.real"), 0o755))
			}
			got, err := Find("whereabouts", []string{t.TempDir(), dir})
			if tt.wantErr != "" {
				var ce *types.Error
				require.True(t, errors.As(err, &ce), "a CNI error, not %v (found %q)", err, got)
				assert.Equal(t, uint(types.ErrTryAgainLater), ce.Code)
				assert.Contains(t, ce.Msg, fmt.Sprintf(tt.wantErr, dir))
				assert.Contains(t, ce.Details, "restart whereabouts's DaemonSet pod")
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, filepath.Join(dir, tt.want), got)
		})
	}
	_, err := Find("whereabouts", []string{t.TempDir()})
	assert.ErrorContains(t, err, `failed to find plugin "whereabouts" in path`, "not found: invoke's error")
}

// When the binary aside is harvester-ipam too (a stand-in kept aside by
// mistake), harvester-ipam's delegate is harvester-ipam: it must see that it
// is a delegate and fail at once, with an error that says so, not start
// itself again (each start would start another, until every sandbox's ADD
// times out). However the delegate is run: started early, run anew because
// the environment changed since, or as invoke runs it.
func TestHarvesterIPAMAsItsOwnDelegateStopsAtOnce(t *testing.T) {
	for _, tt := range []struct{ name, verb string }{
		{"ADD, started early", "ADD"},
		{"ADD, run anew", "ADD again"},
		{"DEL", "DEL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("CNI_PATH", dir)
			t.Setenv("CNI_CONTAINERID", "c1")
			play := standIn(t, dir, "whereabouts")
			self, err := os.Executable()
			require.NoError(t, err)
			require.NoError(t, os.Symlink(self, filepath.Join(dir, "whereabouts.real")))

			switch tt.verb {
			case "ADD again":
				ctx := context.Background()
				t.Setenv("CNI_COMMAND", "ADD")
				e := Start(ctx, "whereabouts", "ADD", nil)
				require.True(t, e.Started())
				// Counted, before it is killed for the run anew.
				for i := 0; i < 2000 && read(t, filepath.Join(play, "self-starts")) != "start\n"; i++ {
					time.Sleep(5 * time.Millisecond)
				}
				t.Setenv("CNI_CONTAINERID", "c2")
				_, err = invoke.DelegateAdd(ctx, "whereabouts", []byte(conf), e)
			default:
				_, err = run(t, tt.verb)
			}
			var ce *types.Error
			require.True(t, errors.As(err, &ce), "a CNI error, not %v", err)
			assert.Equal(t, uint(types.ErrTryAgainLater), ce.Code, "%s", ce.Msg)
			assert.Contains(t, ce.Msg, "was started as the delegate of harvester-ipam")
			assert.Contains(t, ce.Details, "the real whereabouts must be on CNI_PATH under its name, or beside harvester-ipam at <name>.real")
			want := "start\n"
			if tt.verb == "ADD again" {
				// The process started early for c1 was never given a config
				// (the environment changed): it counted itself, and the run
				// for c2 is another start.
				want = "start\nstart\n"
			}
			assert.Equal(t, want, read(t, filepath.Join(play, "self-starts")), "harvester-ipam ran as the delegate, and started nothing more")
		})
	}
}

// The guard is in the delegate's environment, and only there: a plain
// delegate sees it too (it is harmless to whereabouts), the process does not.
func TestTheGuardIsInTheDelegatesEnvironmentOnly(t *testing.T) {
	dir := plugin(t, "whereabouts", `echo "$`+GuardEnv+`" > $(dirname $0)/guard; echo '`+result+`'`)
	_, err := run(t, "ADD")
	require.NoError(t, err)
	assert.Equal(t, "harvester-ipam\n", read(t, filepath.Join(dir, "guard")), "the guard is the mark every build carries")
	_, set := os.LookupEnv(GuardEnv)
	assert.False(t, set, "the process's own environment is untouched")
	var b []byte
	b, err = json.Marshal(guarded([]string{"A=1"}))
	require.NoError(t, err)
	assert.JSONEq(t, `["A=1","`+standin.Mark+`"]`, string(b))

	// The guard is added to a copy: an environment with room to spare is
	// not written into, so what its owner appends later cannot overwrite
	// the guard, nor the guard what it appends.
	env := make([]string, 1, 4)
	env[0] = "A=1"
	g := guarded(env)
	_ = append(env, "B=2")
	assert.Equal(t, []string{"A=1", standin.Mark}, g)
}
