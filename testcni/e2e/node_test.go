package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// The real node: containerd runs the sandboxes and calls Multus, Multus calls
// the storage network's IPAM from its NAD. No kubelet runs: the tests play
// its part through the CRI, with the pod's metadata as the kubelet sends it.

// nodeDelegates are the whereabouts versions the real-node tests run on:
// Harvester's current chart and its 2024 releases.
var nodeDelegates = []string{testcni.V093, testcni.V070}

// nodeEnv is one test on one whereabouts version, on a node of its own.
type nodeEnv struct {
	*env
	node *testcni.Node
}

// TestNode runs the real-node scenarios, each once per node delegate on a
// node (containerd) of its own, side by side with each other and apart from
// the other tests: as a test that runs in turn, it is done before the
// parallel tests start. Dozens of Multus processes on two cores make
// Multus' own 250 ms reads of the pod time out, in these scenarios and in
// the cnitool ones beside them, so the two do not share the CPU.
//
// Not through the node agent: a node's plugin runs in the node's mount
// namespace (its /var/lib/cni, where the checkpoints are, and its /run),
// and reaches the API server through the node's gate; an agent of the rig's
// sees neither, and declines a checkpoint directory that is not its own.
// The agent on a node is TestKubelet's: the chart's DaemonSet on a real
// kubelet, serving the pods' ADDs.
func TestNode(t *testing.T) {
	for _, sc := range []struct {
		name string
		opt  testcni.NodeOptions
		f    func(t *testing.T, e *nodeEnv)
	}{
		{"ThirtyPodsAtOnce", testcni.NodeOptions{RetryDeleteOnError: true}, nodeThirtyPodsAtOnce},
		{"RebootAPIUnreachableRetriedStopReleases", testcni.NodeOptions{}, nodeRebootAPIUnreachableRetriedStopReleases},
		{"RebootAPIUnreachableWhereaboutsAloneSwallows", testcni.NodeOptions{}, nodeRebootAPIUnreachableWhereaboutsAloneSwallows},
		{"RebootSwallowedDelStillReleases", testcni.NodeOptions{SwallowDel: true, RetryDeleteOnError: true}, nodeRebootSwallowedDelStillReleases},
		{"RebootLosingRootNoDelComes", testcni.NodeOptions{}, nodeRebootLosingRootNoDelComes},
		{"NetworkStatusReadByReconciler", testcni.NodeOptions{}, nodeNetworkStatusReadByReconciler},
		{"NADDeletedWhilePodsRun", testcni.NodeOptions{RetryDeleteOnError: true}, nodeNADDeletedWhilePodsRun},
		{"ContainerdRestartKeepsSandboxes", testcni.NodeOptions{}, nodeContainerdRestartKeepsSandboxes},
		{"StopRemoveReleases", testcni.NodeOptions{}, nodeStopRemoveReleases},
		{"PodDeletedWhileAPIUnreachable", testcni.NodeOptions{}, nodePodDeletedWhileAPIUnreachable(false)},
		{"PodDeletedWhileAPIUnreachableRetryDeleteOnError", testcni.NodeOptions{RetryDeleteOnError: true}, nodePodDeletedWhileAPIUnreachable(true)},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, v := range nodeDelegates {
				t.Run("whereabouts "+v, func(t *testing.T) {
					t.Parallel()
					sc.f(t, newNodeEnv(t, v, sc.opt))
				})
			}
		})
	}
}

// nodeSlots bounds the nodes that run at once: each is containerd, its
// shims and a Multus process per CNI call, and two cores running twenty of
// them make the API server's answers (and Multus' 2.5 s reads of the pod)
// time out, which tests nothing but the machine.
var nodeSlots = make(chan struct{}, 6)

func newNodeEnv(t *testing.T, wb string, opt testcni.NodeOptions) *nodeEnv {
	t.Helper()
	nodeSlots <- struct{}{}
	t.Cleanup(func() { <-nodeSlots }) // after the node's own cleanup: cleanups run last-in first-out
	e := newEnv(t, wb)
	opt.Whereabouts = wb
	start := time.Now()
	nd, err := rig.StartNode(ctx(t), e.Tenant, opt)
	require.NoError(t, err, "start a node with containerd")
	t.Logf("node %s: containerd ready in %s", nd.Name, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd's log (%s), last lines:\n%s", nd.Log, nd.LogTail(30))
			t.Logf("Multus' log (%s), last lines:\n%s", nd.MultusLog, nd.MultusLogTail(30))
		}
		nd.Close()
	})
	return &nodeEnv{env: e, node: nd}
}

