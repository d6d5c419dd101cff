package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// TestWhereaboutsPartsBeside runs whereabouts' own controllers as Harvester
// runs them (ip-control-loop from its DaemonSet; from v0.9.4 its reconciler
// Deployment) beside harvester-ipam on one pool whose NAD names whereabouts:
// pods live, recreate their sandbox, go away with and without DEL, and come
// back under the same name; then harvester-ipam's reconciler passes too.
// Every live sandbox keeps its address and reservation, the gone pods hold
// nothing, and no address is handed out twice.
//
// whereabouts' reconciler judges every pool of the cluster, so this test
// runs on a cluster of its own (the rig's CRDs), where no other test's
// leftovers are; its versions and paths share it, each on a node of its
// own. Every version's pods start before any version's parts do: a
// reconciler run that lists a pool between an ADD and the network-status
// that names its address frees it (whereabouts' window, on a real node
// too, where the pod stays Pending through it and the reconciler looks
// again for a while), and another version's reconciler would look at this
// one's setup. A pod started once the parts run is Pending until its
// network-status is written, as the kubelet and Multus order it. Its cron
// runs at most once a minute: each version waits for one run after the
// pods went away.
func TestWhereaboutsPartsBeside(t *testing.T) {
	t.Parallel()
	c, err := rig.StartCRDCluster(ctx(t), "parts", testcni.Delegates[0])
	require.NoError(t, err)
	// On every version through the agent too: what is under test is
	// whereabouts' own controllers reading and releasing what the agent
	// wrote, and v0.9.4's reconciler is a part of its own.
	partsBeside(t, c, testcni.Delegates, paths(t))
}

// partsBeside runs the scene of TestWhereaboutsPartsBeside on cluster c for
// each version and path, side by side, as subtests of t: every side's pods
// start before any side's parts do.
func partsBeside(t *testing.T, c *testcni.Rig, versions, paths []string) {
	type side struct {
		name  string
		scene *partsScene
	}
	var sides []*side
	for _, path := range paths {
		for _, v := range versions {
			sides = append(sides, &side{name: subtest(v, path), scene: &partsScene{e: newEnvIn(t, c, v, path)}})
		}
	}
	// Returns once every side's pods run or its start failed.
	t.Run("pods start", func(t *testing.T) {
		for _, s := range sides {
			t.Run(s.name, func(t *testing.T) {
				t.Parallel()
				s.scene.start(t)
			})
		}
	})
	for _, s := range sides {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			if !s.scene.started {
				t.Fatalf("its pods did not start: see pods start/%s", s.name)
			}
			s.scene.beside(t)
		})
	}
}

// partsScene is one version's and path's pods of TestWhereaboutsPartsBeside.
type partsScene struct {
	e                                       *env
	node, nad                               string
	n, named                                *testcni.Network
	keep, again, gone, done, same, namedPod testcni.Pod
	sb                                      map[testcni.Pod]*testcni.Sandbox
	started                                 bool
}

// start runs the pods, before any of whereabouts' parts do.
func (s *partsScene) start(t *testing.T) {
	e := s.e
	s.node = e.Node("n1")
	require.NoError(t, e.R.CreateNode(ctx(t), s.node))
	s.n = e.network(t, testcni.Network{})
	s.nad = createHarvesterNAD(t, e, s.n)

	s.keep, s.again, s.gone, s.done, s.same = e.Pod("keep"), e.Pod("again"), e.Pod("gone"), e.Pod("done"), e.Pod("same")
	s.sb = map[testcni.Pod]*testcni.Sandbox{}
	for _, p := range []testcni.Pod{s.keep, s.again, s.gone, s.done, s.same} {
		s.sb[p] = runningPod(t, e, s.n, p, s.node, s.nad)
	}
	// A network with a network_name: its reservations are named
	// "storage-<address>".
	s.named = e.network(t, testcni.Network{NetworkName: "storage"})
	s.namedPod = e.Pod("named")
	s.sb[s.namedPod] = runningPod(t, e, s.named, s.namedPod, s.node, createHarvesterNAD(t, e, s.named))

	// A sandbox recreated without DEL: harvester-ipam's ADD releases the old
	// one. The pod stays Running, as the kubelet leaves it.
	require.NoError(t, s.sb[s.again].Kill())
	s.sb[s.again] = add(t, s.n, s.again)
	setNetworkStatus(t, e.R, s.again, s.nad, s.sb[s.again].IP())
	s.started = true
}

