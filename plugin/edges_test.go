package plugin

import (
	"os"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
)

// ADD that cannot record the attachment allocates nothing: the error says
// which directory must be writable, and the delegate is never called.
func TestAddWithoutACheckpointDirAllocatesNothing(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, os.WriteFile(r.cpDir, []byte("a file where the directory should be"), 0o600))
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrIOFailure, cniCode(t, err))
	assert.Contains(t, err.(*cnitypes.Error).Details, "the checkpoint directory must be writable by root (harvester_ipam.checkpoint_dir)")
	assert.Empty(t, r.calls(), "no delegate")
	assert.Len(t, r.pool(), 3, "nothing released, nothing allocated")
}

// After the delegate, ADD records the addresses it got; a failure to record
// them is logged and loses nothing (DEL finds the attachment by its pools).
func TestAddRecordsTheAddressesItGot(t *testing.T) {
	for _, tt := range []struct {
		name      string
		breakDir  bool
		wantIPs   []string
		wantInLog string
	}{
		{"recorded", false, []string{"192.168.50.2/24"}, ""},
		{"the record cannot be updated", true, nil, "record addresses [192.168.50.2/24]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			if tt.breakDir {
				r.del.Before = func(verb string) error {
					// The directory goes, and a file takes its place.
					require.NoError(t, os.RemoveAll(r.cpDir))
					return os.WriteFile(r.cpDir, nil, 0o600)
				}
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
			assert.Contains(t, r.out.String(), `"address": "192.168.50.2/24"`, "the delegate's result")
			if tt.wantInLog != "" {
				assert.Contains(t, r.log.String(), tt.wantInLog)
				return
			}
			assert.NotContains(t, r.log.String(), "record addresses")
			rec, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, tt.wantIPs, rec.IPs)
			assert.Equal(t, "longhorn-system/im-a", rec.PodRef)
			assert.Equal(t, "kube-system", rec.Namespace)
			assert.Equal(t, []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, rec.Pools)
		})
	}
}

// CHECK compares the entry's podref with the pod CNI_ARGS names, when it
// names one.
func TestCheckNamesAnEntryOfAnotherPod(t *testing.T) {
	other := "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-z"
	for _, tt := range []struct {
		name, cniArgs, wantErr string
	}{
		{"the pod of CNI_ARGS", podArgs, ""},
		{"no pod in CNI_ARGS: not compared", "IgnoreUnknown=true", ""},
		{"another pod", other, "192.168.50.2 in pool 192.168.50.0-24 is recorded for pod longhorn-system/im-a, not longhorn-system/im-z"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			err := r.p.Check(args(t, "old1", "lhnet1", tt.cniArgs, withPrevResult(r.config("1.0.0", ""), "192.168.50.2")))
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.Equal(t, cnitypes.ErrInternal, cniCode(t, err))
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}
