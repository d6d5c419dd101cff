package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// The tests of this file hold harvester-ipam to what it must never do: free
// an address a live sandbox still uses; and to what it must not do either:
// keep one forever that nothing will use again.

// Two attachments of one sandbox in one pool (the storage network attached
// twice, or two NADs sharing a range): a DEL of one releases exactly its own
// address and reservation; the other interface keeps its address.
func TestTwoAttachmentsOfOneSandboxInOnePool(t *testing.T) {
	onEachDelegate(t, func(t *testing.T, e *env) {
		n1 := e.network(t, testcni.Network{})
		n2 := e.network(t, testcni.Network{Range: n1.Range})
		require.Equal(t, n1.PoolName(), n2.PoolName(), "one pool")
		pod := e.Pod("instance-manager-twice")
		first := add(t, n1, pod)
		second := first.Attach(n2, "lhnet2")
		require.NoError(t, second.Add(ctx(t)), "ADD of the second attachment")
		require.NotEqual(t, first.IP(), second.IP())

		require.NoError(t, second.Del(ctx(t)), "DEL of the second attachment")
		allocs := mustAllocs(t, n1)
		t.Logf("pool after the DEL of lhnet2:\n%s", testcni.Table(allocs))
		verify(t, n1, []*testcni.Sandbox{first}, pod)
		require.NoError(t, second.Del(ctx(t)), "DEL again")
		verify(t, n1, []*testcni.Sandbox{first}, pod)

		require.NoError(t, first.Del(ctx(t)), "DEL of the first attachment")
		verify(t, n1, nil, pod)
	})
}

// A sandbox with two interfaces in one pool, whose pod's network-status names
// one of them: the other is its sibling, not a superseded sandbox's, and the
// reconciler keeps both.
func TestReconcilerKeepsASiblingAttachment(t *testing.T) {
	onEachAllocator(t, func(t *testing.T, e *env) {
		n1 := e.network(t, testcni.Network{})
		n2 := e.network(t, testcni.Network{Range: n1.Range})
		pod := e.Pod("instance-manager-siblings")
		first := add(t, n1, pod)
		second := first.Attach(n2, "lhnet2")
		require.NoError(t, second.Add(ctx(t)))
		require.NoError(t, rig.CreatePod(ctx(t), pod, testcni.PodState{Phase: corev1.PodRunning, StatusIPs: []string{first.IP()}}))

		e.reconcile(t)
		sleepPastGrace()
		out := e.reconcile(t)
		t.Logf("pass after the grace period:\n%s", out)
		verify(t, n1, []*testcni.Sandbox{first, second}, pod)
	})
}

// The storage network's range changed: the pod runs on with an address from
// the new pool, and its entry in the old pool (whose DEL was lost) is stale
// although a pod of that name exists: its network-status names no attachment
// with that address. Released after the grace period, not before; the new
// address stays.
func TestReconcilerReleasesAnOldPoolsEntryOfARunningPod(t *testing.T) {
	onEachAllocator(t, func(t *testing.T, e *env) {
		old := e.network(t, testcni.Network{})
		cur := e.network(t, testcni.Network{})
		pod := e.Pod("instance-manager-moved")
		was := add(t, old, pod)
		require.NoError(t, was.Kill(), "the old sandbox's DEL never came")
		now := add(t, cur, pod)
		require.NoError(t, rig.CreatePod(ctx(t), pod, testcni.PodState{Phase: corev1.PodRunning, StatusIPs: []string{now.IP()}}))

		out := e.reconcile(t)
		t.Logf("first pass:\n%s", out)
		assert.Len(t, testcni.Of(mustAllocs(t, old), pod.Ref()), 1, "not at first sight")
		sleepPastGrace()
		out = e.reconcile(t)
		t.Logf("pass after the grace period:\n%s", out)
		verify(t, old, nil, pod)
		verify(t, cur, []*testcni.Sandbox{now}, pod)
	})
}

