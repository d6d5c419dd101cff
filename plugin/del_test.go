package plugin

import (
	"errors"
	"os"
	"path/filepath"
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

// twoAttachments is a sandbox "c" of im-a with two interfaces in one pool,
// as whereabouts v0.8.0 and later write them, or v0.7.0 (no ifnames).
func twoAttachments(ifnames bool) []any {
	if1, if2 := "lhnet1", "lhnet2"
	if !ifnames {
		if1, if2 = "", ""
	}
	return []any{
		ipamPool(map[string]alloc{
			"2": {ContainerID: "c", PodRef: "longhorn-system/im-a", IfName: if1},
			"3": {ContainerID: "c", PodRef: "longhorn-system/im-a", IfName: if2},
			"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
		}),
		fake.NewReservation("192.168.50.2", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.3", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.4", "longhorn-system/im-b"),
	}
}

func TestDel(t *testing.T) {
	left := map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}
	b1 := alloc{ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}
	tests := []struct {
		name       string
		objs       []any
		wb         string
		id, ifname string
		prepare    func(t *testing.T, r *rig)
		stdin      func(r *rig) []byte
		times      int
		want       map[string]alloc
		wantORIPs  []string
		calls      []string
		log        string
		// keep: the checkpoint stays (DEL could not know where it is).
		keep bool
	}{{
		// DEL is not handed to whereabouts: harvester-ipam releases the
		// entry and its reservation itself.
		name:      "released, with its reservation, without whereabouts",
		objs:      crashLoopedPool(),
		stdin:     func(r *rig) []byte { return r.config("0.3.1", "") },
		want:      left,
		wantORIPs: []string{"192.168.50.3=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"},
	}, {
		name:    "the NAD is gone: the checkpoint names the pool",
		objs:    crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) { r.record(t, "old1") },
		stdin:   func(r *rig) []byte { return r.goneConfig() },
		times:   2,
		want:    left,
	}, {
		name: "a config of only the type, with the flat file: the checkpoint names the pool",
		objs: crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) {
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
				Kubeconfig: "/elsewhere", Namespace: "kube-system", Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
		},
		stdin: func(r *rig) []byte { return r.rangelessConfig() },
		want:  left,
	}, {
		name:  "the NAD is gone and nothing was recorded: no store to look in",
		objs:  crashLoopedPool(),
		stdin: func(r *rig) []byte { return r.goneConfig() },
		want:  crashLoopedPool()[0].(*shim.Pool).Spec.Allocations,
	}, {
		name: "no pool named anywhere: the container's entry is found by its ID",
		objs: crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) {
			require.NoError(t, os.MkdirAll(r.cpDir, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(r.cpDir, "old1:lhnet1.json"), []byte("{garbage"), 0o600))
		},
		stdin: func(r *rig) []byte { return r.rangelessConfig() },
		want:  left,
		log:   "ignoring unreadable checkpoint",
	}, {
		name:  "the pool was deleted",
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		times: 2,
	}, {
		name:  "twice in a row",
		objs:  crashLoopedPool(),
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		times: 2,
		want:  left, // the second finds nothing held
	}, {
		// Hole 1: whereabouts v0.8.0 deallocates the container's first entry
		// (here lhnet1's): DEL of lhnet2 must not hand it over.
		name: "one of two attachments in one pool, on v0.8.0", wb: fake.V080,
		objs: twoAttachments(true), id: "c", ifname: "lhnet2",
		stdin:     func(r *rig) []byte { return r.config("0.3.1", "") },
		want:      map[string]alloc{"2": {ContainerID: "c", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, "4": b1},
		wantORIPs: []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"},
	}, {
		name: "one of two attachments in one pool, on v0.9.3, which matches the ifname", wb: fake.V093,
		objs: twoAttachments(true), id: "c", ifname: "lhnet2",
		stdin:     func(r *rig) []byte { return r.config("0.3.1", "") },
		want:      map[string]alloc{"2": {ContainerID: "c", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, "4": b1},
		wantORIPs: []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"},
	}, {
		name: "one of two attachments without ifnames (v0.7.0), by the address its checkpoint recorded", wb: fake.V070,
		objs: twoAttachments(false), id: "c", ifname: "lhnet2",
		prepare: func(t *testing.T, r *rig) {
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "c", IfName: "lhnet2", Network: "storagenetwork", PodRef: "longhorn-system/im-a",
				Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, IPs: []string{"192.168.50.3/24"}}))
		},
		stdin:     func(r *rig) []byte { return r.config("0.3.1", "") },
		want:      map[string]alloc{"2": {ContainerID: "c", PodRef: "longhorn-system/im-a"}, "4": b1},
		wantORIPs: []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"},
	}, {
		// lhnet2's ADD chose .2 on a stale copy, recorded it and never
		// wrote it (the node agent killed before its patch); the pool gave
		// .2 to lhnet1 since, which recorded it too. Whose the entry is,
		// nothing tells: left, for the sandbox's last DEL.
		name: "an address recorded by two attachments without ifnames (v0.7.0): left", wb: fake.V070,
		objs: []any{ipamPool(map[string]alloc{"2": {ContainerID: "c", PodRef: "longhorn-system/im-a"}, "4": b1}),
			fake.NewReservation("192.168.50.2", "longhorn-system/im-a"), fake.NewReservation("192.168.50.4", "longhorn-system/im-b")},
		id: "c", ifname: "lhnet2",
		prepare: func(t *testing.T, r *rig) {
			for _, ifn := range []string{"lhnet1", "lhnet2"} {
				require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "c", IfName: ifn, Network: "storagenetwork", PodRef: "longhorn-system/im-a",
					Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, IPs: []string{"192.168.50.2/24"}}))
			}
		},
		stdin:     func(r *rig) []byte { return r.config("0.3.1", "") },
		want:      map[string]alloc{"2": {ContainerID: "c", PodRef: "longhorn-system/im-a"}, "4": b1},
		wantORIPs: []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"},
		log:       "holds an entry of container c without an ifname that no checkpoint records as lhnet2's: left it",
	}, {
		name: "one of two attachments without ifnames and nothing recorded: none released, and it says so", wb: fake.V070,
		objs: twoAttachments(false), id: "c", ifname: "lhnet2",
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		want:  twoAttachments(false)[0].(*shim.Pool).Spec.Allocations,
		log:   "holds an entry of container c without an ifname that no checkpoint records as lhnet2's: left it",
	}, {
		// Hole 4.
		name:    "a config with an option of a newer release",
		objs:    crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) { r.record(t, "old1") },
		stdin: func(r *rig) []byte {
			return r.config("0.3.1", `,"harvester_ipam":{"checkpoint_dir":"`+r.cpDir+`","release_on_node_loss":true}`)
		},
		want: left,
	}, {
		name:    "a config whose ipam is not an object: the default checkpoint dir",
		objs:    crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) { r.record(t, "old1") },
		stdin: func(r *rig) []byte {
			return []byte(`{"cniVersion":"0.3.1","name":"storagenetwork","ipam":"harvester-ipam"}`)
		},
		// Nothing recorded in the default dir, no kubeconfig: nothing to do,
		// and no error that would hang the pod.
		want: crashLoopedPool()[0].(*shim.Pool).Spec.Allocations,
		keep: true,
	}, {
		name: "a checkpoint of a newer release",
		objs: crashLoopedPool(),
		prepare: func(t *testing.T, r *rig) {
			require.NoError(t, os.MkdirAll(r.cpDir, 0o700))
			b := `{"version":3,"containerID":"old1","ifName":"lhnet1","kubeconfig":"` + r.kubeconfig() + `","namespace":"kube-system","pools":[{"name":"` + poolName + `","range":"192.168.50.0/24"}],"future":{"x":1}}`
			require.NoError(t, os.WriteFile(filepath.Join(r.cpDir, "old1:lhnet1.json"), []byte(b), 0o600))
		},
		stdin: func(r *rig) []byte { return r.goneConfig() },
		want:  left,
	}, {
		// The checkpoint's namespace, not the kubeconfig's.
		name: "a checkpoint of another namespace",
		objs: append(crashLoopedPool(), func() any {
			p := ipamPool(map[string]alloc{"7": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}})
			p.Namespace = "harvester-system"
			return p
		}()),
		prepare: func(t *testing.T, r *rig) {
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
				Kubeconfig: r.kubeconfig(), Namespace: "harvester-system", Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
		},
		stdin: func(r *rig) []byte { return r.goneConfig() },
		want:  crashLoopedPool()[0].(*shim.Pool).Spec.Allocations,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.objs...)
			if tt.wb != "" {
				r.wb.Version = tt.wb
			}
			id, ifname := "old1", "lhnet1"
			if tt.id != "" {
				id, ifname = tt.id, tt.ifname
			}
			if tt.prepare != nil {
				tt.prepare(t, r)
			}
			times := max(tt.times, 1)
			for i := 0; i < times; i++ {
				require.NoError(t, r.p.Del(args(t, id, ifname, "", tt.stdin(r))), "DEL #%d", i+1)
			}
			assert.Equal(t, tt.calls, r.calls())
			if tt.want != nil {
				assert.Equal(t, tt.want, r.pool())
			}
			if tt.wantORIPs != nil {
				assert.Equal(t, tt.wantORIPs, r.orips())
			}
			if tt.log != "" {
				assert.Contains(t, r.log.String(), tt.log)
			}
			_, ok, _ := checkpoint.Dir(r.cpDir).Read(id, ifname)
			assert.Equal(t, tt.keep, ok, "the checkpoint is gone")
		})
	}
}