// beside starts whereabouts' parts and runs the rest of the scene.
func (s *partsScene) beside(t *testing.T) {
	c := ctx(t)
	e, n, node, nad, sb := s.e, s.n, s.node, s.nad, s.sb
	keep, again, gone, done, same, namedPod := s.keep, s.again, s.gone, s.done, s.same, s.namedPod

	parts, err := e.R.StartWhereaboutsParts(c, testcni.PartsOptions{Version: e.WB, Node: node, Tenant: e.Tenant, Cron: "* * * * *"})
	require.NoError(t, err)
	t.Cleanup(parts.Stop)
	reconcilerPart := "ip-control-loop"
	if testcni.AtLeast(e.WB, testcni.V094) {
		reconcilerPart = "reconciler"
	}
	runsBefore := reconcilerRuns(parts.Log(reconcilerPart))
	// A pod stopped as usual: DEL, then the object goes; nothing is left to
	// release when the pod controller looks.
	require.NoError(t, sb[done].Del(c))
	require.NoError(t, e.R.DeletePod(c, done))
	// A pod whose node died: no DEL, the object is force-deleted.
	require.NoError(t, sb[gone].Kill())
	require.NoError(t, e.R.DeletePod(c, gone))
	goneIP := sb[gone].IP()
	// A pod deleted and created again under its name (a StatefulSet's, say)
	// whose old sandbox never saw DEL: its new sandbox is live.
	require.NoError(t, sb[same].Kill())
	require.NoError(t, e.R.DeletePod(c, same))
	sb[same] = runningPod(t, e, n, same, node, nad)

	// The pod controller has seen the deletions once it has logged each.
	for _, p := range []testcni.Pod{done, gone, same} {
		require.NoError(t, parts.WaitLog(c, "ip-control-loop", "deleted pod ["+p.Ref()+"]", 1, 30*time.Second))
	}
	if testcni.AtLeast(e.WB, testcni.V092) {
		// It releases what the gone pod held, by its container ID and ifname
		// (v0.9.2's pod controller is v0.9.3's: pkg/controlloop is unchanged
		// between them).
		require.NoError(t, waitReleased(c, n, gone), "the pod controller did not release %s of %s:\n%s", goneIP, gone.Ref(), parts.Log("ip-control-loop"))
	} else {
		// Before v0.9.2 (here: v0.8.0, v0.7.0) its deallocation has no
		// namespace for whereabouts' Lease (nor a container ID): its one
		// worker waits for that Lease for ever, and the pod controller
		// releases nothing.
		require.NoError(t, parts.WaitLog(c, "ip-control-loop", "an empty namespace may not be set", 1, 30*time.Second))
	}
	// One whereabouts reconciler run after all that. It may fail: up to
	// v0.9.3 every node's ip-control-loop runs it on the same cron, and the
	// versions here do too; a pool written since its list fails its patch.
	err = wait.PollUntilContextTimeout(c, time.Second, 90*time.Second, true, func(context.Context) (bool, error) {
		return reconcilerRuns(parts.Log(reconcilerPart)) > runsBefore, nil
	})
	require.NoError(t, err, "no whereabouts reconciler run:\n%s", parts.Log(reconcilerPart))
	// whereabouts' reconciler turns a reservation's name back into an
	// address by replacing every "-" with ":" (findClusterWideIPReservations):
	// "storage-10.x.y.z" is never a pod's address, so a successful run
	// deletes the live pod's reservation (alone too); its entry stays.
	namedRes := names.Reservation(net.ParseIP(sb[namedPod].IP()), "storage")
	err = wait.PollUntilContextTimeout(c, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		orips, err := s.named.ORIPs(ctx)
		for _, o := range orips {
			if o.Name == namedRes {
				return false, err
			}
		}
		return err == nil, err
	})
	require.NoError(t, err, "whereabouts' reconciler kept %s", namedRes)
	allocs, err := s.named.Allocations(c)
	require.NoError(t, err)
	require.Len(t, testcni.Of(allocs, namedPod.Ref()), 1, "the named network's entry of %s", namedPod.Ref())
	// And harvester-ipam's reconciler: whatever is left of a gone pod goes.
	e.reconcile(t)
	sleepPastGrace()
	e.reconcile(t)

	// A new pod gets an address no live sandbox holds.
	late := e.Pod("late")
	sb[late] = runningPod(t, e, n, late, node, nad)

	live := []*testcni.Sandbox{sb[keep], sb[again], sb[same], sb[late]}
	verify(t, n, live, keep, again, gone, done, same, late)
	require.True(t, parts.Running("ip-control-loop"), "ip-control-loop exited:\n%s", parts.Log("ip-control-loop"))
	for _, p := range []string{"ip-control-loop", "reconciler"} {
		require.NotContains(t, parts.Log(p), "panic:", "whereabouts %s %s", e.WB, p)
	}
}

