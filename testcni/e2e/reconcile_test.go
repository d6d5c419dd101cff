package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

const grace = 3 * time.Second

// sleepPastGrace waits until an entry first sighted by the pass just run is
// due: the reconciler records a sighting rounded up to the next second, so
// the wait is the grace, that second, and a margin for a loaded machine.
func sleepPastGrace() {
	time.Sleep(grace + 1500*time.Millisecond)
}

// reconcile runs one pass of the reconciler on the tenant's pools and
// requires it to succeed.
func (e *env) reconcile(t *testing.T, args ...string) string {
	t.Helper()
	res, err := e.Reconciler(ctx(t), append([]string{"--grace", grace.String()}, args...)...)
	require.NoError(t, err)
	require.Zero(t, res.Exit, "reconciler failed:\n%s%s", res.Stdout, res.Stderr)
	return res.Stdout
}

// live adds a sandbox for a pod object in the given state; its network-status
// names the address ADD gave it, unless the pod is pending.
func live(t *testing.T, n *testcni.Network, pod testcni.Pod, node string, phase corev1.PodPhase) *testcni.Sandbox {
	t.Helper()
	s := add(t, n, pod)
	st := testcni.PodState{Node: node, Phase: phase}
	if phase == corev1.PodRunning {
		st.StatusIPs = []string{s.IP()}
	}
	require.NoError(t, rig.CreatePod(ctx(t), pod, st))
	return s
}

// A node dies and is removed: its pods' DELs never run, the pod objects are
// force-deleted, the node object goes. After the grace period, and not
// before, the reconciler releases their addresses; running and pending pods
// keep theirs. No NAD exists anywhere, and the network's config has lost its
// ipam fields: the reconciler needs neither.
func TestReconcilerReleasesANodeRemovalLeak(t *testing.T) {
	onEachDelegate(t, testReconcilerReleasesANodeRemovalLeak)
}

func testReconcilerReleasesANodeRemovalLeak(t *testing.T, e *env) {
	c := ctx(t)
	n := e.network(t, testcni.Network{})
	nodeA, nodeB := e.Node("node-a"), e.Node("node-b")
	require.NoError(t, rig.CreateNode(c, nodeA))
	require.NoError(t, rig.CreateNode(c, nodeB))
	lost := []testcni.Pod{e.Pod("instance-manager-b1"), e.Pod("instance-manager-b2")}
	keeper := e.Pod("instance-manager-a1")
	pending := e.Pod("instance-manager-a2")
	var lostSandboxes []*testcni.Sandbox
	for _, p := range lost {
		lostSandboxes = append(lostSandboxes, live(t, n, p, nodeB, corev1.PodRunning))
	}
	keep := []*testcni.Sandbox{live(t, n, keeper, nodeA, corev1.PodRunning), live(t, n, pending, "", corev1.PodPending)}

	// node-b is gone: no DEL, pods force-deleted, node deleted; the NAD is gone too.
	for i, p := range lost {
		require.NoError(t, lostSandboxes[i].Kill())
		require.NoError(t, rig.DeletePod(c, p))
	}
	require.NoError(t, rig.DeleteNode(c, nodeB))
	require.NoError(t, n.ForgetIPAM())

	out := e.reconcile(t)
	t.Logf("first pass:\n%s", out)
	assert.Contains(t, out, "pod gone")
	assert.Contains(t, out, "wait")
	assert.Len(t, mustAllocs(t, n), 4, "nothing is released at first sight")
	// A grace long enough that the second pass comes within it, however
	// loaded the machine: passes take seconds when many tests run at once.
	out = e.reconcile(t, "--grace", "1h")
	assert.Len(t, mustAllocs(t, n), 4, "nor within the grace period:\n%s", out)

	sleepPastGrace()
	out = e.reconcile(t)
	t.Logf("pass after the grace period:\n%s", out)
	assert.Contains(t, out, "release")
	allocs := mustAllocs(t, n)
	t.Logf("pool:\n%s", testcni.Table(allocs))
	assert.Len(t, allocs, 2)
	verify(t, n, keep, append(lost, keeper, pending)...)

	// Another pass finds nothing more to do, and the pending pod still holds its address.
	sleepPastGrace()
	e.reconcile(t)
	verify(t, n, keep, append(lost, keeper, pending)...)
	evs, err := rig.Kube.CoreV1().Events(e.PoolNamespace).List(c, metav1.ListOptions{FieldSelector: "involvedObject.name=" + n.PoolName()})
	require.NoError(t, err)
	assert.Len(t, evs.Items, 2, "one Event per release")
}

// A leftover ORIP (no allocation holds its address for its pod) blocks the
// address for overlapping ranges; it is deleted after the grace period.
func TestReconcilerRemovesALeftoverORIP(t *testing.T) {
	onEachAllocator(t, testReconcilerRemovesALeftoverORIP)
}

