package reconcile

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// A sighting is written on the pool as read fresh for the write: an entry
// that changed hands between the pass's list and that read (another
// container of the gone pod took the offset) is not recorded under the old
// holder, so its grace cannot have started before the new holder had it
// (issue 15).
func TestSightingIsForgottenWhenTheEntryChangesHandsUnderTheWrite(t *testing.T) {
	f := newFixture(t, running())
	moved := false
	f.api.Hook = func(c *fake.Call) error {
		if !moved && c.Verb == "get" && c.Resource == fake.Pools && c.From == shim.Fresh {
			moved = true
			p := f.pool()
			p.Spec.Allocations["4"] = alloc{ContainerID: "dead-too", PodRef: lh + "/gone", IfName: "lhnet1"}
			_, err := f.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
		}
		return nil
	}
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.True(t, moved, "the pass read the pool fresh to write its sightings")
	assert.Empty(t, rep.Released)
	seen := decodeSightings(f.pool().Annotations[StaleSinceAnnotation])
	assert.NotContains(t, seen, "4", "the sighting was of container dead, which no longer holds the entry")

	// The next pass sees the new holder and starts its grace then.
	f.api.Hook = nil
	_, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, sightings{"4": {holder: holderOf("dead-too"), since: f.now}}, decodeSightings(f.pool().Annotations[StaleSinceAnnotation]))
}
