package plugin

import (
	"errors"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// GC, hole 5: records are keyed by the network's name, network_name and
// pools; the store is reached with the config's kubeconfig; one record that
// cannot be released stops none of the others, and stays for the next GC.
func TestGC(t *testing.T) {
	at := map[string][]string{"old1": {"192.168.50.2/24"}, "old2": {"192.168.50.3/24"}, "b1": {"192.168.50.4/24"}}
	write := func(t *testing.T, r *rig, id, network, kubeconfig string, pools ...string) {
		rec := checkpoint.Record{ContainerID: id, IfName: "lhnet1", Network: network, PodRef: "longhorn-system/im-a", Kubeconfig: kubeconfig, Namespace: "kube-system", IPs: at[id]}
		for _, p := range pools {
			rec.Pools = append(rec.Pools, checkpoint.Pool{Name: p, Range: "x"})
		}
		require.NoError(t, checkpoint.Dir(r.cpDir).Write(rec))
	}
	valid := `,"cni.dev/valid-attachments":[{"containerID":"old1","ifname":"lhnet1"}]`
	for _, tt := range []struct {
		name     string
		prepare  func(t *testing.T, r *rig)
		failOnce bool
		want     map[string]alloc
		wantLeft []string
	}{{
		name: "what is not valid is released",
		prepare: func(t *testing.T, r *rig) {
			write(t, r, "old1", "storagenetwork", r.kubeconfig(), poolName)
			write(t, r, "old2", "storagenetwork", r.kubeconfig(), poolName)
		},
		want:     map[string]alloc{"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
		wantLeft: []string{"old1"},
	}, {
		name: "another network's records, and another NAD's of the same name, are not this GC's",
		prepare: func(t *testing.T, r *rig) {
			write(t, r, "old2", "othernet", r.kubeconfig(), poolName)
			write(t, r, "b1", "storagenetwork", r.kubeconfig(), "10.9.0.0-24")
		},
		want:     crashLoopedPool()[0].(*shim.Pool).Spec.Allocations,
		wantLeft: []string{"old2", "b1"},
	}, {
		name:     "a record whose kubeconfig moved: released with the config's",
		prepare:  func(t *testing.T, r *rig) { write(t, r, "old2", "storagenetwork", "/moved/away", poolName) },
		want:     map[string]alloc{"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
		wantLeft: nil,
	}, {
		name: "a pool write that fails keeps the record for the next GC",
		prepare: func(t *testing.T, r *rig) {
			write(t, r, "old2", "storagenetwork", r.kubeconfig(), poolName)
		},
		failOnce: true,
		want:     map[string]alloc{"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			tt.prepare(t, r)
			c := r.config("1.1.0", "")
			stdin := append(c[:len(c)-1], []byte(valid+"}")...)
			if tt.failOnce {
				r.api.Hook = func(c *fake.Call) error {
					if c.Verb == "patch" {
						return errors.New("etcdserver: request timed out")
					}
					return nil
				}
				err := r.p.GC(args(t, "", "", "", stdin))
				assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
				assert.Contains(t, err.Error(), "GC left work undone: old2/lhnet1")
				recs, _ := checkpoint.Dir(r.cpDir).List()
				require.Len(t, recs, 1, "kept for the next GC")
				r.api.Hook = nil
			}
			require.NoError(t, r.p.GC(args(t, "", "", "", stdin)))
			assert.Equal(t, tt.want, r.pool())
			assert.Contains(t, r.calls(), "GC whereabouts")
			recs, _ := checkpoint.Dir(r.cpDir).List()
			var left []string
			for _, rec := range recs {
				left = append(left, rec.ContainerID)
			}
			assert.ElementsMatch(t, tt.wantLeft, left)
		})
	}
}

func TestGCWithoutPoolsReleasesNothing(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old1")
	require.NoError(t, r.p.GC(args(t, "", "", "", r.rangelessConfig())))
	assert.Len(t, r.pool(), 3)
	assert.Contains(t, r.log.String(), "config names no pools")
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

// whereabouts' own GC failing fails GC, saying so, with harvester-ipam's
// releases done: the runtime calls it again.
func TestGCWhoseDelegateFailsSaysSo(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old1", "192.168.50.2/24")
	r.del.Before = func(verb string) error {
		if verb == "GC" {
			return &cnitypes.Error{Code: cnitypes.ErrTryAgainLater, Msg: "the Lease is held"}
		}
		return nil
	}
	c := r.config("1.1.0", "")
	err := r.p.GC(args(t, "", "", "", append(c[:len(c)-1], []byte(`,"cni.dev/valid-attachments":[]}`)...)))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.Contains(t, err.Error(), "GC left work undone: whereabouts GC: the Lease is held")
	assert.NotContains(t, r.pool(), "2", "harvester-ipam's own release done")
}

// GC of one interface of a sandbox whose other interface is live, both on
// one pool under whereabouts v0.7.0's CRD (which prunes the ifname): the
// sandbox's entries are told apart only by the addresses each attachment
// recorded, so GC must read the other attachment's record for this pool, as
// DEL and a lost ADD's release do. An address both recorded (one chose it on
// a stale copy and never wrote it; the pool gave it to the other since) is
// neither's to free: GC leaves it, and the sandbox's last DEL releases it.
func TestGCLeavesAnAddressTheSandboxsOtherInterfaceRecorded(t *testing.T) {
	b1 := alloc{ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}
	c := alloc{ContainerID: "c", PodRef: "longhorn-system/im-a"}
	for _, tt := range []struct {
		name     string
		pool     map[string]alloc
		recorded map[string]string // ifname -> the address it recorded
		want     map[string]alloc
	}{{
		name:     "an address both interfaces recorded: left",
		pool:     map[string]alloc{"2": c, "4": b1},
		recorded: map[string]string{"lhnet1": "192.168.50.2/24", "lhnet2": "192.168.50.2/24"},
		want:     map[string]alloc{"2": c, "4": b1},
	}, {
		name:     "its own address, the live interface's elsewhere: only its own released",
		pool:     map[string]alloc{"2": c, "3": c, "4": b1},
		recorded: map[string]string{"lhnet1": "192.168.50.2/24", "lhnet2": "192.168.50.3/24"},
		want:     map[string]alloc{"2": c, "4": b1},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			objs := []any{ipamPool(tt.pool), fake.NewReservation("192.168.50.4", "longhorn-system/im-b")}
			if _, ok := tt.pool["2"]; ok {
				objs = append(objs, fake.NewReservation("192.168.50.2", "longhorn-system/im-a"))
			}
			if _, ok := tt.pool["3"]; ok {
				objs = append(objs, fake.NewReservation("192.168.50.3", "longhorn-system/im-a"))
			}
			r := newRig(t, objs...)
			r.wb.Version = fake.V070
			for _, ifn := range []string{"lhnet1", "lhnet2"} {
				require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "c", IfName: ifn, Network: "storagenetwork",
					PodRef: "longhorn-system/im-a", Kubeconfig: r.kubeconfig(), Namespace: "kube-system",
					Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, IPs: []string{tt.recorded[ifn]}}))
			}
			cfg := r.config("1.1.0", "")
			stdin := append(cfg[:len(cfg)-1], []byte(`,"cni.dev/valid-attachments":[{"containerID":"c","ifname":"lhnet1"}]}`)...)
			require.NoError(t, r.p.GC(args(t, "", "", "", stdin)))
			assert.Equal(t, tt.want, r.pool())
			_, held := r.pool()["2"]
			assert.True(t, held, "the live interface's entry")
			assert.Contains(t, r.orips(), "192.168.50.2=longhorn-system/im-a", "the live interface's reservation")
			recs, _ := checkpoint.Dir(r.cpDir).List()
			var left []string
			for _, rec := range recs {
				left = append(left, rec.ContainerID+"/"+rec.IfName)
			}
			assert.Equal(t, []string{"c/lhnet1"}, left, "the live interface's record stays; the collected one goes")
		})
	}
}