// storageNet creates a storage-network NAD whose IPAM is ipam (harvester-ipam
// or whereabouts) on a /24 of its own; pods join it on lhnet1.
func (e *nodeEnv) storageNet(t *testing.T, ipam string) *testcni.MultusNetwork {
	t.Helper()
	nadCRD.Do(func() { nadCRD.err = rig.InstallNADCRD(ctx(t)) })
	require.NoError(t, nadCRD.err, "the NetworkAttachmentDefinition CRD")
	i := subnet.Add(1)
	m, err := e.node.StorageNetwork(ctx(t), testcni.Network{
		Range: fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250), IPAM: ipam,
	}, "harvester-system", fmt.Sprintf("storagenetwork-%d", i), "lhnet1")
	require.NoError(t, err)
	return m
}

// pods creates n Longhorn pod objects on the node, asking for m.
func (e *nodeEnv) pods(t *testing.T, m *testcni.MultusNetwork, prefix string, n int) []testcni.Pod {
	t.Helper()
	var out []testcni.Pod
	for i := 0; i < n; i++ {
		p, err := e.node.CreatePod(ctx(t), m, fmt.Sprintf("%s-%d", prefix, i))
		require.NoError(t, err)
		out = append(out, p)
	}
	return out
}

// run syncs each pod as the kubelet's pod workers do, side by side: a new
// sandbox for each pod without a ready one, retried when its start fails
// (Multus gives up reading the pod after 2.5 s, which a loaded machine can
// take); each pod is marked running.
func (e *nodeEnv) run(t *testing.T, pods []testcni.Pod) []*testcni.PodSandbox {
	t.Helper()
	out := make([]*testcni.PodSandbox, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.node.SyncPod(ctx(t), p, 4*time.Minute)
			out[i], errs[i] = s.Sandbox, err
			mu.Lock()
			failures = append(failures, s.Failures...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	if len(failures) > 0 {
		t.Logf("the kubelet retried %d failed sandbox start(s); the first: %v", len(failures), failures[0])
	}
	return out
}

// stop stops sandboxes side by side, as the kubelet's pod workers do, and
// returns each stop's error.
func (e *nodeEnv) stop(t *testing.T, ids ...string) []error {
	t.Helper()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.node.StopPodSandbox(ctx(t), id)
		}()
	}
	wg.Wait()
	return errs
}

// stopRemove kills sandboxes as the kubelet does for deleted pods, side by
// side, and requires that each is gone in the end; a DEL that asked to be
// retried (the API server slow to answer on a loaded machine) is logged.
func (e *nodeEnv) stopRemove(t *testing.T, ids ...string) {
	t.Helper()
	errs := make([]error, len(ids))
	failures := make([][]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failures[i], errs[i] = e.node.KillPodSandbox(ctx(t), id, 2*time.Minute)
		}()
	}
	wg.Wait()
	for i, f := range failures {
		if len(f) > 0 {
			t.Logf("the kubelet retried killing sandbox %.12s %d time(s); the first failure: %v", ids[i], len(f), f[0])
		}
	}
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// storageIP is the pod's lhnet1 address, as Multus wrote it in the pod's
// network-status.
func storageIP(t *testing.T, m *testcni.MultusNetwork, pod testcni.Pod) string {
	t.Helper()
	st, err := m.NetworkStatus(ctx(t), pod)
	require.NoError(t, err)
	for _, s := range st {
		if s.Interface == m.StorageIfName() && s.Name == m.NADNamespace+"/"+m.NADName {
			require.Len(t, s.IPs, 1, "network-status of %s: %+v", pod.Ref(), st)
			return s.IPs[0]
		}
	}
	t.Fatalf("Multus wrote no %s entry for %s/%s on %s: %+v", m.StorageIfName(), m.NADNamespace, m.NADName, pod.Ref(), st)
	return ""
}

// holdsSandbox asserts that the pod holds one allocation in m's pool, of
// sandbox sb, at the address on its network-status, with one reservation.
func holdsSandbox(t *testing.T, m *testcni.MultusNetwork, sb *testcni.PodSandbox) string {
	t.Helper()
	ip := storageIP(t, m, sb.Pod)
	allocs := mustAllocs(t, m.Network)
	held := testcni.Of(allocs, sb.Pod.Ref())
	require.Len(t, held, 1, "one allocation for %s; pool %s:\n%s", sb.Pod.Ref(), m.PoolName(), testcni.Table(allocs))
	assert.Equal(t, sb.ID, held[0].ContainerID, "the allocation is the sandbox's")
	if m.Whereabouts != testcni.V070 {
		assert.Equal(t, "lhnet1", held[0].IfName)
	}
	assert.Equal(t, ip, held[0].IP.String(), "the pool holds the address on the pod's network-status")
	orips := oripsOf(t, m.Network, sb.Pod.Ref())
	require.Len(t, orips, 1, "one reservation for %s", sb.Pod.Ref())
	assert.Equal(t, ip, orips[0].Name)
	return ip
}