// DEL in the checkpoint's namespace releases there, and nowhere else.
func TestDelReleasesInTheCheckpointsNamespace(t *testing.T) {
	other := ipamPool(map[string]alloc{"7": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}})
	other.Namespace = "harvester-system"
	r := newRig(t, append(crashLoopedPool(), other)...)
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
		Kubeconfig: r.kubeconfig(), Namespace: "harvester-system", Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
	require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", "", r.goneConfig())))
	assert.Empty(t, r.api.Pool("harvester-system", poolName).Spec.Allocations, "released where it was recorded")
	assert.Len(t, r.pool(), 3, "the kubeconfig's namespace untouched")
}

func TestDelWithTheStoreDownIsAnError(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old1")
	r.storeDown()
	err := r.p.Del(args(t, "old1", "lhnet1", "", r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err), "the runtime must retry")
	assert.Contains(t, err.Error(), "read pool kube-system/192.168.50.0-24")
	assert.Empty(t, r.calls(), "no delegate that would wait for a lease it cannot get")
	_, ok, _ := checkpoint.Dir(r.cpDir).Read("old1", "lhnet1")
	assert.True(t, ok, "the checkpoint stays for the retry")
}

// DEL of a node-slice config goes to whereabouts alone: ADD refused it, so
// nothing of the attachment is harvester-ipam's.
func TestDelOfNodeSlicesIsWhereabouts(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", podArgs, r.config("0.3.1", `,"node_slice_size":"/26"`))))
	assert.Equal(t, []string{"DEL whereabouts"}, r.calls())
}

