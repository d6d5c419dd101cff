package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func TestAddReclaimsEarlierSandboxesThenDelegates(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))

	assert.Equal(t, []string{"ADD whereabouts"}, r.calls())
	assert.Equal(t, map[string]alloc{
		"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool(), "one allocation for the pod; the other pod's untouched")
	assert.Equal(t, []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"}, r.orips())
	assert.JSONEq(t, `{"cniVersion":"0.3.1","ips":[{"version":"4","address":"192.168.50.2/24"}],"dns":{}}`, r.out.String())

	rec, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, rec.Pools)
	assert.Equal(t, []string{"192.168.50.2/24"}, rec.IPs)
	assert.Equal(t, "longhorn-system/im-a", rec.PodRef)
	assert.Equal(t, "kube-system", rec.Namespace)

	for _, want := range []string{"released 192.168.50.2 from pool 192.168.50.0-24", "was container old1, pod longhorn-system/im-a",
		"released 192.168.50.3", "reservation 192.168.50.3 deleted"} {
		assert.Contains(t, r.log.String(), want)
	}
	assert.NotContains(t, r.log.String(), "t0ken")
}

// The checkpoint is on disk before the delegate allocates: a crash between
// the two leaves a DEL that knows the attachment's pools, even with the NAD
// gone.
func TestAddRecordsTheAttachmentBeforeItDelegates(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.del.Before = func(verb string) error {
		_, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
		require.NoError(t, err)
		assert.True(t, ok, "recorded before %s", verb)
		return nil
	}
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
}

// ADD looks in the API server's watch cache first: with nothing to release
// there, it reads nothing fresh and writes nothing.
func TestAddLooksInTheCacheFirst(t *testing.T) {
	for _, tt := range []struct {
		name       string
		objs       []any
		lag        int
		wantFresh  int
		wantPool   int
		wantOldTwo bool
	}{
		{"nothing to release", []any{ipamPool(map[string]alloc{"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b"}})}, 0, 0, 2, false},
		{"an earlier sandbox", crashLoopedPool(), 0, 2, 2, false},
		// whereabouts v0.9.3 hands the sandbox the entry its pod and ifname
		// held; the entry without ifname waits for the next ADD.
		{"an earlier sandbox the cache has not seen yet: the next ADD's", crashLoopedPool(), 1000, 0, 3, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.objs...)
			r.api.CacheLag = func() int { return tt.lag }
			fresh := 0
			r.api.Hook = func(c *fake.Call) error {
				if c.Verb == "get" && c.Resource == fake.Pools && c.From == shim.Fresh && len(r.calls()) == 0 {
					fresh++
				}
				return nil
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
			assert.Equal(t, tt.wantFresh, fresh, "fresh reads of the pool before the delegate")
			assert.Len(t, r.pool(), tt.wantPool)
			_, held := r.pool()["3"]
			assert.Equal(t, tt.wantOldTwo, held)
		})
	}
}

func TestAddRefusesBadInputAndLosesNothing(t *testing.T) {
	tests := []struct {
		name     string
		id, ifn  string
		cniArgs  string
		stdin    func(r *rig) []byte
		wantCode uint
		wantMsg  string
	}{
		{"no pod identity", "new", "lhnet1", "IgnoreUnknown=true", nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_ARGS lacks K8S_POD_NAMESPACE and K8S_POD_NAME"},
		{"a container ID that escapes", "../../etc", "lhnet1", podArgs, nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID"},
		{"an ifname that escapes", "new", "../x", podArgs, nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_IFNAME"},
		{"no range", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.rangelessConfig() }, cnitypes.ErrInvalidNetworkConfig, "ipam config has no range"},
		{"no flat file", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.goneConfig() }, cnitypes.ErrInvalidNetworkConfig, "whereabouts flat file not found"},
		{"an unknown option", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.config("0.3.1", `,"harvester_ipam":{"bogus":1}`) }, cnitypes.ErrUnsupportedField, `unknown field "bogus"`},
		{"node slices", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.config("0.3.1", `,"node_slice_size":"/26"`) }, cnitypes.ErrUnsupportedField, `ipam.node_slice_size "/26" is not supported`},
		{"node slices of the wrong type", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.config("0.3.1", `,"node_slice_size":26`) }, cnitypes.ErrDecodingFailure, "node_slice_size must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			stdin := r.config("0.3.1", "")
			if tt.stdin != nil {
				stdin = tt.stdin(r)
			}
			err := r.p.Add(args(t, tt.id, tt.ifn, tt.cniArgs, stdin))
			assert.Equal(t, tt.wantCode, cniCode(t, err), "%v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.NotEmpty(t, err.(*cnitypes.Error).Details, "it says what to fix")
			assert.Empty(t, r.calls(), "nothing delegated")
			assert.Len(t, r.pool(), 3, "nothing released")
			assert.Empty(t, r.out.String(), "no result on stdout")
		})
	}
}

func TestAddWithTheStoreDownFailsBeforeDelegating(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.storeDown()
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.Contains(t, err.Error(), "release earlier sandboxes of longhorn-system/im-a from pool 192.168.50.0-24")
	assert.Contains(t, err.Error(), "connection refused")
	assert.Empty(t, r.calls())
}