func ids(sbs []*testcni.PodSandbox) []string {
	var out []string
	for _, s := range sbs {
		out = append(out, s.ID)
	}
	return out
}

// states are the node's sandboxes by ID, as containerd lists them.
func (e *nodeEnv) states(t *testing.T) map[string]runtimeapi.PodSandboxState {
	t.Helper()
	l, err := e.node.ListPodSandbox(ctx(t))
	require.NoError(t, err)
	out := map[string]runtimeapi.PodSandboxState{}
	for _, s := range l {
		out[s.Id] = s.State
	}
	return out
}

// A sandbox stopped and removed through the CRI: containerd's DEL goes
// through Multus to the storage network's IPAM, and the address is released.
func nodeStopRemoveReleases(t *testing.T, e *nodeEnv) {
	for _, ipam := range []string{"harvester-ipam", "whereabouts"} {
		m := e.storageNet(t, ipam)
		pods := e.pods(t, m, "instance-manager-"+strings.TrimPrefix(ipam, "harvester-"), 2)
		sbs := e.run(t, pods)
		for _, sb := range sbs {
			ip := holdsSandbox(t, m, sb)
			t.Logf("%s: %s sandbox %s has %s on lhnet1, %s on eth0", ipam, sb.Pod.Ref(), sb.ID[:12], ip, sb.IP)
		}
		e.stopRemove(t, sbs[0].ID)
		released(t, m, pods[0])
		holdsSandbox(t, m, sbs[1])
		e.stopRemove(t, sbs[1].ID)
		released(t, m, pods[1])
		assert.Empty(t, e.states(t), "no sandbox left")
	}
}

// notReady are the node's NOTREADY sandboxes, as the kubelet finds them
// after a reboot; it requires that there are want of them and no READY one.
func (e *nodeEnv) notReady(t *testing.T, want int) []string {
	t.Helper()
	var out []string
	for id, st := range e.states(t) {
		require.Equal(t, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, st, "sandbox %s after the reboot", id[:12])
		out = append(out, id)
	}
	require.Len(t, out, want, "containerd lists the sandboxes of before the reboot")
	return out
}

// retryStop stops a sandbox until containerd says it stopped, as the
// kubelet's pod worker retries a failed kill; it returns the last error.
func (e *nodeEnv) retryStop(t *testing.T, id string) error {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx(t), 500*time.Millisecond, time.Minute, true, func(c context.Context) (bool, error) {
		last = e.node.StopPodSandbox(c, id)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w; last: %v", err, last)
	}
	return nil
}

// multusLog is all Multus logged on the node.
func (e *nodeEnv) multusLog(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(e.node.MultusLog)
	require.NoError(t, err)
	return string(b)
}

// pool logs the pool for people reading the test's output.
func logPool(t *testing.T, what string, m *testcni.MultusNetwork) []shim.Allocation {
	t.Helper()
	allocs := mustAllocs(t, m.Network)
	t.Logf("%s: pool %s (%s):\n%s", what, m.PoolName(), m.IPAM, testcni.Table(allocs))
	return allocs
}

// live requires each pod to hold one allocation, its live sandbox's, at
// the address on its network-status; no address twice; one reservation
// each, and nothing else in the pool.
func liveOnly(t *testing.T, m *testcni.MultusNetwork, live []*testcni.PodSandbox) {
	t.Helper()
	seen := map[string]string{}
	for _, sb := range live {
		ip := holdsSandbox(t, m, sb)
		if other, dup := seen[ip]; dup {
			t.Errorf("%s given to %s and %s", ip, other, sb.Pod.Ref())
		}
		seen[ip] = sb.Pod.Ref()
	}
	allocs := mustAllocs(t, m.Network)
	assert.Len(t, allocs, len(live), "one allocation per live sandbox, none else:\n%s", testcni.Table(allocs))
	assert.Len(t, mustORIPs(t, m.Network), len(live), "one reservation per live sandbox")
}