// A DEL whose config this binary cannot fully parse (an option only a newer
// release knows, after a downgrade; a field of the wrong type) still
// releases, from the checkpoint; ADD of such a config is refused.
func TestDelOfAConfigItCannotFullyParse(t *testing.T) {
	onEachDelegate(t, func(t *testing.T, e *env) {
		n := e.network(t, testcni.Network{})
		for _, tt := range []struct {
			name   string
			mangle func(conf map[string]any)
		}{
			{"an option of a newer release", func(c map[string]any) {
				c["ipam"].(map[string]any)["harvester_ipam"] = map[string]any{"release_on_node_loss": true}
			}},
			{"an option of the wrong type", func(c map[string]any) {
				c["ipam"].(map[string]any)["harvester_ipam"] = map[string]any{"checkpoint_dir": 7}
			}},
			{"a range of the wrong type", func(c map[string]any) { c["ipam"].(map[string]any)["range"] = 5 }},
			{"an ipam that is not an object", func(c map[string]any) { c["ipam"] = "harvester-ipam" }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				pod := e.Pod("instance-manager-newer-" + strconv.Itoa(int(subnet.Add(1))))
				s := add(t, n, pod)
				conf := n.PluginConf()
				tt.mangle(conf)
				stdin, err := json.Marshal(conf)
				require.NoError(t, err)

				res, err := rig.Plugin(ctx(t), n, s.CNIEnv("ADD"), stdin)
				require.NoError(t, err)
				assert.NotZero(t, res.Exit, "ADD of such a config is refused: %s", res.Stdout)

				res, err = rig.Plugin(ctx(t), n, s.CNIEnv("DEL"), stdin)
				require.NoError(t, err)
				require.Zero(t, res.Exit, "DEL: %s %s", res.Stdout, res.Stderr)
				verify(t, n, nil, pod)
			})
		}
	})
}

// A checkpoint written by a newer release (after a downgrade) that this
// binary reads as best it can: DEL with the NAD gone still releases.
func TestDelWithACheckpointOfANewerRelease(t *testing.T) {
	onEachAllocator(t, func(t *testing.T, e *env) {
		n := e.network(t, testcni.Network{})
		pod := e.Pod("instance-manager-downgraded")
		s := add(t, n, pod)
		path := filepath.Join("/var/lib/cni/harvester-ipam", s.ContainerID+":lhnet1.json")
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		var rec map[string]any
		require.NoError(t, json.Unmarshal(b, &rec))
		rec["version"] = 3
		rec["nodeName"] = "a field of the future"
		b, err = json.Marshal(rec)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))

		require.NoError(t, n.ForgetIPAM())
		require.NoError(t, s.Del(ctx(t)), "DEL with the NAD gone")
		verify(t, n, nil, pod)
	})
}

// GC keys its records by the attachment's network and pools: another NAD of
// the same config name (two NADs in different namespaces often share one)
// keeps its live attachment. A record whose kubeconfig moved (an upgrade)
// is released with the config's kubeconfig, and blocks nothing.
func TestGCKeysRecordsByNetworkAndPools(t *testing.T) {
	onEachAllocator(t, func(t *testing.T, e *env) {
		kc := filepath.Join(t.TempDir(), "whereabouts.kubeconfig")
		wb, err := os.ReadFile(e.WhereaboutsKubeconfig)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(kc, wb, 0o600))
		a, err := rig.AddNetworkWithFlatFile(testcni.Network{Tenant: e.Tenant, Whereabouts: e.WB, CNIVersion: "1.1.0", Name: fmt.Sprintf("gc-%s", e.Name), Range: nextRange()}, kc)
		require.NoError(t, err)
		b := e.network(t, testcni.Network{CNIVersion: "1.1.0"})

		kept := add(t, a, e.Pod("instance-manager-kept"))
		lost := add(t, a, e.Pod("instance-manager-lost"))
		require.NoError(t, lost.Kill())
		// The other NAD's attachment, under the same network name.
		other, err := rig.NewSandbox(b, e.Pod("instance-manager-other-nad"), "lhnet1")
		require.NoError(t, err)
		bconf := b.PluginConf()
		bconf["name"] = a.Name
		bstdin, err := json.Marshal(bconf)
		require.NoError(t, err)
		res, err := rig.Plugin(ctx(t), b, other.CNIEnv("ADD"), bstdin)
		require.NoError(t, err)
		require.Zero(t, res.Exit, "ADD of the other NAD: %s %s", res.Stdout, res.Stderr)
		require.NoError(t, json.Unmarshal([]byte(res.Stdout), &other.Result))

		// An upgrade moved the kubeconfig: the flat file names the new path.
		moved := kc + ".moved"
		require.NoError(t, os.Rename(kc, moved))
		flat := a.PluginConf()["ipam"].(map[string]any)["configuration_path"].(string)
		fb, err := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]string{"kubeconfig": moved}})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(flat, fb, 0o600))

		conf := a.PluginConf()
		conf["cni.dev/valid-attachments"] = []map[string]string{{"containerID": kept.ContainerID, "ifname": "lhnet1"}}
		stdin, err := json.Marshal(conf)
		require.NoError(t, err)
		res, err = rig.Plugin(ctx(t), a, []string{"CNI_COMMAND=GC"}, stdin)
		require.NoError(t, err)
		require.Zero(t, res.Exit, "GC: %s %s", res.Stdout, res.Stderr)
		verify(t, a, []*testcni.Sandbox{kept}, kept.Pod, lost.Pod)
		verify(t, b, []*testcni.Sandbox{other}, other.Pod)
	})
}

