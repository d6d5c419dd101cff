package plugin

import (
	"errors"
	"fmt"
	"os"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
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

	// old1's entry on lhnet1 is whereabouts' to hand over (it keeps its
	// address and reservation); old2's, without an ifname, is released.
	for _, want := range []string{"released 192.168.50.3 from pool 192.168.50.0-24", "was container old2, pod longhorn-system/im-a",
		"reservation 192.168.50.3 deleted"} {
		assert.Contains(t, r.log.String(), want)
	}
	assert.NotContains(t, r.log.String(), "released 192.168.50.2 ")
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
		// The plan's fresh read, then the removal's patch on it.
		{"an earlier sandbox", crashLoopedPool(), 0, 1, 2, false},
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

// A sandbox that never got its DEL leaves its checkpoint; once the next
// sandbox's ADD released its entries, the record is forgotten too, or such
// records pile up on the node forever (Multus never forwards GC).
// old1's entry on lhnet1 is whereabouts' to hand over: its record stays, for
// its DEL, which finds nothing of its own left.
func TestAddForgetsTheRecordsOfWhatItReleased(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.record(t, "old2", "192.168.50.3/24")
	r.record(t, "old1", "192.168.50.2/24")
	other := checkpoint.Record{ContainerID: "old2", IfName: "lhnet2", Network: "othernet", PodRef: "longhorn-system/im-a",
		Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []checkpoint.Pool{{Name: "10.9.0.0-24", Range: "10.9.0.0/24"}}}
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(other))
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	recs, errs := checkpoint.Dir(r.cpDir).List()
	require.Empty(t, errs)
	var left []string
	for _, rec := range recs {
		left = append(left, rec.ContainerID+":"+rec.IfName)
	}
	assert.ElementsMatch(t, []string{"new:lhnet1", "old1:lhnet1", "old2:lhnet2"}, left, "old2's record of this pool is gone; its record of another pool stays")
	assert.NotContains(t, r.log.String(), "forget the checkpoint", "forgetting went well: no error logged")
}

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

// Names the checkpoint cannot record are refused as the bad input they are
// (found by FuzzParseArgs and FuzzLoad), not as a checkpoint dir that cannot
// be written (CNI error 5).
func TestAddRefusesWhatNoCheckpointCanRecord(t *testing.T) {
	tests := []struct {
		name, cniArgs, ipamExtra string
		wantCode                 uint
		wantMsg                  string
	}{
		{"a pod name that is not UTF-8", "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-\x93", "", cnitypes.ErrInvalidEnvironmentVariables, "is not a Kubernetes namespace and name"},
		{"a network_name with a slash", podArgs, `,"network_name":"storage/net"`, cnitypes.ErrInvalidNetworkConfig, "which Kubernetes refuses"},
		{"an uppercase network_name", podArgs, `,"network_name":"Storage"`, cnitypes.ErrInvalidNetworkConfig, "which Kubernetes refuses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			err := r.p.Add(hostileArgs("new", "lhnet1", tt.cniArgs, r.config("0.3.1", tt.ipamExtra)))
			assert.Equal(t, tt.wantCode, cniCode(t, err), "%v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Empty(t, r.calls(), "nothing delegated")
			assert.Len(t, r.pool(), 3, "nothing released")
			_, statErr := os.Stat(r.cpDir)
			assert.True(t, os.IsNotExist(statErr), "no checkpoint")
		})
	}
}

// The pod's earlier sandboxes, however many (one is the commonest: a sandbox
// that died without DEL), are all released by the next sandbox's ADD, on
// every whereabouts version: the pod then holds exactly one entry and one
// reservation, the new sandbox's, and the other pod keeps its own.
func TestAddLeavesThePodOneEntryWhateverItsEarlierSandboxes(t *testing.T) {
	for _, v := range []string{fake.V093, fake.V080, fake.V070} {
		for earlier := 0; earlier <= 3; earlier++ {
			// Entries as each version leaves them: v0.7.0's without ifname,
			// the newer ones' on the pod's interface, and one on another.
			for _, ifname := range []string{"", "lhnet1", "lhnet9"} {
				t.Run(fmt.Sprintf("%s, %d earlier sandboxes, ifname %q", v, earlier, ifname), func(t *testing.T) {
					allocs := map[string]alloc{"20": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}
					objs := []any{fake.NewReservation("192.168.50.20", "longhorn-system/im-b")}
					for i := 0; i < earlier; i++ {
						off := fmt.Sprint(10 + i)
						allocs[off] = alloc{ContainerID: fmt.Sprintf("old%d", i), PodRef: "longhorn-system/im-a", IfName: ifname}
						objs = append(objs, fake.NewReservation("192.168.50."+off, "longhorn-system/im-a"))
					}
					r := newRig(t, append(objs, ipamPool(allocs))...)
					r.wb.Version = v
					require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))

					held, ips := r.heldBy("longhorn-system/im-a")
					assert.Equal(t, []string{"new"}, held, "the pod's entries after the ADD")
					assert.Equal(t, alloc{ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}, r.pool()["20"], "the other pod's entry")
					assert.ElementsMatch(t, []string{ips[0] + "=longhorn-system/im-a", "192.168.50.20=longhorn-system/im-b"}, r.orips(), "the reservations")
				})
			}
		}
	}
}