// A reboot while the node cannot reach the API server (the control plane
// comes back later than the node, or the node's network does): the kubelet
// stops the sandboxes containerd lists NOTREADY, and each stop's DEL fails,
// because harvester-ipam cannot read the pool and says so, so the sandbox
// stays for the kubelet to retry; once the API server answers, the retried
// stop releases. Three reboots in a row; in the second, the kubelet retries
// once more while the API server is still unreachable: Multus consumed its
// cache of the sandbox at the failed DEL and, unable to read the pod either,
// reports success without calling any plugin, so that stop releases
// nothing; the pod's next sandbox does, at its ADD. At the end each pod
// holds one address, its live sandbox's; none was freed twice.
//
// Whereabouts alone is not run here: with the API server unreachable, its
// DEL waits a minute for its lease and then reports success with the pool
// untouched, which is the swallowed DEL of the next test, faster.
func nodeRebootAPIUnreachableRetriedStopReleases(t *testing.T, e *nodeEnv) {
	m := e.storageNet(t, "harvester-ipam")
	pods := e.pods(t, m, "instance-manager", 2)
	live := e.run(t, pods)
	liveOnly(t, m, live)
	for round := 1; round <= 3; round++ {
		began := time.Now()
		e.node.Gate.Cut()
		require.NoError(t, e.node.Reboot(ctx(t), false), "reboot %d", round)
		old := e.notReady(t, len(pods))
		t.Logf("round %d: rebooted in %s", round, time.Since(began).Round(time.Millisecond))
		for _, err := range e.stop(t, old...) {
			require.Error(t, err, "round %d: a stop whose DEL cannot reach the pool fails", round)
			assert.Contains(t, err.Error(), "failed to destroy network for sandbox")
			assert.Contains(t, err.Error(), "read pool "+e.PoolNamespace+"/"+m.PoolName())
			assert.Contains(t, err.Error(), "connection refused")
		}
		logPool(t, fmt.Sprintf("round %d, after the failed stops (%s)", round, time.Since(began).Round(time.Millisecond)), m)
		assert.Len(t, mustAllocs(t, m.Network), len(pods), "nothing released, nothing lost")
		if round == 2 {
			for _, err := range e.stop(t, old...) {
				require.NoError(t, err, "Multus gives up: its cache was consumed, the pod cannot be read")
			}
			assert.Contains(t, e.multusLog(t), "cannot properly delete")
			assert.Len(t, mustAllocs(t, m.Network), len(pods), "that stop released nothing")
		}
		require.NoError(t, e.node.Gate.Open())
		for _, id := range old {
			require.NoError(t, e.retryStop(t, id), "round %d: the retried stop succeeds once the API server answers", round)
		}
		if round != 2 {
			allocs := logPool(t, fmt.Sprintf("round %d, after the retried stops", round), m)
			log := e.multusLog(t)
			for _, a := range allocs {
				// Multus reads the pod for 2.5 s at most (250 ms a try), which a
				// loaded machine can exceed; with its cache consumed by the failed
				// DEL, it then reports success without calling any plugin, as in
				// round 2. The pod's next ADD releases what stays.
				require.Contains(t, log, a.ContainerID+": no such file or directory, cannot properly delete",
					"round %d: the retried stop released %s, unless Multus gave up on it", round, a)
				t.Logf("round %d: Multus could not read the pod in time at the retried stop and gave up; the next ADD releases %s", round, a)
			}
		}
		e.stopRemove(t, old...)
		live = e.run(t, pods)
		logPool(t, fmt.Sprintf("round %d, new sandboxes (round took %s)", round, time.Since(began).Round(time.Millisecond)), m)
		liveOnly(t, m, live)
	}
}

// The same reboot with whereabouts alone: its DEL cannot reach the pool
// either, waits for its lease until its one-minute limit, logs the error and
// reports success, so the stop succeeds, the kubelet does not retry it, and
// the address stays in the pool with no sandbox: the swallowed DEL that the
// next test has a wrapper stand in for, to be quick. Here the API server
// comes back before the kubelet removes the old sandbox, and containerd's
// DEL at that removal (Multus, its cache consumed, reads the pod and the NAD
// again) releases it; with the pod deleted meanwhile, or containerd's root
// lost, no such DEL comes.
func nodeRebootAPIUnreachableWhereaboutsAloneSwallows(t *testing.T, e *nodeEnv) {
	m := e.storageNet(t, "whereabouts")
	pod := e.pod(t, m, "instance-manager")
	live := e.run(t, []testcni.Pod{pod})
	e.node.Gate.Cut()
	require.NoError(t, e.node.Reboot(ctx(t), false))
	old := e.notReady(t, 1)
	began := time.Now()
	require.NoError(t, e.node.StopPodSandbox(ctx(t), old[0]), "whereabouts' DEL reports success")
	t.Logf("the stop took %s: whereabouts waited for its lease", time.Since(began).Round(time.Millisecond))
	allocs := logPool(t, "after the stop, the API server unreachable", m)
	require.Len(t, allocs, 1, "the address stays")
	assert.Equal(t, live[0].ID, allocs[0].ContainerID)
	assert.Len(t, oripsOf(t, m.Network, pod.Ref()), 1, "and its reservation")

	require.NoError(t, e.node.Gate.Open())
	live = e.run(t, []testcni.Pod{pod}) // a new sandbox, then the old one removed
	allocs = logPool(t, "the pod's next sandbox, the old one removed", m)
	if e.WB == testcni.V070 && len(allocs) == 2 && strings.Contains(e.multusLog(t), old[0]+": no such file or directory, cannot properly delete") {
		// On a loaded machine Multus may not read the pod in 2.5 s at these
		// later DELs either; then it calls no plugin, and v0.7.0 keeps the
		// address of before: the leak, for good.
		t.Logf("Multus gave up on the later DELs of %s: whereabouts v0.7.0 alone leaked %s", old[0][:12], allocs)
		assert.Contains(t, []string{allocs[0].ContainerID, allocs[1].ContainerID}, old[0])
		return
	}
	liveOnly(t, m, live)
}