func TestAddPassesTheDelegatesErrorOn(t *testing.T) {
	r := newRig(t, ipamPool(map[string]alloc{}))
	r.fillPool(t)
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, uint(cnitypes.ErrInternal), cniCode(t, err))
	assert.Contains(t, err.Error(), "whereabouts ADD: Could not allocate IP in range")
}

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
		oripObj("192.168.50.2", "longhorn-system/im-a"),
		oripObj("192.168.50.3", "longhorn-system/im-a"),
		oripObj("192.168.50.4", "longhorn-system/im-b"),
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

func TestStatus(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Status(args(t, "", "", "", r.config("1.1.0", ""))))
	assert.Equal(t, []string{"STATUS whereabouts"}, r.calls())

	r.storeDown()
	err := r.p.Status(args(t, "", "", "", r.config("1.1.0", "")))
	assert.Equal(t, uint(50), cniCode(t, err))
	assert.Contains(t, err.Error(), "IPPool store unreachable")

	err = r.p.Status(args(t, "", "", "", r.goneConfig()))
	assert.Equal(t, uint(50), cniCode(t, err))
}

// Every verb on every CNI version the plugin says it supports, as
// host-local's tests loop over the spec's versions.
func TestVerbsOnEverySpecVersion(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config(v, ""))))
			res, err := version.NewResult(v, r.out.Bytes())
			require.NoError(t, err, "a %s result: %s", v, r.out.String())
			assert.Equal(t, v, res.Version())
			cur, err := current.NewResultFromResult(res)
			require.NoError(t, err)
			require.Len(t, cur.IPs, 1)
			assert.Equal(t, "192.168.50.2/24", cur.IPs[0].Address.String())

			if v != "0.3.1" { // CHECK came with 0.4.0
				prev := append(r.config(v, "")[:len(r.config(v, ""))-1], []byte(`,"prevResult":`+strings.TrimSpace(r.out.String())+`}`)...)
				require.NoError(t, r.p.Check(args(t, "new", "lhnet1", podArgs, prev)))
			}
			if v == "1.1.0" { // STATUS and GC came with 1.1.0
				require.NoError(t, r.p.Status(args(t, "", "", "", r.config(v, ""))))
				c := r.config(v, "")
				require.NoError(t, r.p.GC(args(t, "", "", "", append(c[:len(c)-1], []byte(`,"cni.dev/valid-attachments":[{"containerID":"new","ifname":"lhnet1"}]}`)...))))
				assert.Len(t, r.pool(), 2, "GC keeps the valid attachment")
			}
			require.NoError(t, r.p.Del(args(t, "new", "lhnet1", podArgs, r.config(v, ""))))
			assert.Equal(t, map[string]alloc{"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}, r.pool())
		})
	}
}

// The crash points are the plugin's own step boundaries, in order.
func TestCrashPointsAreThePluginsSteps(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	var points []string
	r.p.AtStep = func(p string) { points = append(points, p) }
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.Equal(t, []string{"add-after-checkpoint", "add-after-reservations", "add-after-reclaim", "add-after-delegate"}, points)
	points = nil
	require.NoError(t, r.p.Del(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.Equal(t, []string{"del-after-reservations", "del-after-release"}, points)
}

func TestDelegateErrorsKeepTheirCode(t *testing.T) {
	err := delegateError("whereabouts", "ADD", &cnitypes.Error{Code: 11, Msg: "busy", Details: "d"})
	assert.Equal(t, uint(11), cniCode(t, err))
	assert.Equal(t, "whereabouts ADD: busy", err.(*cnitypes.Error).Msg)
	err = delegateError("whereabouts", "ADD", fmt.Errorf("exec: not found"))
	assert.Equal(t, uint(cnitypes.ErrInternal), cniCode(t, err))
	assert.Contains(t, err.(*cnitypes.Error).Details, "ipam.harvester_ipam.delegate")
}

func TestErrText(t *testing.T) {
	assert.Equal(t, "m: d", errText(&cnitypes.Error{Msg: "m", Details: "d"}))
	assert.Equal(t, "m", errText(&cnitypes.Error{Msg: "m"}))
	assert.Equal(t, "x", errText(errors.New("x")))
}

// A sandbox that never got its DEL leaves its checkpoint; once the next
// sandbox's ADD released its entries, the record is forgotten too, or such
// records pile up on the node forever (Multus never forwards GC).
func TestAddForgetsTheRecordsOfWhatItReleased(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old1", "192.168.50.2/24")
	other := checkpoint.Record{ContainerID: "old1", IfName: "lhnet2", Network: "othernet", PodRef: "longhorn-system/im-a",
		Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []checkpoint.Pool{{Name: "10.9.0.0-24", Range: "10.9.0.0/24"}}}
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(other))
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	recs, errs := checkpoint.Dir(r.cpDir).List()
	require.Empty(t, errs)
	var left []string
	for _, rec := range recs {
		left = append(left, rec.ContainerID+":"+rec.IfName)
	}
	assert.ElementsMatch(t, []string{"new:lhnet1", "old1:lhnet2"}, left, "old1's record of this pool is gone; its record of another pool stays")
	assert.NotContains(t, r.log.String(), "forget the checkpoint", "forgetting went well: no error logged")
}