// reconcilerRuns counts the ends of whereabouts' reconciler runs in a log:
// "reconciler success" or "reconciler failure" (cmd/controlloop before
// v0.9.4), "reconciler run succeeded" or "reconciler run failed"
// (cmd/reconciler from it).
func reconcilerRuns(log string) int {
	n := 0
	for _, s := range []string{"reconciler success", "reconciler failure", "reconciler run succeeded", "reconciler run failed"} {
		n += strings.Count(log, s)
	}
	return n
}

// createHarvesterNAD creates the network's NAD as Harvester writes it: the
// IPAM named whereabouts, no configuration_path (the flat file is found at
// the host's /etc/cni/net.d/whereabouts.d).
func createHarvesterNAD(t *testing.T, e *env, n *testcni.Network) string {
	t.Helper()
	ipam := map[string]any{"type": "whereabouts", "range": n.Range}
	if n.NetworkName != "" {
		ipam["network_name"] = n.NetworkName
	}
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "0.3.1", "type": "bridge", "bridge": "mgmt-br", "promiscMode": true, "ipam": ipam,
	})
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": n.Name, "namespace": e.PodNamespace},
		"spec":     map[string]any{"config": string(conf)},
	}}
	_, err := e.R.Dynamic.Resource(testcni.NADResource).Namespace(e.PodNamespace).Create(ctx(t), obj, metav1.CreateOptions{})
	require.NoError(t, err)
	return e.PodNamespace + "/" + n.Name
}

// runningPod starts a pod on node attached to nad in the kubelet's and
// Multus' order: the object Pending, its sandbox's ADD, its network-status
// naming the address ADD gave, then Running.
func runningPod(t *testing.T, e *env, n *testcni.Network, pod testcni.Pod, node, nad string) *testcni.Sandbox {
	t.Helper()
	require.NoError(t, createPodOnNAD(ctx(t), e.R, pod, node, nad))
	s := add(t, n, pod)
	setNetworkStatus(t, e.R, pod, nad, s.IP())
	require.NoError(t, setPhase(ctx(t), e.R, pod, corev1.PodRunning))
	return s
}

// setPhase writes the pod's phase, as the kubelet does.
func setPhase(ctx context.Context, r *testcni.Rig, pod testcni.Pod, phase corev1.PodPhase) error {
	p, err := r.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s: %w", pod.Ref(), err)
	}
	p.Status.Phase = phase
	if _, err := r.Kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set phase of pod %s to %s: %w", pod.Ref(), phase, err)
	}
	return nil
}

