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

// CHECK of a pool that cannot be read as whereabouts writes it is a store
// error (the runtime tries again), naming the pool; one that is gone, or that
// holds nothing at the address of prevResult, is a failed CHECK saying so.
func TestCheckOfAPoolItCannotVouchFor(t *testing.T) {
	for _, tt := range []struct {
		name     string
		objs     []any
		ip       string
		wantCode uint
		wantErr  string
	}{
		{"an entry whose offset is no number", []any{ipamPool(map[string]alloc{
			"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"x": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
		})}, "192.168.50.2", cnitypes.ErrTryAgainLater,
			`read pool 192.168.50.0-24: pool 192.168.50.0-24: allocation offset "x" is not a decimal number`},
		{"no pool", nil, "192.168.50.2", cnitypes.ErrInternal,
			"CHECK failed: pool kube-system/192.168.50.0-24 does not exist"},
		{"prevResult out of the range", crashLoopedPool(), "10.0.0.2", cnitypes.ErrInternal,
			"CHECK failed: prevResult has no address in range 192.168.50.0/24, but pool 192.168.50.0-24 holds 192.168.50.2 for this attachment"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.objs...)
			err := r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(r.config("1.0.0", ""), tt.ip)))
			assert.Equal(t, tt.wantCode, cniCode(t, err))
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Empty(t, r.calls(), "not delegated")
		})
	}
}
