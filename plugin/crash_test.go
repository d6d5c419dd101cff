package plugin

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
)

// crashed is what the test crash hook panics with: the verb stops there, as
// a SIGKILL stops it, with nothing after that point done.
type crashed struct{ at string }

// crashAt runs verb with the plugin's crash hook stopping it at point; it
// reports whether the verb got there.
func crashAt(t *testing.T, r *rig, point string, verb func() error) (reached bool) {
	t.Helper()
	r.p.AtStep = func(p string) {
		if p == point {
			panic(crashed{p})
		}
	}
	defer func() {
		r.p.AtStep = nil
		if v := recover(); v != nil {
			c, ok := v.(crashed)
			require.True(t, ok, "a panic that is not the crash hook's: %v", v)
			reached = c.at == point
		}
	}()
	_ = verb()
	return false
}

// ADD that dies right after the delegate allocated (before it could record
// anything more), followed by the NAD's deletion and then the runtime's DEL:
// the DEL has no range and no kubeconfig from its config, only the
// checkpoint, and must still release the allocation and its reservation
// (issue 15: ADD writing its checkpoint after the delegate instead of before).
func TestAddThatDiesAfterTheDelegateIsReleasedByADelWithTheNADGone(t *testing.T) {
	for _, point := range []string{"add-after-checkpoint", "add-after-reclaim", "add-after-delegate"} {
		t.Run(point, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			reached := crashAt(t, r, point, func() error {
				return r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
			})
			require.True(t, reached, "ADD reached %s", point)
			held := func() []string {
				var offs []string
				for off, a := range r.pool() {
					if a.ContainerID == "new" {
						offs = append(offs, off)
					}
				}
				return offs
			}
			if point == "add-after-delegate" {
				require.Len(t, held(), 1, "the delegate allocated before the crash")
			}
			others := map[string]alloc{}
			for off, a := range r.pool() {
				if a.ContainerID != "new" {
					others[off] = a
				}
			}
			orips := map[string]bool{}
			for _, o := range r.orips() {
				orips[o] = true
			}
			require.NoError(t, r.p.Del(args(t, "new", "lhnet1", podArgs, r.goneConfig())))
			assert.Empty(t, held(), "DEL with the NAD gone released what the dead ADD allocated")
			assert.Equal(t, others, r.pool(), "and nothing else")
			for _, o := range r.orips() {
				assert.True(t, orips[o], "no reservation made: %s", o)
			}
			if point == "add-after-delegate" {
				assert.Len(t, r.orips(), len(orips)-1, "the dead ADD's reservation released")
			}
			_, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
			require.NoError(t, err)
			assert.False(t, ok, "the checkpoint is gone once released")
		})
	}
}

// The crash points are the plugin's own step boundaries, in order.
func TestCrashPointsAreThePluginsSteps(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	var points []string
	r.p.AtStep = func(p string) { points = append(points, p) }
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.Equal(t, []string{"add-after-checkpoint", "add-after-reservations", "add-after-reclaim", "add-after-delegate"}, points)
	points = nil
	require.NoError(t, r.p.Del(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.Equal(t, []string{"del-after-reservations", "del-after-release"}, points)
}