// A pool with thousands of stale entries (a large range after a node loss):
// the reconciler records their first sightings and, after the grace period,
// releases every one of them, with a grace above zero.
func TestReconcilerReleasesThousandsOfStaleEntries(t *testing.T) {
	onEachAllocatorExecOnly(t, "the reconciler's passes over planted entries: the plugin runs one ADD, which every other test runs through the agent", func(t *testing.T, e *env) {
		const stale = 5000
		c := ctx(t)
		rng := fmt.Sprintf("10.%d.0.0/18", 160+subnet.Add(1)%90)
		n := e.network(t, testcni.Network{Range: rng})
		live := add(t, n, e.Pod("instance-manager-live"))
		require.NoError(t, rig.CreatePod(c, live.Pod, testcni.PodState{Phase: corev1.PodRunning, StatusIPs: []string{live.IP()}}))
		entries := map[string]whereaboutsv1alpha1.IPAllocation{}
		for i := 0; i < stale; i++ {
			entries[strconv.Itoa(100+i)] = whereaboutsv1alpha1.IPAllocation{
				ContainerID: fmt.Sprintf("dead%060d", i), PodRef: e.Pod(fmt.Sprintf("instance-manager-gone-%04d", i)).Ref(), IfName: "lhnet1"}
		}
		plant(t, n, entries, nil)

		start := time.Now()
		out := e.reconcile(t)
		t.Logf("first pass (%s): %s", time.Since(start).Round(time.Millisecond), lastLine(out))
		require.Len(t, mustAllocs(t, n), stale+1, "nothing released at first sight")
		sleepPastGrace()
		start = time.Now()
		out = e.reconcile(t)
		t.Logf("pass after the grace period (%s): %s", time.Since(start).Round(time.Millisecond), lastLine(out))
		verify(t, n, []*testcni.Sandbox{live}, live.Pod)
	})
}

// node_slice_size (whereabouts v0.9's fast IPAM) allocates from per-node
// pools harvester-ipam does not manage. A NAD that names harvester-ipam with
// it is refused, saying why, and nothing is allocated. Standing in for
// whereabouts, harvester-ipam hands such a config to the real binary as it
// came, which does with it what it always did: v0.9 looks for its node
// slices (the rig has none: whereabouts' own failure), v0.8.0 and v0.7.0
// ignore the field and allocate.
func TestNodeSliceSizeIsRefusedOrHandedOn(t *testing.T) {
	onEachDelegate(t, func(t *testing.T, e *env) {
		for _, ipam := range []string{testcni.Named, testcni.StandIn} {
			n := e.network(t, testcni.Network{IPAM: ipam})
			pod := e.Pod("instance-manager-sliced-" + ipam)
			s, err := rig.NewSandbox(n, pod, "lhnet1")
			require.NoError(t, err)
			conf := n.PluginConf()
			conf["ipam"].(map[string]any)["node_slice_size"] = "/26"
			stdin, err := json.Marshal(conf)
			require.NoError(t, err)
			res, err := rig.Plugin(ctx(t), n, s.CNIEnv("ADD"), stdin)
			require.NoError(t, err)
			allocs, err := n.Allocations(ctx(t))
			require.NoError(t, err)
			var cniErr struct {
				Code uint   `json:"code"`
				Msg  string `json:"msg"`
			}
			if ipam == testcni.Named {
				require.NotZero(t, res.Exit)
				require.NoError(t, json.Unmarshal([]byte(res.Stdout), &cniErr), res.Stdout)
				assert.EqualValues(t, 2, cniErr.Code, "an unsupported field")
				assert.Contains(t, cniErr.Msg, `ipam.node_slice_size "/26" is not supported by harvester-ipam`)
				assert.Empty(t, allocs, "nothing allocated")
				continue
			}
			assert.NotContains(t, res.Stdout, "not supported by harvester-ipam", "standing in, it does not refuse")
			if strings.HasPrefix(e.WB, "v0.9.") {
				require.NotZero(t, res.Exit, "whereabouts %s looks for its node slices", e.WB)
				assert.Contains(t, res.Stdout, "nodeslicepools", "whereabouts' own failure")
				assert.Empty(t, allocs)
			} else {
				require.Zero(t, res.Exit, "whereabouts %s ignores node_slice_size: %s", e.WB, res.Stdout)
				assert.Len(t, testcni.Of(allocs, pod.Ref()), 1, "whereabouts allocated")
			}
		}
	})
}

func nextRange() string {
	i := subnet.Add(1)
	return fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250)
}

func lastLine(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
