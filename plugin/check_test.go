package plugin

import (
	"strings"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		id      string
		ip      string
		wantErr string
	}{
		{"the allocation is there", "old1", "192.168.50.2", ""},
		{"a legacy allocation without ifname", "old2", "192.168.50.3", ""},
		{"another address", "old1", "192.168.50.9", "192.168.50.9 is not allocated to container old1 ifname lhnet1 in pool 192.168.50.0-24 (it holds 192.168.50.2)"},
		{"nothing held", "gone", "192.168.50.2", "pool 192.168.50.0-24 holds nothing for container gone ifname lhnet1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			err := r.p.Check(args(t, tt.id, "lhnet1", podArgs, withPrevResult(r.config("1.0.0", ""), tt.ip)))
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.Empty(t, r.calls(), "whereabouts answers CHECK with 'not implemented': not delegated")
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
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

// CHECK with the store down fails so that the runtime asks again.
func TestCheckWithTheStoreDown(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.storeDown()
	err := r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(r.config("1.0.0", ""), "192.168.50.2")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.True(t, strings.HasPrefix(err.(*cnitypes.Error).Msg, "read pool 192.168.50.0-24: get pool kube-system/192.168.50.0-24: dial tcp"), err.Error())
}

// CHECK without a prevResult, or with one that is no result, says which,
// with its code, and checks nothing.
func TestCheckRefusesAMissingOrBadPrevResult(t *testing.T) {
	for _, tt := range []struct {
		name, prev string
		wantCode   uint
		wantMsg    string
	}{
		{"none", "", cnitypes.ErrInvalidNetworkConfig, "CHECK needs a prevResult"},
		{"a number", `,"prevResult":1`, cnitypes.ErrDecodingFailure, "prevResult does not parse"},
		{"a string", `,"prevResult":"10.0.0.2"`, cnitypes.ErrDecodingFailure, "prevResult does not parse"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			c := r.config("1.0.0", "")
			c = append(c[:len(c)-1], []byte(tt.prev+"}")...)
			err := r.p.Check(args(t, "old1", "lhnet1", podArgs, c))
			assert.Equal(t, tt.wantCode, cniCode(t, err), "%v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Empty(t, r.calls())
		})
	}
}
