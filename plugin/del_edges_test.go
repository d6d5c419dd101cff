package plugin

import (
	"errors"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// DEL fails, so that the runtime retries, wherever the store fails it, and
// says what it was doing; the checkpoint stays for the retry.
func TestDelSaysWhichStepTheStoreFailed(t *testing.T) {
	refused := errors.New("etcdserver: request timed out")
	for _, tt := range []struct {
		name    string
		prepare func(t *testing.T, r *rig)
		stdin   func(r *rig) []byte
		fail    func(c *fake.Call) bool
		wantMsg string
	}{{
		name:    "no pool named anywhere: the search of every pool",
		stdin:   func(r *rig) []byte { return r.rangelessConfig() },
		fail:    func(c *fake.Call) bool { return c.Verb == "list" && c.Resource == fake.Pools },
		wantMsg: "find old1/lhnet1 in the pools of kube-system: list pools in kube-system: etcdserver: request timed out",
	}, {
		name: "the entry is gone, its reservation is left: judging it",
		prepare: func(t *testing.T, r *rig) {
			p := r.api.Pool("kube-system", poolName)
			delete(p.Spec.Allocations, "2")
			_, err := r.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
			r.record(t, "old1", "192.168.50.2/24")
		},
		stdin:   func(r *rig) []byte { return r.config("0.3.1", "") },
		fail:    func(c *fake.Call) bool { return c.Resource == fake.Reservations },
		wantMsg: "release the reservations of old1: get reservation kube-system/192.168.50.2: etcdserver: request timed out",
	}} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			if tt.prepare != nil {
				tt.prepare(t, r)
			}
			r.api.Hook = func(c *fake.Call) error {
				if tt.fail(c) {
					return refused
				}
				return nil
			}
			err := r.p.Del(args(t, "old1", "lhnet1", "", tt.stdin(r)))
			assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
			assert.Equal(t, tt.wantMsg, err.(*cnitypes.Error).Msg)
			assert.Contains(t, r.orips(), "192.168.50.2=longhorn-system/im-a", "the reservation stays until a DEL succeeds")
		})
	}
}

// DEL releases directly and never hands the DEL to whereabouts (its DEL
// picks by container ID, or ID and ifname, under its own Lease, and
// swallows its storage errors): a delegate whose DEL would fail changes
// nothing, and a DEL that goes well logs no error at all.
func TestDelReleasesDirectlyWithoutTheDelegate(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail bool
	}{
		{"the delegate would work", false},
		{"the delegate would fail", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			r.record(t, "old1", "192.168.50.2/24")
			r.del.Before = func(verb string) error {
				if tt.fail && verb == "DEL" {
					return &cnitypes.Error{Code: cnitypes.ErrTryAgainLater, Msg: "lease timeout"}
				}
				return nil
			}
			require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", podArgs, r.config("0.3.1", ""))))
			assert.Empty(t, r.calls(), "whereabouts is not called")
			assert.NotContains(t, r.pool(), "2", "released")
			assert.NotContains(t, r.orips(), "192.168.50.2=longhorn-system/im-a")
			_, ok, err := checkpoint.Dir(r.cpDir).Read("old1", "lhnet1")
			require.NoError(t, err)
			assert.False(t, ok, "forgotten")
			assert.NotContains(t, r.log.String(), "[error]")
			assert.Contains(t, r.log.String(), "released 192.168.50.2 from pool 192.168.50.0-24")
		})
	}
}

// A checkpoint may name several pools (ipRanges): a DEL that finds nothing
// left in any judges the reservations of its recorded addresses in each, by
// range.
func TestDelFinishesLeftReservationsInEveryRecordedPool(t *testing.T) {
	second := ipamPool(map[string]alloc{})
	second.Name, second.Spec.Range = "10.1.0.0-24", "10.1.0.0/24"
	objs := append(crashLoopedPool(), second, oripObj("10.1.0.7", "longhorn-system/im-a"))
	delete(objs[0].(*shim.Pool).Spec.Allocations, "2")
	r := newRig(t, objs...)
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
		PodRef: "longhorn-system/im-a", Kubeconfig: r.kubeconfig(), Namespace: "kube-system",
		Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}, {Name: "bad", Range: "not a range"}, {Name: "10.1.0.0-24", Range: "10.1.0.0/24"}},
		IPs:   []string{"192.168.50.2/24", "10.1.0.7/24"}}))
	require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", "", r.goneConfig())))
	assert.NotContains(t, r.orips(), "192.168.50.2=longhorn-system/im-a")
	assert.NotContains(t, r.orips(), "10.1.0.7=longhorn-system/im-a", "the second pool's too")
	assert.Contains(t, r.orips(), "192.168.50.3=longhorn-system/im-a", "another sandbox's stays")
	assert.NotContains(t, r.log.String(), "[error]")
}

