package e2e

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/harvester/harvester-ipam/testcni"
)

// createNAD creates a NAD whose config is the network's, as Harvester writes
// it, in a namespace of the tenant's own.
func (e *env) createNAD(t *testing.T, n *testcni.Network, name string) {
	t.Helper()
	nadCRD.Do(func() { nadCRD.err = rig.InstallNADCRD(ctx(t)) })
	require.NoError(t, nadCRD.err, "the NetworkAttachmentDefinition CRD")
	ns := "nads-" + e.Name
	require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"config": n.NADConfig()},
	}}
	_, err := rig.Dynamic.Resource(testcni.NADResource).Namespace(ns).Create(ctx(t), obj, metav1.CreateOptions{})
	require.NoError(t, err)
}

// A storage network's range runs dry: the pod's ADD fails with a CNI error
// that says which pool, how many of its entries the reconciler would
// release and whose, and what to run; `inspect` sizes the pool with the
// NAD's excludes and `inspect --need` exits 3 naming it; the Deployment's
// metrics say the same at /metrics (and nothing anywhere else); an old
// range's pool that no NAD names is listed, and deleted with
// --delete-orphaned-pools after the grace once it holds no live entry.
func TestExhaustionIsSeenAndSaid(t *testing.T) {
	onEachAllocator(t, testExhaustionIsSeenAndSaid)
}

