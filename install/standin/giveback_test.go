package standin

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stopping gives the name back only on an uninstall: a restart, a rollout
// or a node's shutdown leaves the dir exactly as it was.
func TestStopGivesBackOnlyOnUninstall(t *testing.T) {
	ctx := bounded(t)
	v093 := realBinary("v0.9.3")
	for _, uninstall := range []bool{false, true} {
		t.Run(fmt.Sprintf("uninstall %v", uninstall), func(t *testing.T) {
			d := newDir(t, v093)
			_, err := d.Take(ctx, true)
			require.NoError(t, err)
			before := ino(t, d.name())
			gaveBack, why, err := d.Stop(ctx, func(context.Context) (bool, string) { return uninstall, "the DaemonSet says so" })
			require.NoError(t, err)
			assert.Equal(t, uninstall, gaveBack)
			assert.Equal(t, "the DaemonSet says so", why)
			if uninstall {
				assert.Equal(t, v093, read(t, d.name()), "given back")
				assert.Nil(t, read(t, d.aside()))
				return
			}
			assert.Equal(t, before, ino(t, d.name()), "the very same file at the name")
			assert.Equal(t, read(t, d.Self), read(t, d.name()))
			assert.Equal(t, v093, read(t, d.aside()))
		})
	}
}

// whereabouts' installer writes its binary at the name while harvester-ipam
// gives the name back, after the give-back has looked: what the exchange
// moves out of the name is the newer, whatever its time says, and ends at
// the name; after a kill there, the next run (a Take, or the give-back
// again) settles the same way.
func TestAGiveBackMeetsANewerBinary(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	for _, next := range []string{"", "take", "giveback"} {
		t.Run("next run: "+next, func(t *testing.T) {
			d := newDir(t, v093)
			_, err := d.Take(ctx, true)
			require.NoError(t, err)
			require.NoError(t, os.Chtimes(d.aside(), time.Now().Add(time.Hour), time.Now().Add(time.Hour)))
			write := func(step string) {
				if step == StepMarked {
					busyboxCP(t, d.name(), v094, time.Now().Add(-time.Hour))
				}
			}
			if next == "" {
				d.AtStep = write
				require.NoError(t, d.GiveBack(ctx))
			} else {
				// The child is killed right after the exchange: the write is
				// made by the parent before it runs, at the same point.
				d.AtStep = nil
				require.NoError(t, d.writeMarker(stat(t, d.aside())))
				write(StepMarked)
				require.NoError(t, OS{}.Exchange(d.aside(), d.name()))
				holds(t, "whereabouts v0.9.4", d.aside(), "what came out of the name")
				if next == "take" {
					_, err := d.Take(ctx, true)
					require.NoError(t, err)
					holds(t, "harvester-ipam", d.name(), "standing in")
					holds(t, "whereabouts v0.9.4", d.aside(), "the newer aside")
					assert.Empty(t, temps(t, d))
					return
				}
				require.NoError(t, d.GiveBack(ctx))
			}
			holds(t, "whereabouts v0.9.4", d.name(), "the newer at the name")
			holds(t, "missing", d.aside(), "given back")
			assert.Empty(t, temps(t, d))
		})
	}
}

// Giving back with the real binary at the name already (whereabouts wrote it
// since) removes the aside only once the name is seen to hold it still: a
// write that left a fragment there meanwhile (a cp -f killed) keeps the
// aside, which then goes back to the name.
func TestTheAsideGoesOnlyWhileTheNameHoldsTheRealBinary(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	d := newDir(t, v093)
	_, err := d.Take(ctx, true)
	require.NoError(t, err)
	cpF(t, d.name(), v094, time.Now()) // whereabouts wrote the name since: given back already
	h := &hookFS{}
	h.afterStat = func(path string, n int) {
		// After the give-back's look at the name (its second stat), before
		// anything else: a cp -f killed halfway leaves a fragment there.
		if path == d.name() && n == 2 {
			busyboxCP(t, d.name(), v094[:len(v094)/3], time.Now())
		}
	}
	d.FS = h
	require.NoError(t, d.GiveBack(ctx))
	holds(t, "whereabouts v0.9.3", d.name(), "the aside, the only real binary left, back at the name")
	holds(t, "missing", d.aside(), "given back")
	assert.Empty(t, temps(t, d))
}
