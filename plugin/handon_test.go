package plugin

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// standInConfig is the storage network's config as Harvester writes it:
// ipam.type whereabouts, which harvester-ipam receives when it stands in.
func (r *rig) standInConfig(version, ipamExtra string) []byte {
	return bytes.Replace(r.config(version, ipamExtra), []byte(`"type":"harvester-ipam"`), []byte(`"type":"whereabouts"`), 1)
}

// Standing in for whereabouts, harvester-ipam reclaims as it does when a NAD
// names it, and hands whereabouts the config byte for byte.
func TestStandInReclaimsThenHandsOnTheConfigAsItCame(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	stdin := r.standInConfig("0.3.1", "")
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, stdin)))

	assert.Equal(t, []string{"ADD whereabouts"}, r.calls())
	assert.Equal(t, string(stdin), string(r.del.Stdins[0]), "the config whereabouts reads is the NAD's, byte for byte")
	assert.Equal(t, map[string]alloc{
		"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool(), "the earlier sandboxes' entries released; the other pod's untouched")
}

// What harvester-ipam does not manage goes to the real whereabouts as it
// came, and whereabouts does with it what it always did: nothing is released.
func TestStandInHandsOnWhatItDoesNotManage(t *testing.T) {
	tests := []struct {
		name    string
		cniArgs string
		extra   string
	}{
		{"node slices", podArgs, `,"node_slice_size":"/26"`},
		// Any value but null is whereabouts' to judge, one character too.
		{"node slices of a value whereabouts refuses", podArgs, `,"node_slice_size":8`},
		{"no pod in CNI_ARGS", "IgnoreUnknown=true", ""},
		{"no CNI_ARGS at all", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			before := r.pool()
			stdin := r.standInConfig("0.3.1", tt.extra)
			err := r.p.Add(args(t, "new", "lhnet1", tt.cniArgs, stdin))
			assert.Equal(t, []string{"ADD whereabouts"}, r.calls())
			require.Len(t, r.del.Stdins, 1)
			assert.Equal(t, string(stdin), string(r.del.Stdins[0]))
			if err == nil {
				assert.Contains(t, r.out.String(), `"ips"`, "whereabouts' result printed")
			}
			// whereabouts' own ADD may reuse the pod's entry of the same
			// ifname; the entry harvester-ipam would release (no ifname,
			// another container) and its reservation stay.
			assert.Equal(t, before["3"], r.pool()["3"])
			assert.Contains(t, r.orips(), "192.168.50.3=longhorn-system/im-a")
		})
	}
}

// A NAD that names harvester-ipam chose it: node slices are refused there,
// not handed on.
func TestNamedStillRefusesNodeSlices(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", `,"node_slice_size":"/26"`)))
	assert.Equal(t, uint(2), cniCode(t, err))
	assert.Empty(t, r.calls())
}
