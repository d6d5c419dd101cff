package shim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
)

func TestPatchRemovalsCountsOnlyRemovals(t *testing.T) {
	p := shim.Guarded("7",
		shim.PatchOp{Op: "remove", Path: "/spec/allocations/4"},
		shim.PatchOp{Op: "add", Path: "/metadata/annotations/x", Value: "y"},
		shim.PatchOp{Op: "remove", Path: "/spec/allocations/5"})
	assert.Equal(t, 2, p.Removals())
	assert.Equal(t, 0, shim.Guarded("7").Removals())
}

func TestGuardedPatchJSON(t *testing.T) {
	p := shim.Guarded("7", shim.PatchOp{Op: "remove", Path: "/spec/allocations/4"})
	b, err := p.MarshalJSON()
	require.NoError(t, err)
	assert.JSONEq(t, `[{"op":"test","path":"/metadata/resourceVersion","value":"7"},{"op":"remove","path":"/spec/allocations/4"}]`, string(b))
	assert.Equal(t, "7", p.ResourceVersion())
	assert.Equal(t, 1, p.Removals())
	assert.Equal(t, "", shim.Patch{}.ResourceVersion())
	assert.Equal(t, "7", shim.Guarded("7").ResourceVersion(), "a patch of the test alone still names its version")
}