// A DEL whose pool write whereabouts swallows (the node's `whereabouts`
// returns success on DEL and leaves the pool, see NodeOptions.SwallowDel):
// after three reboots, harvester-ipam's pods hold one address each, because
// its DEL releases the attachment's entry itself, whereabouts' DEL not
// being called at all. Beside
// it, whereabouts alone: v0.7.0 leaks one address per pod per reboot, v0.9.3
// hands the pod's next sandbox the address it held.
func nodeRebootSwallowedDelStillReleases(t *testing.T, e *nodeEnv) {
	const pods, reboots = 2, 3
	shimmed, alone := e.storageNet(t, "harvester-ipam"), e.storageNet(t, "whereabouts")
	sp, ap := e.pods(t, shimmed, "instance-manager", pods), e.pods(t, alone, "backing-image-manager", pods)
	live := e.run(t, append(append([]testcni.Pod{}, sp...), ap...))
	for round := 1; round <= reboots; round++ {
		require.NoError(t, e.node.Reboot(ctx(t), false), "reboot %d", round)
		old := e.notReady(t, 2*pods)
		for i, err := range e.stop(t, old...) {
			if err != nil {
				// harvester-ipam's DEL asked for a retry (the API server slow
				// to answer on a loaded machine): the kubelet retries, and
				// Multus, keeping its cache as the README has it configured,
				// calls the plugin again (without that, a retry whose read
				// of the pod also timed out would call nothing).
				t.Logf("round %d: the stop of %.12s is retried: %v", round, old[i], err)
				require.NoError(t, e.retryStop(t, old[i]), "round %d: the retried stop succeeds", round)
			}
		}
		assert.Empty(t, mustAllocs(t, shimmed.Network), "round %d: harvester-ipam released what it held (it never hands DEL to whereabouts)", round)
		aloneHolds(t, e, alone, ap, pods*round, fmt.Sprintf("round %d", round))
		e.stopRemove(t, old...)
		live = e.run(t, append(append([]testcni.Pod{}, sp...), ap...))
	}
	logPool(t, "harvester-ipam after three reboots", shimmed)
	liveOnly(t, shimmed, live[:pods])
	allocs := logPool(t, "whereabouts alone after three reboots", alone)
	aloneHolds(t, e, alone, ap, pods*(reboots+1), "after three reboots")
	for _, sb := range live[pods:] {
		assert.Contains(t, ipsOf(allocs, sb.Pod.Ref()), storageIP(t, alone, sb.Pod), "the live sandbox's address is held")
	}
}

// aloneHolds checks what whereabouts alone keeps of pods when its DEL is
// swallowed: from v0.8.0 on, one address per pod (a new sandbox gets the
// address its pod and ifname held); v0.7.0 gives every sandbox a new
// address and keeps every old one, so at least sandboxes entries. More on a
// loaded machine: a sandbox start that failed after whereabouts' ADD (Multus
// then timed out on the API server; the kubelet retried) leaves one more,
// its DEL swallowed too.
func aloneHolds(t *testing.T, e *nodeEnv, m *testcni.MultusNetwork, pods []testcni.Pod, sandboxes int, when string) {
	t.Helper()
	allocs := mustAllocs(t, m.Network)
	held := 0
	for _, p := range pods {
		held += len(testcni.Of(allocs, p.Ref()))
	}
	assert.Equal(t, len(allocs), held, "%s: the pool holds only the pods' entries:\n%s", when, testcni.Table(allocs))
	if e.WB != testcni.V070 {
		assert.Len(t, allocs, len(pods), "%s: whereabouts %s alone holds one address per pod:\n%s", when, e.WB, testcni.Table(allocs))
		return
	}
	assert.GreaterOrEqual(t, len(allocs), sandboxes, "%s: whereabouts v0.7.0 alone keeps every address of before:\n%s", when, testcni.Table(allocs))
	if len(allocs) > sandboxes {
		t.Logf("%s: whereabouts v0.7.0 alone holds %d, %d more than the sandboxes the test ran: starts that failed after its ADD, their DEL swallowed", when, len(allocs), len(allocs)-sandboxes)
	}
}