// DEL finishes the reservation an earlier DEL (its own or whereabouts') left
// when it died after removing the entry: the checkpoint recorded the address.
func TestDelFinishesALeftReservation(t *testing.T) {
	objs := crashLoopedPool()
	delete(objs[0].(*shim.Pool).Spec.Allocations, "2")
	r := newRig(t, objs...)
	r.record(t, "old1", "192.168.50.2/24")
	require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", "", r.config("0.3.1", ""))))
	assert.NotContains(t, r.orips(), "192.168.50.2=longhorn-system/im-a")
	assert.Contains(t, r.log.String(), "deleted reservation 192.168.50.2 of longhorn-system/im-a, left by an earlier DEL")
}

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
	objs := append(crashLoopedPool(), second, fake.NewReservation("10.1.0.7", "longhorn-system/im-a"))
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
	}), other, fake.NewReservation("192.168.50.2", "longhorn-system/im-a"), fake.NewReservation("192.168.50.3", "longhorn-system/im-a"),
		fake.NewReservation("10.9.0.7", "longhorn-system/im-a"))

	require.NoError(t, r.p.Del(args(t, "sbx", "lhnet1", "", r.rangelessConfig())))

	assert.Equal(t, map[string]alloc{
		"3": {ContainerID: "sbx", PodRef: "longhorn-system/im-a", IfName: "lhnet2"},
		"4": {ContainerID: "sbx", PodRef: "longhorn-system/im-a"},
		"5": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool(), "only lhnet1's entry released")
	assert.Empty(t, r.api.Pool("kube-system", "10.9.0.0-24").Spec.Allocations, "in every pool")
	assert.Equal(t, []string{"192.168.50.3=longhorn-system/im-a"}, r.orips(), "lhnet2's reservation stays")
}

