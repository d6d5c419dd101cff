package e2e

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// A crash-looping pod: ten sandboxes, none of which ever gets its DEL, then
// one more. Under harvester-ipam the pod holds one address at every step.
func TestCrashLoopHoldsOneAddress(t *testing.T) {
	for _, tt := range []struct {
		name        string
		ipam        string
		whereabouts string
		wantHeld    int
	}{
		{"harvester-ipam on whereabouts v0.8.0", "harvester-ipam", testcni.V080, 1},
		{"harvester-ipam on whereabouts v0.7.0", "harvester-ipam", testcni.V070, 1},
		// The baseline, to show the leak: v0.7.0 allocates anew for every sandbox.
		{"whereabouts v0.7.0 alone", "whereabouts", testcni.V070, 11},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := network(t, testcni.Network{IPAM: tt.ipam, Whereabouts: tt.whereabouts})
			pod := testcni.Pod{Namespace: "longhorn-system", Name: "instance-manager-6b77fd6b"}
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
			t.Logf("%s: the pod holds %d address(es) after 11 sandboxes:\n%s", tt.name, len(held), testcni.Table(allocs))
			assert.Len(t, held, tt.wantHeld)
			if tt.ipam == "harvester-ipam" {
				verify(t, n, []*testcni.Sandbox{last}, pod)
			}
		})
	}
}