// GC that releases what it should logs no error.
func TestGCThatWorksLogsNoError(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old1", "192.168.50.2/24")
	c := r.config("1.1.0", "")
	require.NoError(t, r.p.GC(args(t, "", "", "", append(c[:len(c)-1], []byte(`,"cni.dev/valid-attachments":[]}`)...))))
	assert.NotContains(t, r.pool(), "2")
	recs, _ := checkpoint.Dir(r.cpDir).List()
	assert.Empty(t, recs)
	assert.NotContains(t, r.log.String(), "[error]")
}

// A config that loads but names no range (the NAD's range removed) is no
// config to go by: DEL goes by the checkpoint, even when the config names
// node slices (which would hand a usable config's DEL to whereabouts); with
// no checkpoint either and no store, there is nothing to release.
func TestDelOfARangelessConfigGoesByTheCheckpoint(t *testing.T) {
	for _, tt := range []struct {
		name      string
		extra     string // added to the config's ipam
		record    bool
		breakKube bool
		wantGone  bool // 192.168.50.2 released
	}{
		{"no range", "", true, false, true},
		{"no range, node slices", `,"node_slice_size":"/28"`, true, false, true},
		{"no range, no checkpoint, no store", "", false, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			if tt.record {
				r.record(t, "old1", "192.168.50.2/24")
			}
			if tt.breakKube {
				r.breakKubeconfig(t)
			}
			c := r.rangelessConfig()
			c = append(c[:len(c)-2], []byte(tt.extra+"}}")...)
			require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", "", c)))
			assert.Empty(t, r.calls(), "whereabouts is not called")
			if tt.wantGone {
				assert.NotContains(t, r.pool(), "2", "released by the checkpoint")
				assert.NotContains(t, r.orips(), "192.168.50.2=longhorn-system/im-a")
			} else {
				assert.Contains(t, r.pool(), "2")
			}
			assert.Contains(t, r.pool(), "4", "another pod's stays")
		})
	}
}

// DEL with neither a usable config nor a checkpoint (an attachment made
// before harvester-ipam stood in, its NAD gone) searches every pool for the
// container: it releases the entries naming its ifname, in every pool, and
// leaves another interface's entry of the same sandbox, an entry without
// ifname (nothing tells whose it is) and other containers' entries.
func TestDelWithoutConfigOrCheckpointReleasesOnlyItsInterface(t *testing.T) {
	other := &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: "10.9.0.0-24", Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "10.9.0.0/24", Allocations: map[string]alloc{
			"7": {ContainerID: "sbx", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		}}}
	r := newRig(t, ipamPool(map[string]alloc{
		"2": {ContainerID: "sbx", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"3": {ContainerID: "sbx", PodRef: "longhorn-system/im-a", IfName: "lhnet2"},
		"4": {ContainerID: "sbx", PodRef: "longhorn-system/im-a"},
		"5": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}), other, oripObj("192.168.50.2", "longhorn-system/im-a"), oripObj("192.168.50.3", "longhorn-system/im-a"),
		oripObj("10.9.0.7", "longhorn-system/im-a"))

	require.NoError(t, r.p.Del(args(t, "sbx", "lhnet1", "", r.rangelessConfig())))

	assert.Equal(t, map[string]alloc{
		"3": {ContainerID: "sbx", PodRef: "longhorn-system/im-a", IfName: "lhnet2"},
		"4": {ContainerID: "sbx", PodRef: "longhorn-system/im-a"},
		"5": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool(), "only lhnet1's entry released")
	assert.Empty(t, r.api.Pool("kube-system", "10.9.0.0-24").Spec.Allocations, "in every pool")
	assert.Equal(t, []string{"192.168.50.3=longhorn-system/im-a"}, r.orips(), "lhnet2's reservation stays")
}