// storeOf tries each kubeconfig once, in order: the config's, the
// checkpoint's and the flat file's are mostly one file, and one that is half
// written has been read again for a second already.
func TestStoreOfTriesEachKubeconfigOnce(t *testing.T) {
	tests := []struct {
		name        string
		kubeconfigs []string
		broken      map[string]bool
		wantTried   []string
		wantErr     string
	}{
		{"the first that loads", []string{"a", "b"}, nil, []string{"a"}, ""},
		{"the next when one fails", []string{"a", "b"}, map[string]bool{"a": true}, []string{"a", "b"}, ""},
		{"the same file once", []string{"a", "a", "a"}, map[string]bool{"a": true}, []string{"a"}, "a is broken"},
		{"empty paths skipped", []string{"", "a", "", "a", "b"}, map[string]bool{"a": true}, []string{"a", "b"}, ""},
		{"the first error when all fail", []string{"a", "b"}, map[string]bool{"a": true, "b": true}, []string{"a", "b"}, "a is broken"},
		{"none named", []string{"", ""}, nil, nil, "no kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tried []string
			p := &Plugin{NewStore: func(path string) (*shim.Store, error) {
				tried = append(tried, path)
				if tt.broken[path] {
					return nil, errors.New(path + " is broken")
				}
				return shim.New(fake.New(), "kube-system", shim.Options{}), nil
			}}
			s, err := p.storeOf(tt.kubeconfigs...)
			assert.Equal(t, tt.wantTried, tried)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, s)
		})
	}
}

// whereabouts' token-watcher rewrites its kubeconfig in place, so a plugin
// can read it half-written: DEL then fails with what is wrong with it (the
// runtime retries), not as if no kubeconfig were named, and releases nothing,
// whether the config names it or, the NAD gone, only the checkpoint does.
func TestDelWithAKubeconfigHalfWrittenSaysWhatIsWrong(t *testing.T) {
	for _, tt := range []struct {
		name  string
		stdin func(r *rig) []byte
	}{
		{"named by the config", func(r *rig) []byte { return r.config("0.3.1", "") }},
		{"named by the checkpoint alone", func(r *rig) []byte { return r.goneConfig() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			r.record(t, "old1", "192.168.50.2/24")
			kc := r.kubeconfig()
			b, err := os.ReadFile(kc)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(kc, b[:len(b)/3], 0o600))

			err = r.p.Del(args(t, "old1", "lhnet1", podArgs, tt.stdin(r)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), kc, "it names the kubeconfig")
			assert.NotContains(t, err.Error(), "no kubeconfig")
			assert.Len(t, r.pool(), 3, "nothing released")
			_, ok, err := checkpoint.Dir(r.cpDir).Read("old1", "lhnet1")
			require.NoError(t, err)
			assert.True(t, ok, "the record stays for the retry")
		})
	}
}

// staleCopy is the API server with a node agent's own copy of the pools and
// reservations (shim.Local) that stopped at one moment: the informer has not
// delivered what was written since.
type staleCopy struct {
	*fake.API
	pools map[string]*shim.Pool
	resv  map[string]*shim.Reservation
}