func ipsOf(allocs []shim.Allocation, podRef string) []string {
	var out []string
	for _, a := range testcni.Of(allocs, podRef) {
		out = append(out, a.IP.String())
	}
	return out
}

// A reboot that loses containerd's root too (the disk replaced or wiped):
// containerd knows no sandbox of before, so no DEL can come. Twice. Under
// harvester-ipam each pod holds one address, its new sandbox's ADD having
// released the old; whereabouts v0.7.0 alone leaks one address per pod per
// reboot; v0.9.3 alone hands the pod the address it held.
func nodeRebootLosingRootNoDelComes(t *testing.T, e *nodeEnv) {
	const pods, reboots = 2, 2
	shimmed, alone := e.storageNet(t, "harvester-ipam"), e.storageNet(t, "whereabouts")
	all := append(e.pods(t, shimmed, "instance-manager", pods), e.pods(t, alone, "backing-image-manager", pods)...)
	live := e.run(t, all)
	for round := 1; round <= reboots; round++ {
		require.NoError(t, e.node.Reboot(ctx(t), true), "reboot %d, losing containerd's root", round)
		assert.Empty(t, e.states(t), "containerd knows no sandbox of before")
		live = e.run(t, all)
		logPool(t, fmt.Sprintf("reboot %d", round), alone)
	}
	logPool(t, "harvester-ipam", shimmed)
	liveOnly(t, shimmed, live[:pods])
	want := pods
	if e.WB == testcni.V070 {
		want = pods * (reboots + 1)
	}
	assert.Len(t, mustAllocs(t, alone.Network), want, "whereabouts %s alone after %d reboots", e.WB, reboots)
}

// The storage network is disabled (its NAD deleted) while pods run, then
// their sandboxes are stopped and removed through the CRI. Multus takes the
// storage network's config from its cache: harvester-ipam's DEL releases.
// With Multus' cache of a sandbox lost too, Multus cannot find the NAD,
// deletes only the cluster network and reports success, so the address stays
// in the pool; once Longhorn deletes that pod, the reconciler releases it,
// and keeps what a running pod holds. Multus runs with retryDeleteOnError,
// as the README recommends: a stop whose DEL fails (the API server slow to
// answer) keeps Multus' cache for the kubelet's retry; by default Multus
// drops it at the failure, and the retry, the NAD gone, releases nothing.
func nodeNADDeletedWhilePodsRun(t *testing.T, e *nodeEnv) {
	m := e.storageNet(t, "harvester-ipam")
	pods := e.pods(t, m, "instance-manager", 3)
	cached, lost, keeper := pods[0], pods[1], pods[2]
	live := e.run(t, pods)
	require.NoError(t, m.DeleteNAD(ctx(t)))

	e.stopRemove(t, live[0].ID)
	released(t, m, cached)

	removed, err := e.node.ForgetMultusCache(live[1].ID)
	require.NoError(t, err)
	require.NotEmpty(t, removed, "Multus had cached the sandbox")
	e.stopRemove(t, live[1].ID)
	// Multus read the pod and failed to get the NAD; or, on a loaded
	// machine, could not read the pod in 2.5 s. Either way it calls no IPAM.
	log := e.multusLog(t)
	if !strings.Contains(log, "but continue to delete clusterNetwork") {
		assert.Contains(t, log, live[1].ID+": no such file or directory, cannot properly delete", "Multus gave up on the storage network")
	}
	held := testcni.Of(mustAllocs(t, m.Network), lost.Ref())
	require.Len(t, held, 1, "the stop reported success, the address stayed")
	assert.Equal(t, live[1].ID, held[0].ContainerID)

	require.NoError(t, rig.DeletePod(ctx(t), lost))
	res, err := e.Reconciler(ctx(t), "--grace", "0s")
	require.NoError(t, err)
	require.Zero(t, res.Exit, "reconciler:\n%s%s", res.Stdout, res.Stderr)
	t.Logf("reconciler:\n%s", res.Stdout)
	assert.Contains(t, res.Stdout, "pod gone")
	released(t, m, lost)
	liveOnly(t, m, live[2:])
	_ = keeper
}