func testReconcilerRemovesALeftoverORIP(t *testing.T, e *env) {
	c := ctx(t)
	n := e.network(t, testcni.Network{})
	pod := e.Pod("instance-manager-orip")
	s := live(t, n, pod, "", corev1.PodRunning)
	leftover := prefix(n) + "77"
	_, err := rig.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(e.PoolNamespace).Create(c,
		&whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: leftover},
			Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: e.Pod("long-gone").Ref(), IfName: "lhnet1"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	out := e.reconcile(t)
	assert.Contains(t, out, leftover)
	assert.Contains(t, out, "no allocation holds its address for its pod")
	assert.Len(t, mustORIPs(t, n), 2, "not at first sight")
	sleepPastGrace()
	e.reconcile(t)
	orips := mustORIPs(t, n)
	require.Len(t, orips, 1)
	assert.Equal(t, pod.Ref(), orips[0].PodRef, "the live pod's reservation stays")
	verify(t, n, []*testcni.Sandbox{s}, pod)
}

// --dry-run prints what it would release and why, and changes nothing: not
// the pools, not the reservations, not even its own bookkeeping.
func TestReconcilerDryRunChangesNothing(t *testing.T) {
	onEachAllocator(t, testReconcilerDryRunChangesNothing)
}

func testReconcilerDryRunChangesNothing(t *testing.T, e *env) {
	c := ctx(t)
	n := e.network(t, testcni.Network{})
	gone := e.Pod("instance-manager-dry")
	s := add(t, n, gone) // no pod object: gone
	require.NoError(t, s.Kill())
	e.reconcile(t) // a real pass records the first sighting
	sleepPastGrace()

	before := e.snapshot(t)
	for i := 0; i < 2; i++ {
		out := e.reconcile(t, "--dry-run")
		assert.Contains(t, out, "would release")
		assert.Contains(t, out, gone.Ref())
		assert.Contains(t, out, "pod gone")
		assert.Contains(t, out, "dry run: nothing changed")
	}
	assert.Equal(t, before, e.snapshot(t), "the dry run wrote nothing")
	assert.Len(t, testcni.Of(mustAllocs(t, n), gone.Ref()), 1)

	res, err := e.Reconciler(c, "inspect")
	require.NoError(t, err)
	require.Zero(t, res.Exit, res.Stderr)
	t.Logf("inspect:\n%s", res.Stdout)
	assert.Contains(t, res.Stdout, fmt.Sprintf("%s  %s  254", n.PoolName(), n.Range))
	assert.Contains(t, res.Stdout, "stale allocations")
}

// snapshot is every pool and reservation of the tenant with its resourceVersion.
func (e *env) snapshot(t *testing.T) map[string]string {
	c := ctx(t)
	out := map[string]string{}
	pools, err := rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).List(c, metav1.ListOptions{})
	require.NoError(t, err)
	for _, p := range pools.Items {
		out["pool/"+p.Name] = p.ResourceVersion
	}
	orips, err := rig.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(e.PoolNamespace).List(c, metav1.ListOptions{})
	require.NoError(t, err)
	for _, o := range orips.Items {
		out["orip/"+o.Name] = o.ResourceVersion
	}
	return out
}

// In loop mode the reconciler serves its metrics; a pass that cannot read the
// API server makes a one-shot run exit non-zero, so the CronJob shows it.
func TestReconcilerMetricsAndFailure(t *testing.T) {
	c := ctx(t)
	port := 19420
	cmd := exec.CommandContext(c, rig.ReconcilerBinary(),
		"--kubeconfig", rig.Kubeconfig, "--interval", "200ms", "--grace", "1h", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return strings.Contains(body, "harvester_ipam_reconciler_passes_total") && !strings.Contains(body, "harvester_ipam_reconciler_passes_total 0\n")
	}, 20*time.Second, 100*time.Millisecond)
	for _, series := range []string{"harvester_ipam_reconciler_candidates ", `harvester_ipam_reconciler_releases_total{kind="allocation"} `,
		"harvester_ipam_reconciler_errors_total 0", "harvester_ipam_reconciler_last_run_timestamp_seconds ", "harvester_ipam_reconciler_api_requests "} {
		assert.Contains(t, body, series)
	}

	rig.StopAPIServer()
	res, err := rig.Reconciler(c, "--grace", "1h")
	require.NoError(t, rig.StartAPIServer(c))
	require.NoError(t, err)
	assert.Equal(t, 1, res.Exit, "a pass that could not finish exits non-zero")
	assert.Contains(t, res.Stderr, "pass: list pools in kube-system")
	assert.Contains(t, res.Stderr, "connection refused")
}