func testExhaustionIsSeenAndSaid(t *testing.T, e *env) {
	c := ctx(t)
	i := subnet.Add(1)
	// A /29: six usable addresses, one excluded as Harvester excludes the gateway.
	n := e.network(t, testcni.Network{Range: fmt.Sprintf("10.%d.%d.0/29", 100+i/250, i%250)})
	n.Exclude = []string{strings.TrimSuffix(n.Range, "0/29") + "1/32"}
	n2, err := rig.AddNetwork(*n) // the same network, rewritten with the exclude
	require.NoError(t, err)
	n = n2
	nadName := "storagenetwork-" + e.Name
	e.createNAD(t, n, nadName)
	nad := "nads-" + e.Name + "/" + nadName

	node := e.Node("node-a")
	require.NoError(t, rig.CreateNode(c, node))
	var live []*testcni.Sandbox
	for k := 0; k < 3; k++ {
		live = append(live, live_(t, n, e.Pod(fmt.Sprintf("im-%d", k)), node))
	}
	for k := 0; k < 2; k++ { // their pods were force-deleted: no pod object
		s := add(t, n, e.Pod(fmt.Sprintf("im-gone-%d", k)))
		require.NoError(t, s.Kill())
	}

	// Full: the sixth ADD fails, and says why.
	s, err := rig.NewSandbox(n, e.Pod("im-new"), "lhnet1")
	require.NoError(t, err)
	err = s.Add(c)
	var ce *testcni.CNIError
	require.True(t, errors.As(err, &ce), "ADD on a full range fails: %v", err)
	t.Logf("the CNI error:\n%s", ce.Stderr)
	assert.Contains(t, ce.Stderr, "Could not allocate IP in range")
	assert.Contains(t, ce.Stderr, fmt.Sprintf("pool %s/%s (%s) holds 5 entries, 2 of them stale by this count", e.PoolNamespace, n.PoolName(), n.Range))
	assert.Contains(t, ce.Stderr, fmt.Sprintf("2 entries of 2 pods gone or finished (%s, %s)", e.Pod("im-gone-0").Ref(), e.Pod("im-gone-1").Ref()))
	assert.Contains(t, ce.Stderr, "harvester-ipam-reconciler inspect")
	require.NoError(t, s.Kill())

	// inspect: the NAD's exclude counted; --need names the pool, exit 3.
	res, err := e.Reconciler(c, "inspect")
	require.NoError(t, err)
	require.Zero(t, res.Exit, res.Stderr)
	t.Logf("inspect:\n%s", res.Stdout)
	assert.Regexp(t, n.PoolName()+` +`+n.Range+` +5 +5 +2 +0 +`+nad, res.Stdout)
	res, err = e.Reconciler(c, "inspect", "--need", "2")
	require.NoError(t, err)
	assert.Equal(t, 3, res.Exit, "--need: a pool cannot fit 2 more\n%s%s", res.Stdout, res.Stderr)
	assert.Contains(t, res.Stdout, fmt.Sprintf("pool %s (%s, NAD %s): 0 free now, 2 more once the reconciler releases its stale entries: then it fits", n.PoolName(), n.Range, nad))
	res, err = e.Reconciler(c, "inspect", "--need", "3")
	require.NoError(t, err)
	assert.Equal(t, 3, res.Exit)
	assert.Contains(t, res.Stdout, "widen the range or remove excludes before adding 3")

	// An old range no NAD names, holding one stale entry.
	old := e.network(t, testcni.Network{})
	gone := add(t, old, e.Pod("im-old"))
	require.NoError(t, gone.Kill())
	res, err = e.Reconciler(c, "inspect")
	require.NoError(t, err)
	assert.Regexp(t, `pools no NAD names[^\n]*\n[^\n]*\n`+old.PoolName()+` +`+old.Range+` +1 +0 +not recorded`, res.Stdout)

	// The Deployment's metrics: the pool's gauges, at /metrics only.
	port := 19500 + int(i%400)
	cmd := exec.CommandContext(c, rig.ReconcilerBinary(), "--kubeconfig", e.Kubeconfig, "--namespace", e.PoolNamespace,
		"--interval", "1h", "--grace", "1h", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	get := func(path string) (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = get("/metrics")
		return code == http.StatusOK && strings.Contains(body, "harvester_ipam_reconciler_passes_total 1")
	}, time.Minute, 100*time.Millisecond)
	labels := fmt.Sprintf(`{namespace=%q,pool=%q}`, e.PoolNamespace, n.PoolName())
	for _, series := range []string{"harvester_ipam_pool_size" + labels + " 5", "harvester_ipam_pool_allocated" + labels + " 5",
		"harvester_ipam_pool_stale" + labels + " 2", "harvester_ipam_pool_free" + labels + " 0", "harvester_ipam_pool_stale_oldest_seconds" + labels + " 0"} {
		assert.Contains(t, body, series+"\n")
	}
	for _, path := range []string{"/", "/healthz", "/metrics/x"} {
		code, _ := get(path)
		assert.Equal(t, http.StatusNotFound, code, path)
	}

	// --delete-orphaned-pools: the old pool is recorded, then deleted after
	// the grace with its stale entry; the named pool stays.
	e.reconcile(t, "--delete-orphaned-pools")
	p, err := rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Get(c, old.PoolName(), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, p.Annotations, "harvester-ipam.harvesterhci.io/orphaned-since")
	sleepPastGrace()
	out := e.reconcile(t, "--delete-orphaned-pools")
	t.Logf("pass:\n%s", out)
	_, err = rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Get(c, old.PoolName(), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the orphaned pool is deleted: %v", err)
	_, err = rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Get(c, n.PoolName(), metav1.GetOptions{})
	assert.NoError(t, err, "the pool a NAD names stays")
	evs, err := rig.Kube.CoreV1().Events(e.PoolNamespace).List(c, metav1.ListOptions{FieldSelector: "involvedObject.name=" + old.PoolName()})
	require.NoError(t, err)
	var reasons []string
	for _, ev := range evs.Items {
		reasons = append(reasons, ev.Reason)
	}
	assert.Contains(t, reasons, "OrphanedPoolDeleted")
	verify(t, n, live, e.Pod("im-0"), e.Pod("im-1"), e.Pod("im-2"))
}

// live_ adds a sandbox for a running pod on node whose network-status names its address.
func live_(t *testing.T, n *testcni.Network, pod testcni.Pod, node string) *testcni.Sandbox {
	return live(t, n, pod, node, corev1.PodRunning)
}