// A pod is deleted while its node cannot reach the API server: the
// kubelet's stop fails (harvester-ipam's DEL cannot read the pool, and says
// the runtime retries), and when the API server answers again the pod is
// gone. By default Multus dropped its cache of the sandbox at the failed
// DEL, and, the pod gone, the retried stop calls no plugin: the address
// stays until the reconciler finds the pod gone. With Multus'
// retryDeleteOnError (which the README recommends) Multus keeps its cache
// until a DEL succeeds, and the retried stop releases at once.
func nodePodDeletedWhileAPIUnreachable(retryDeleteOnError bool) func(t *testing.T, e *nodeEnv) {
	return func(t *testing.T, e *nodeEnv) {
		m := e.storageNet(t, "harvester-ipam")
		pods := e.pods(t, m, "instance-manager", 2)
		gone := pods[0]
		live := e.run(t, pods)

		e.node.Gate.Cut()
		require.NoError(t, rig.DeletePod(ctx(t), gone), "the pod is deleted (the test reaches the API server, the node does not)")
		err := e.node.StopPodSandbox(ctx(t), live[0].ID)
		require.Error(t, err, "a stop whose DEL cannot reach the pool fails")
		assert.Contains(t, err.Error(), "connection refused")
		assert.Contains(t, err.Error(), "the runtime retries")
		assert.Len(t, testcni.Of(mustAllocs(t, m.Network), gone.Ref()), 1, "nothing released yet")

		require.NoError(t, e.node.Gate.Open())
		require.NoError(t, e.retryStop(t, live[0].ID), "the retried stop succeeds")
		cannot := live[0].ID + ": no such file or directory, cannot properly delete"
		if retryDeleteOnError {
			assert.NotContains(t, e.multusLog(t), cannot, "Multus kept its cache")
			released(t, m, gone)
		} else {
			held := testcni.Of(mustAllocs(t, m.Network), gone.Ref())
			require.Len(t, held, 1, "Multus dropped its cache at the failed DEL and, the pod gone, called no plugin")
			assert.Contains(t, e.multusLog(t), cannot)
			res, err := e.Reconciler(ctx(t), "--grace", "0s")
			require.NoError(t, err)
			require.Zero(t, res.Exit, "reconciler:\n%s%s", res.Stdout, res.Stderr)
			assert.Contains(t, res.Stdout, "pod gone")
			released(t, m, gone)
		}
		liveOnly(t, m, live[1:])
		e.stopRemove(t, ids(live)...)
		assert.Empty(t, mustAllocs(t, m.Network), "nothing left")
	}
}

// Thirty pods started at once through containerd, then all stopped and
// removed at once; twice. Every pod gets its own address, and nothing is
// left behind. The node runs Multus as the README recommends
// (retryDeleteOnError): on a loaded machine a stop can time out on the API
// server and be retried, and with Multus' default the retry finds no cache
// and, if its own read of the pod times out too, calls no IPAM at all (a
// leak the next sandbox's ADD or the reconciler releases, which
// PodDeletedWhileAPIUnreachable shows; not what this test is about).
func nodeThirtyPodsAtOnce(t *testing.T, e *nodeEnv) {
	m := e.storageNet(t, "harvester-ipam")
	pods := e.pods(t, m, "instance-manager", 30)
	for round := 1; round <= 2; round++ {
		began := time.Now()
		live := e.run(t, pods)
		started := time.Since(began)
		liveOnly(t, m, live)
		began = time.Now()
		e.stopRemove(t, ids(live)...)
		t.Logf("round %d: 30 sandboxes started in %s, stopped and removed in %s", round, started.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		allocs := mustAllocs(t, m.Network)
		assert.Empty(t, allocs, "round %d: nothing left:\n%s", round, testcni.Table(allocs))
		assert.Empty(t, mustORIPs(t, m.Network), "round %d: no reservation left", round)
		assert.Empty(t, e.states(t), "round %d: no sandbox left", round)
	}
}

// containerd restarted without a reboot (an upgrade, a crash): the shims and
// sandboxes keep running, containerd lists them READY again, and no CNI call
// is made, so the pool is not even written. A stop afterwards still releases.
func nodeContainerdRestartKeepsSandboxes(t *testing.T, e *nodeEnv) {
	m := e.storageNet(t, "harvester-ipam")
	pods := e.pods(t, m, "instance-manager", 2)
	live := e.run(t, pods)
	before := e.poolVersion(t, m)
	require.NoError(t, e.node.RestartContainerd(ctx(t)))
	states := e.states(t)
	require.Len(t, states, len(live))
	for _, sb := range live {
		assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_READY, states[sb.ID], "sandbox of %s", sb.Pod.Ref())
		st, err := e.node.PodSandboxStatus(ctx(t), sb.ID)
		require.NoError(t, err)
		assert.Equal(t, sb.IP, st.GetNetwork().GetIp(), "the same eth0 address")
	}
	assert.Equal(t, before, e.poolVersion(t, m), "the pool was not written")
	liveOnly(t, m, live)

	e.stopRemove(t, live[0].ID)
	released(t, m, pods[0])
	liveOnly(t, m, live[1:])
}