// createPodOnNAD creates a pod object asking for nad on lhnet1; the API
// server makes it Pending.
func createPodOnNAD(ctx context.Context, r *testcni.Rig, pod testcni.Pod, node, nad string) error {
	ns, name, _ := strings.Cut(nad, "/")
	req, _ := json.Marshal([]map[string]string{{"namespace": ns, "name": name, "interface": "lhnet1"}})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name,
			Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": string(req)}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/longhorn-instance-manager"}}},
	}
	if _, err := r.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Ref(), err)
	}
	return nil
}

// setNetworkStatus writes the pod's network-status as Multus does: the
// default network, then the NAD's interface with the address ADD returned.
func setNetworkStatus(t *testing.T, r *testcni.Rig, pod testcni.Pod, nad, ip string) {
	t.Helper()
	status, _ := json.Marshal([]map[string]any{
		{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.52.0.9"}, "default": true},
		{"name": nad, "interface": "lhnet1", "ips": []string{ip}},
	})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"k8s.v1.cni.cncf.io/network-status": string(status)}}})
	_, err := r.Kube.CoreV1().Pods(pod.Namespace).Patch(ctx(t), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

// waitReleased waits until the pool holds nothing of pod.
func waitReleased(ctx context.Context, n *testcni.Network, pod testcni.Pod) error {
	var held []shim.Allocation
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		allocs, err := n.Allocations(ctx)
		if err != nil {
			return false, err
		}
		held = testcni.Of(allocs, pod.Ref())
		return len(held) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s still holds %v", err, pod.Ref(), held)
	}
	return nil
}

// TestWhereaboutsOnItsOwnCRDs runs what harvester-ipam writes on each
// whereabouts version's own CRDs, through the exec path and through the
// node agent: the scenarios of TestWhereaboutsPartsBeside (allocation, DEL,
// the reclaim of a recreated sandbox, whereabouts' own pod controller and
// reconciler, harvester-ipam's reconciler), and that version's binary
// reading and releasing what harvester-ipam allocated, and the reverse.
//
// The rig installs the newest CRDs. A version whose CRDs are the same
// (v0.8.0 and later: compared here byte for byte) runs every other test on
// its own CRDs already; one whose CRDs differ (v0.7.0: its reservation
// requires a containerid, and neither kind has an ifname, which the API
// server prunes from what the agent writes) runs on a cluster of the rig's
// own with them.
func TestWhereaboutsOnItsOwnCRDs(t *testing.T) {
	t.Parallel()
	newest := rig.Tools["whereabouts-crds-"+testcni.Delegates[0]]
	for _, v := range testcni.Delegates[1:] {
		t.Run("whereabouts "+v, func(t *testing.T) {
			t.Parallel()
			same := true
			for _, f := range testcni.WhereaboutsCRDFiles {
				a, err := os.ReadFile(filepath.Join(newest, f))
				require.NoError(t, err)
				b, err := os.ReadFile(filepath.Join(rig.Tools["whereabouts-crds-"+v], f))
				require.NoError(t, err)
				same = same && bytes.Equal(a, b)
			}
			if same {
				t.Logf("whereabouts %s's CRDs are %s's, which the rig installs: every test runs on them", v, testcni.Delegates[0])
				return
			}
			c, err := rig.StartCRDCluster(ctx(t), "crds-"+strings.ReplaceAll(strings.TrimPrefix(v, "v"), ".", ""), v)
			require.NoError(t, err)
			both := []string{execPath, agentPath}
			t.Run("parts beside", func(t *testing.T) { partsBeside(t, c, []string{v}, both) })
			t.Run("its binary", func(t *testing.T) {
				for _, path := range both {
					t.Run(subtest(v, path), func(t *testing.T) {
						t.Parallel()
						testTheBinaryReadsAndReleases(t, newEnvIn(t, c, v, path))
					})
				}
			})
		})
	}
}