// A crash loop: each sandbox of the pod dies without DEL and the next one is
// made, a random number of times. After every ADD, whatever the count so
// far, the pod holds one entry, the newest sandbox's.
func TestACrashLoopHoldsOneEntryAfterEveryAdd(t *testing.T) {
	for _, v := range []string{fake.V093, fake.V080, fake.V070} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t, ipamPool(map[string]alloc{}))
			r.wb.Version = v
			for i := 1; i <= 5; i++ {
				id := fmt.Sprintf("sandbox%d", i)
				r.out.Reset()
				require.NoError(t, r.p.Add(args(t, id, "lhnet1", podArgs, r.config("0.3.1", ""))))
				held, _ := r.heldBy("longhorn-system/im-a")
				require.Equal(t, []string{id}, held, "after the ADD of sandbox %d", i)
				require.Len(t, r.orips(), 1, "after the ADD of sandbox %d", i)
			}
		})
	}
}

// A reclaim whose reservations cannot be released fails ADD before anything
// is allocated, naming the addresses it was releasing.
func TestAddWhoseReclaimFailsNamesTheAddresses(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Reservations {
			return errors.New("etcdserver: request timed out")
		}
		return nil
	}
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.Contains(t, err.Error(), "release the reservations of 192.168.50.3 from pool kube-system/192.168.50.0-24")
	assert.Empty(t, r.calls(), "nothing delegated")
	assert.Len(t, r.pool(), 3, "nothing released")
}

// whereabouts v0.8.0 and later hand a new sandbox the entry its pod held on
// the same interface, in the one write that allocates: the pod keeps its
// address, and nothing reading the pool sees the pod without it (whereabouts'
// own suite polls for that: "can recover from an exhausted IP pool"). The
// ADD leaves that entry to whereabouts; it releases the earlier sandboxes'
// others (another interface's, v0.7.0's without an ifname) before, as ever.
func TestAddLeavesThePodsEntryOnItsInterfaceForWhereaboutsToHandOver(t *testing.T) {
	for _, v := range []string{fake.V093, fake.V080} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			r.wb.Version = v
			var gaps []string
			r.api.Hook = func(c *fake.Call) error {
				// Before every request, the writes so far: the pod's entry on
				// lhnet1 is in the pool all along.
				if p := r.api.Pool("kube-system", poolName); p != nil {
					if a, ok := p.Spec.Allocations["2"]; !ok || a.PodRef != "longhorn-system/im-a" {
						gaps = append(gaps, c.Verb+" "+c.Resource+" "+c.Name)
					}
				}
				return nil
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))

			assert.Empty(t, gaps, "requests that found the pod without its entry on lhnet1")
			assert.Equal(t, map[string]alloc{
				"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
				"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
			}, r.pool(), "the pod keeps its address on lhnet1; the earlier sandbox's other entry is released")
			assert.Equal(t, []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"}, r.orips())
			assert.Contains(t, r.log.String(), "released 192.168.50.3 from pool 192.168.50.0-24")
			assert.NotContains(t, r.log.String(), "released 192.168.50.2 ", "the entry whereabouts hands over is not released")
		})
	}
}

