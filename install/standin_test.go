package install

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/install/standin"
)

// A real binary as far as the installer can tell: it answers VERSION and
// carries no mark of harvester-ipam.
const fakeReal = `#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","1.0.0"]}'
  exit 0
fi
exit 1
`

// markedPlugin is a fake harvester-ipam that carries the mark every build does.
func markedPlugin(t *testing.T) string {
	return script(t, t.TempDir(), "harvester-ipam", fakePlugin+"# "+standin.Mark+"\n")
}

// Ready means harvester-ipam is installed and either stands in or has
// nothing to stand in for; the probe's output says which.
func TestVerifyStandIn(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, opt Options)
		ready bool
		says  string
	}{
		{"no whereabouts on the node", func(*testing.T, Options) {}, true, "nothing to stand in for: no whereabouts at "},
		{"standing in", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
			_, err := StandIn(ctx, opt, "whereabouts", true)
			require.NoError(t, err)
		}, true, "harvester-ipam stands in at "},
		{"whereabouts at its name, not stood in", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
		}, false, "not standing in for whereabouts"},
		{"harvester-ipam at the name, nothing aside", func(t *testing.T, opt Options) {
			b, err := os.ReadFile(opt.Source)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(opt.BinDir, "whereabouts"), b, 0o755))
		}, false, "the real whereabouts is missing at "},
		{"the real binary aside only", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts.real", fakeReal)
		}, false, "not standing in for whereabouts"},
		{"another build stands in (the pod before this one's)", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
			other := opt
			other.Source = build(t, "the one before")
			_, err := StandIn(ctx, other, "whereabouts", true)
			require.NoError(t, err)
		}, false, "is another build of harvester-ipam than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opt := Options{Source: markedPlugin(t), BinDir: t.TempDir()}
			_, err := Install(ctx, opt)
			require.NoError(t, err)
			tt.setup(t, opt)
			says, err := VerifyStandIn(ctx, opt, "whereabouts")
			if tt.ready {
				require.NoError(t, err)
				assert.Contains(t, says, tt.says)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.says)
			}
		})
	}
}

// What goes to the name must be harvester-ipam as the next look tells it:
// a source without the mark is refused, and nothing changes.
func TestStandInRefusesASourceWithoutTheMark(t *testing.T) {
	ctx := context.Background()
	opt := Options{Source: plugin(t, "v1"), BinDir: t.TempDir()}
	real := script(t, opt.BinDir, "whereabouts", fakeReal)
	_, err := StandIn(ctx, opt, "whereabouts", true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not a build of harvester-ipam")
	b, err := os.ReadFile(real)
	require.NoError(t, err)
	assert.Equal(t, fakeReal, string(b), "whereabouts left as it was")
	assert.Equal(t, []string{"whereabouts"}, entries(t, opt.BinDir))
}

// Each entry point refuses options that name no bin dir it may write, and
// waits for another installer's lock only as long as its context lasts.
func TestStandInEntryPointsRefuseAndWait(t *testing.T) {
	removing := func(context.Context) (bool, string) { return true, "uninstall" }
	calls := map[string]func(ctx context.Context, o Options) error{
		"StandIn": func(ctx context.Context, o Options) error {
			_, err := StandIn(ctx, o, "whereabouts", false)
			return err
		},
		"GiveBack": func(ctx context.Context, o Options) error { return GiveBack(ctx, o, "whereabouts") },
		"Stop": func(ctx context.Context, o Options) error {
			_, _, err := Stop(ctx, o, "whereabouts", removing)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call(context.Background(), Options{Source: markedPlugin(t), BinDir: "opt/cni/bin"})
			assert.ErrorContains(t, err, "want an absolute path")

			bin := t.TempDir()
			held, err := os.Open(bin)
			require.NoError(t, err)
			defer held.Close()
			require.NoError(t, syscall.Flock(int(held.Fd()), syscall.LOCK_EX))
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err = call(ctx, Options{Source: markedPlugin(t), BinDir: bin})
			assert.ErrorContains(t, err, "wait for another installer's lock")
			assert.Empty(t, entries(t, bin), "nothing written")
		})
	}
}

// After the stand-in is turned off, the name is given back when the real
// binary is at it and nothing is aside; anything else says what is left.
func TestVerifyGivenBack(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, opt Options)
		ok    bool
		says  string
	}{
		{"no whereabouts on the node", func(*testing.T, Options) {}, true, "nothing to give back: no whereabouts at "},
		{"given back", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
			_, err := StandIn(ctx, opt, "whereabouts", true)
			require.NoError(t, err)
			require.NoError(t, GiveBack(ctx, opt, "whereabouts"))
		}, true, "harvester-ipam does not stand in for whereabouts: the real whereabouts is at "},
		{"still standing in", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
			_, err := StandInAs(ctx, opt, "whereabouts", Identity{Namespace: "kube-system", DaemonSet: "harvester-ipam", Pod: "harvester-ipam-x"}, "", true)
			require.NoError(t, err)
		}, false, "release kube-system/harvester-ipam holds it (pod harvester-ipam-x)"},
		{"whereabouts rewrote the name, the real binary still aside", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts", fakeReal)
			script(t, opt.BinDir, "whereabouts.real", fakeReal)
		}, false, "whereabouts.real is still there"},
		{"only the binary aside", func(t *testing.T, opt Options) {
			script(t, opt.BinDir, "whereabouts.real", fakeReal)
		}, false, "whereabouts.real is still there"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opt := Options{Source: markedPlugin(t), BinDir: t.TempDir()}
			_, err := Install(ctx, opt)
			require.NoError(t, err)
			tt.setup(t, opt)
			says, err := VerifyGivenBack(ctx, opt, "whereabouts")
			if tt.ok {
				require.NoError(t, err)
				assert.Contains(t, says, tt.says)
				assert.True(t, IsGivenBack(ctx, opt, "whereabouts"))
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.says)
				assert.False(t, IsGivenBack(ctx, opt, "whereabouts"))
			}
		})
	}
}