// testTheBinaryReadsAndReleases: whereabouts' own binary (e's version,
// alone) on a pool harvester-ipam writes (on e's path) allocates around
// harvester-ipam's entry, and its DEL of harvester-ipam's sandbox releases
// the entry and its reservation; harvester-ipam's DEL of whereabouts'
// sandbox releases whereabouts' own (v0.7.0's, without an ifname, with the
// reconciler's help).
func testTheBinaryReadsAndReleases(t *testing.T, e *env) {
	c := ctx(t)
	n := e.network(t, testcni.Network{})
	aloneConf := *n
	aloneConf.IPAM, aloneConf.Name, aloneConf.Agent = testcni.Alone, n.Name+"-wb", nil
	alone, err := e.R.AddNetwork(aloneConf)
	require.NoError(t, err)
	if e.Agent != nil {
		served, err := e.Agent.Requests(c)
		require.NoError(t, err)
		defer func() {
			got, err := e.Agent.Requests(c)
			require.NoError(t, err)
			assert.Equal(t, served["ADD served"]+1, got["ADD served"], "the agent allocated harvester-ipam's address (counts: %v)", got)
			assert.Equal(t, served["DEL served"]+1, got["DEL served"], "the agent released whereabouts' (counts: %v)", got)
		}()
	}

	hi := add(t, n, e.Pod("by-harvester-ipam"))
	entries := testcni.Of(mustAllocs(t, n), hi.Pod.Ref())
	require.Len(t, entries, 1)
	orip, err := e.R.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(e.PoolNamespace).Get(c, names.Reservation(net.ParseIP(hi.IP()), ""), metav1.GetOptions{})
	require.NoError(t, err, "the reservation of %s", hi.IP())
	assert.Equal(t, hi.Pod.Ref(), orip.Spec.PodRef)
	if e.WB == testcni.V070 {
		// What v0.7.0's CRDs keep: the entry {id, podref} (an ifname
		// written is pruned), the reservation {containerid, podref}.
		assert.Empty(t, entries[0].IfName, "v0.7.0's CRD prunes the entry's ifname")
		assert.Equal(t, hi.ContainerID, orip.Spec.ContainerID, "v0.7.0's CRD requires the reservation's containerid")
		assert.Empty(t, orip.Spec.IfName, "v0.7.0's CRD prunes the reservation's ifname")
	}

	wb := add(t, alone, e.Pod("by-whereabouts"))
	assert.NotEqual(t, hi.IP(), wb.IP(), "whereabouts %s allocates around harvester-ipam's entry", e.WB)

	// whereabouts' DEL of harvester-ipam's sandbox (a node whose NAD still
	// names the real binary, say), and harvester-ipam's of whereabouts'.
	hiByWB, wbByHI := *hi, *wb
	hiByWB.Net, wbByHI.Net = alone, n
	require.NoError(t, hiByWB.Del(c), "whereabouts %s's DEL of harvester-ipam's sandbox", e.WB)
	assert.Empty(t, testcni.Of(mustAllocs(t, n), hi.Pod.Ref()), "whereabouts %s released harvester-ipam's entry", e.WB)
	assert.Empty(t, oripsOf(t, n, hi.Pod.Ref()), "and its reservation")
	require.NoError(t, wbByHI.Del(c), "harvester-ipam's DEL of whereabouts' sandbox")
	if e.WB == testcni.V070 {
		// v0.7.0's entry has no ifname, and no checkpoint recorded its
		// address: it may be another interface's of the sandbox (v0.7.0's
		// own DEL would remove the first it finds). harvester-ipam's DEL
		// leaves it; the reconciler releases it once the pod is gone.
		require.Len(t, testcni.Of(mustAllocs(t, n), wb.Pod.Ref()), 1, "harvester-ipam's DEL leaves v0.7.0's entry without an ifname that no checkpoint recorded")
		e.reconcile(t, "--grace", "0s")
	}
	assert.Empty(t, testcni.Of(mustAllocs(t, n), wb.Pod.Ref()), "harvester-ipam released whereabouts %s's entry", e.WB)
	assert.Empty(t, oripsOf(t, n, wb.Pod.Ref()), "and its reservation")
}