func copyOf(api *fake.API) *staleCopy {
	c := &staleCopy{API: api, pools: map[string]*shim.Pool{}, resv: map[string]*shim.Reservation{}}
	for _, p := range api.AllPools("kube-system") {
		c.pools[p.Name] = &p
	}
	for _, o := range api.AllReservations("kube-system") {
		c.resv[o.Name] = &o
	}
	return c
}

func (c *staleCopy) LocalPool(_, name string) *shim.Pool               { return c.pools[name] }
func (c *staleCopy) LocalReservation(_, name string) *shim.Reservation { return c.resv[name] }

// A node agent's DEL plans on its copy of the pool, which may be behind: the
// agent took the ADD, wrote 192.168.50.5 and did not answer; the plugin
// released that and the exec path allocated 192.168.50.9 to the same
// attachment, which the copy has not seen. The patch planned on the copy
// fails its resourceVersion test (422), the fresh read finds .5 gone: DEL
// plans again on a fresh read and releases .9 and its reservation before it
// forgets the checkpoint.
func TestDelPlansAgainWhenItsCopyWasBehind(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	p := r.api.Pool("kube-system", poolName)
	p.Spec.Allocations["5"] = alloc{ContainerID: "new1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
	_, err := r.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	r.api.Put(fake.NewReservation("192.168.50.5", "longhorn-system/im-a"))
	cp := copyOf(r.api)
	// Since: .5 released, .9 allocated by the exec path.
	p = r.api.Pool("kube-system", poolName)
	delete(p.Spec.Allocations, "5")
	p.Spec.Allocations["9"] = alloc{ContainerID: "new1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
	_, err = r.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	r.api.Remove(fake.Reservations, "kube-system", "192.168.50.5")
	r.api.Put(fake.NewReservation("192.168.50.9", "longhorn-system/im-a"))
	r.record(t, "new1", "192.168.50.5/24", "192.168.50.9/24")
	opts := shim.Options{Backoff: shim.Backoff{Steps: 4, Duration: 1, Factor: 2}}
	r.p.NewStore = func(string) (*shim.Store, error) { return shim.New(cp, "kube-system", opts), nil }

	require.NoError(t, r.p.Del(args(t, "new1", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.NotContains(t, r.pool(), "9", "the attachment's entry the copy did not show is released")
	assert.Len(t, r.pool(), 3, "nothing else")
	assert.NotContains(t, r.orips(), "192.168.50.9=longhorn-system/im-a")
	_, ok, err := checkpoint.Dir(r.cpDir).Read("new1", "lhnet1")
	require.NoError(t, err)
	assert.False(t, ok, "forgotten once released")
}

// A node agent's DEL whose copy of the pool does not show the attachment's
// entry at all (written after the copy, by the exec path covering for a
// lost ADD) never decides "nothing held" from it: it reads fresh, releases
// the entry and its reservation, and only then forgets the checkpoint.
func TestDelNeverDecidesNothingHeldFromItsCopy(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	cp := copyOf(r.api) // before the attachment's entry
	p := r.api.Pool("kube-system", poolName)
	p.Spec.Allocations["9"] = alloc{ContainerID: "new1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
	_, err := r.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	r.api.Put(fake.NewReservation("192.168.50.9", "longhorn-system/im-a"))
	r.record(t, "new1", "192.168.50.9/24")
	opts := shim.Options{Backoff: shim.Backoff{Steps: 4, Duration: 1, Factor: 2}}
	r.p.NewStore = func(string) (*shim.Store, error) { return shim.New(cp, "kube-system", opts), nil }

	require.NoError(t, r.p.Del(args(t, "new1", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.NotContains(t, r.pool(), "9", "the entry the copy did not show is released")
	assert.NotContains(t, r.orips(), "192.168.50.9=longhorn-system/im-a", "and its reservation")
	_, ok, err := checkpoint.Dir(r.cpDir).Read("new1", "lhnet1")
	require.NoError(t, err)
	assert.False(t, ok, "forgotten once released")
}