// A network of two ranges (range and ipRanges) on whereabouts v0.7.0's
// CRDs, which keep no ifname: the pod's next sandbox's ADD releases the
// earlier sandbox's entry in the first pool, and dies in the second pool's
// release, its reservation deleted, the entry not yet. The earlier
// sandbox's DEL must still release that entry: it is the attachment's only
// by the address its record names, so the ADD may forget the record of the
// pool it released, not the record of both (the simulation's seed 97 on
// v0.7.0 with the NAD kinds: the agent's DEL left it).
func TestAnEarlierSandboxsDELReleasesThePoolItsNextADDDidNot(t *testing.T) {
	r := newRig(t)
	r.api.PruneIfName = true
	r.wb.Version = fake.V070
	twoPools := r.config("0.3.1", `,"ipRanges":[{"range":"10.9.0.0/24"}]`)
	require.NoError(t, r.p.Add(args(t, "old", "lhnet1", podArgs, twoPools)))
	held := func(pool string) []string {
		var ids []string
		for _, a := range r.api.Pool("kube-system", pool).Spec.Allocations {
			ids = append(ids, a.ContainerID)
		}
		return ids
	}
	require.Equal(t, []string{"old"}, held("10.9.0.0-24"))

	releases := 0
	r.p.AtStep = func(p string) {
		if p == "add-after-reservations" {
			if releases++; releases == 2 {
				panic(crashed{p})
			}
		}
	}
	func() {
		defer func() {
			_, ok := recover().(crashed)
			require.True(t, ok, "the ADD died in its second release")
		}()
		_ = r.p.Add(args(t, "new", "lhnet1", podArgs, twoPools))
	}()
	r.p.AtStep = nil
	require.Empty(t, held(poolName), "the first pool released")
	require.Equal(t, []string{"old"}, held("10.9.0.0-24"), "the second pool's entry left by the crash")

	require.NoError(t, r.p.Del(args(t, "old", "lhnet1", podArgs, twoPools)))
	assert.Empty(t, held("10.9.0.0-24"), "the earlier sandbox's DEL released its entry in the pool the ADD did not")
}

// whereabouts' own suite deletes a StatefulSet's pod with a grace period of
// 0 and polls its pool for the pod's entry ("can recover from an exhausted
// IP pool"): the StatefulSet makes the pod again at once, and the kubelet
// runs its new sandbox's ADD while it tears the old sandbox down. A DEL of
// the old sandbox while that ADD is in flight (its record written, the
// allocation not yet) leaves the pod's entry on the interface to the ADD,
// which hands it over in the write that allocates (or, a whereabouts that
// hands nothing over, releases it then): the pool never shows the pod
// without its address, and the entry is never left behind. An entry the ADD
// could not tell is on its interface (no ifname) is released as before.
func TestAnEarlierSandboxsDELLeavesItsEntryToThePodsADDInFlight(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    map[string]alloc
		gapless bool
	}{
		{fake.V093, map[string]alloc{"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, true},
		{fake.V080, map[string]alloc{"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, true},
		{fake.V070, map[string]alloc{"2": {ContainerID: "new", PodRef: "longhorn-system/im-a"}}, false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			r := newRig(t, ipamPool(map[string]alloc{}))
			r.wb.Version = tc.version
			if tc.version == fake.V070 {
				r.api.PruneIfName = true
			}
			require.NoError(t, r.p.Add(args(t, "old", "lhnet1", podArgs, r.config("0.3.1", ""))))
			require.Len(t, r.pool(), 1)

			var gaps []string
			watch := func(c *fake.Call) error {
				if p := r.api.Pool("kube-system", poolName); p != nil {
					found := false
					for _, a := range p.Spec.Allocations {
						found = found || a.PodRef == "longhorn-system/im-a"
					}
					if !found {
						gaps = append(gaps, c.Verb+" "+c.Resource+" "+c.Name)
					}
				}
				return nil
			}
			r.api.Hook = watch
			delDone := false
			r.p.AtStep = func(p string) {
				if p != "add-after-reclaim" || delDone {
					return
				}
				delDone = true
				// The old sandbox's DEL, from another process, while the ADD
				// is between its reclaim and whereabouts.
				require.NoError(t, r.p.Del(args(t, "old", "lhnet1", podArgs, r.config("0.3.1", ""))))
				args(t, "new", "lhnet1", podArgs, nil) // the ADD's environment again
				watch(&fake.Call{Verb: "after", Resource: "the old sandbox's DEL"})
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
			require.True(t, delDone)
			r.p.AtStep = nil

			assert.Equal(t, tc.want, r.pool(), "the pod's one entry, the new sandbox's")
			assert.Equal(t, []string{"192.168.50.2=longhorn-system/im-a"}, r.orips())
			if tc.gapless {
				assert.Empty(t, gaps, "requests that found the pod without its entry")
			}
			_, held, err := checkpoint.Dir(r.cpDir).Read("old", "lhnet1")
			require.NoError(t, err)
			assert.False(t, held, "the old sandbox's DEL forgot its record")
			recs, _ := checkpoint.Dir(r.cpDir).InFlight()
			assert.Empty(t, recs, "no ADD in flight once it answered")
		})
	}
}