func (e *nodeEnv) poolVersion(t *testing.T, m *testcni.MultusNetwork) string {
	t.Helper()
	p, err := rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Get(ctx(t), m.PoolName(), metav1.GetOptions{})
	require.NoError(t, err)
	return p.ResourceVersion
}

// The network-status Multus writes under a real runtime (the cluster
// network's eth0 with the address containerd reports, and lhnet1) is what
// the reconciler reads: `harvester-ipam-reconciler inspect` shows each
// running pod's allocation live. After a reboot that lost containerd's root,
// whereabouts v0.7.0 alone holds two addresses for its pod: inspect names
// the old one stale (the network-status names the new one), and a pass
// releases it and keeps the new one.
func nodeNetworkStatusReadByReconciler(t *testing.T, e *nodeEnv) {
	shimmed, alone := e.storageNet(t, "harvester-ipam"), e.storageNet(t, "whereabouts")
	pods := []testcni.Pod{e.pod(t, shimmed, "instance-manager"), e.pod(t, alone, "backing-image-manager")}
	live := e.run(t, pods)
	for i, m := range []*testcni.MultusNetwork{shimmed, alone} {
		st, err := m.NetworkStatus(ctx(t), pods[i])
		require.NoError(t, err)
		require.Len(t, st, 2, "network-status of %s: %+v", pods[i].Ref(), st)
		assert.Equal(t, testcni.NetworkStatus{Name: "cluster-network", Interface: "eth0", IPs: []string{live[i].IP}, Default: true}, st[0])
		assert.Equal(t, "lhnet1", st[1].Interface)
	}
	e.inspect(t, map[*testcni.MultusNetwork][2]int{shimmed: {1, 0}, alone: {1, 0}})

	require.NoError(t, e.node.Reboot(ctx(t), true))
	live = e.run(t, pods)
	stale := 0
	if e.WB == testcni.V070 {
		stale = 1 // v0.7.0 gave the new sandbox a new address
	}
	out := e.inspect(t, map[*testcni.MultusNetwork][2]int{shimmed: {1, 0}, alone: {1 + stale, stale}})
	assert.NotContains(t, out, storageIP(t, shimmed, pods[0])+" ", "harvester-ipam's live allocation is not stale")
	assert.NotContains(t, out, storageIP(t, alone, pods[1])+" ", "the live allocation is not stale")
	if stale > 0 {
		assert.Contains(t, out, "newer sandbox holds another address")
	}

	res, err := e.Reconciler(ctx(t), "--grace", "0s")
	require.NoError(t, err)
	require.Zero(t, res.Exit, "reconciler:\n%s%s", res.Stdout, res.Stderr)
	t.Logf("reconciler:\n%s", res.Stdout)
	liveOnly(t, shimmed, live[:1])
	liveOnly(t, alone, live[1:])
}

// pod creates one pod object on the node asking for m.
func (e *nodeEnv) pod(t *testing.T, m *testcni.MultusNetwork, name string) testcni.Pod {
	t.Helper()
	p, err := e.node.CreatePod(ctx(t), m, name)
	require.NoError(t, err)
	return p
}

// inspect runs `harvester-ipam-reconciler inspect` and requires, for each
// network's pool, the allocated and stale counts given; it returns the output.
func (e *nodeEnv) inspect(t *testing.T, want map[*testcni.MultusNetwork][2]int) string {
	t.Helper()
	res, err := e.Reconciler(ctx(t), "inspect")
	require.NoError(t, err)
	require.Zero(t, res.Exit, "inspect:\n%s%s", res.Stdout, res.Stderr)
	t.Logf("inspect:\n%s", res.Stdout)
	for m, w := range want {
		var row []string
		for _, line := range strings.Split(res.Stdout, "\n") {
			// POOL RANGE SIZE ALLOCATED STALE FREE NAD
			if f := strings.Fields(line); len(f) >= 6 && f[0] == m.PoolName() && f[1] == m.Range {
				row = f
			}
		}
		require.NotNil(t, row, "inspect has a row for pool %s", m.PoolName())
		assert.Equal(t, []string{fmt.Sprint(w[0]), fmt.Sprint(w[1])}, row[3:5], "pool %s (%s): ALLOCATED, STALE", m.PoolName(), m.IPAM)
	}
	return res.Stdout
}
