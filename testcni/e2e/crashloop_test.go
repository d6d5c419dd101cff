package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// A crash-looping pod: ten sandboxes, none of which ever gets its DEL, then
// one more. Under harvester-ipam the pod holds one address at every step.
// Beside it, the delegate alone: v0.8.0 and later hand the new sandbox the
// address its pod and ifname held, v0.7.0 allocates anew each time.
func TestCrashLoopHoldsOneAddress(t *testing.T) {
	onEachDelegate(t, func(t *testing.T, e *env) {
		aloneHolds := 1
		if e.WB == testcni.V070 {
			aloneHolds = 11
		}
		for _, tt := range []struct {
			ipam     string
			wantHeld int
		}{
			{testcni.StandIn, 1},
			{testcni.Named, 1},
			{testcni.Alone, aloneHolds},
		} {
			n := e.network(t, testcni.Network{IPAM: tt.ipam})
			pod := e.Pod("instance-manager-6b77fd6b")
			var last *testcni.Sandbox
			for i := 0; i < 11; i++ {
				if last != nil {
					require.NoError(t, last.Kill(), "the sandbox dies without DEL")
				}
				last = add(t, n, pod)
			}
			allocs, err := n.Allocations(ctx(t))
			require.NoError(t, err)
			held := testcni.Of(allocs, pod.Ref())
			t.Logf("%s on whereabouts %s: the pod holds %d address(es) after 11 sandboxes:\n%s", tt.ipam, e.WB, len(held), testcni.Table(allocs))
			assert.Len(t, held, tt.wantHeld, "%s on whereabouts %s", tt.ipam, e.WB)
			if tt.ipam != testcni.Alone {
				verify(t, n, []*testcni.Sandbox{last}, pod)
			}
		}
	})
}

// The delegate is started before harvester-ipam releases what an earlier
// sandbox holds, and must allocate only after: on a range of one address
// held by the pod's dead sandbox, the new sandbox gets that address, and no
// other pod fits. (v0.7.0 would fail the ADD if it allocated first; v0.8.0
// and later hand the pod's own entry over either way.)
func TestTheDelegateAllocatesOnlyAfterTheRelease(t *testing.T) {
	onEachAllocator(t, func(t *testing.T, e *env) {
		i := subnet.Add(1)
		n := e.network(t, testcni.Network{Range: fmt.Sprintf("10.%d.%d.0/30", 100+i/250, i%250)})
		n.Exclude = []string{strings.TrimSuffix(n.Range, "0/30") + "1/32"} // one address left: .2
		n, err := rig.AddNetwork(*n)
		require.NoError(t, err)
		pod := e.Pod("instance-manager-one")
		first := add(t, n, pod)
		require.NoError(t, first.Kill(), "the sandbox dies without DEL")

		second := add(t, n, pod)
		assert.Equal(t, first.IP(), second.IP())
		verify(t, n, []*testcni.Sandbox{second}, pod)

		other, err := rig.NewSandbox(n, e.Pod("other"), "lhnet1")
		require.NoError(t, err)
		err = other.Add(ctx(t))
		assert.ErrorContains(t, err, "Could not allocate IP in range", "the range has one address")
		require.NoError(t, other.Kill())
	})
}
