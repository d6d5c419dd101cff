package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/reconcile/audit/watch"
	"github.com/harvester/harvester-ipam/testcni"
)

// TestAuditReportsWhatBreaks runs the reconciler as the chart's Deployment
// does and, on one network named by a NAD: a Longhorn-like pod that runs
// without the storage network on its network-status (as Harvester #11639
// left it) is reported (Event, metric) within 60 s; two pods given one
// address by hand (a pool entry edited) are reported; and the healthy pods'
// lifecycle beside them (ADDs, a DEL, a pod deleted, a new one) reports
// nothing, ever. Each scrape of the reconciler's /metrics, through the
// chart's PrometheusRule in Prometheus' rule engine, fires the alerts of
// what is open and no other. One whereabouts version, the exec path: the
// audit reads what any path writes.
func TestAuditReportsWhatBreaks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testcni.V093)
	c := ctx(t)
	n := e.network(t, testcni.Network{})
	const nadName = "storagenetwork"
	network := e.PodNamespace + "/" + nadName
	nad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": nadName, "namespace": e.PodNamespace},
		"spec":     map[string]any{"config": n.NADConfig()},
	}}
	_, err := rig.Dynamic.Resource(testcni.NADResource).Namespace(e.PodNamespace).Create(c, nad, metav1.CreateOptions{})
	require.NoError(t, err)

	metrics, stderr := startAuditingReconciler(t, e)
	start := time.Now()
	// What the reconciler exports at each point, for the chart's alerts.
	scrapes := []alertTest{{name: "nothing open yet", series: auditSeries(t, metrics())}}

	// Healthy pods: each ADD, then its pod Running with the address on its
	// network-status, as Multus writes it.
	a, b := e.Pod("instance-manager-a"), e.Pod("instance-manager-b")
	sa, sb := add(t, n, a), add(t, n, b)
	auditPod(t, a, network, sa.IP())
	auditPod(t, b, network, sb.IP())
	// #11639: a pod whose sandbox never got the storage network.
	missing := e.Pod("instance-manager-m")
	auditPod(t, missing, network, "")

	ev := waitEvent(t, e, missing.Name, watch.Reason(audit.MissingAddress), 60*time.Second-time.Since(start))
	t.Logf("after %s: %s", time.Since(start).Round(time.Second), ev.Message)
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Contains(t, ev.Message, network)
	// An instance manager (by its name) is never to be deleted: its node
	// into maintenance instead (audit's TestAdviceIsSafeForEachKindOfPod).
	assert.Contains(t, ev.Message, "is a Longhorn instance manager")
	assert.Contains(t, ev.Message, "Do not delete it.")
	assert.NotContains(t, ev.Message, "delete pod "+missing.Name)
	assert.Regexp(t, `Next: kubectl (cordon \S+|-n \S+ get pod `+missing.Name+` -o wide)$`, ev.Message)
	series := fmt.Sprintf(`harvester_ipam_audit_findings{kind="%%s",network="%s"} `, network)
	require.Eventually(t, func() bool { return strings.Contains(metrics(), fmt.Sprintf(series, audit.MissingAddress)+"1\n") },
		10*time.Second, 200*time.Millisecond, "the metric says so")
	// What fails the lifecycle tests (auditQuiet) sees it, each way.
	got := strings.Join((&auditQuiet{c: e.R, metrics: metrics, log: stderr, eventsOf: map[string]bool{}}).reported(t), "\n")
	for _, want := range []string{"audit: open: MissingAddress " + network, "Event StorageNetworkAddressMissing on Pod " + missing.Ref(),
		"metric: 1 open MissingAddress finding(s) on network " + network} {
		assert.Contains(t, got, want, "auditQuiet reports it")
	}
	for _, k := range []audit.Kind{audit.SharedAddress, audit.PodPoolMismatch, audit.EntryReservationMismatch, audit.Headroom} {
		assert.Contains(t, metrics(), fmt.Sprintf(series, k)+"0\n", "healthy pods, past the grace: no %s", k)
	}
	scrapes = append(scrapes, alertTest{name: "a pod without its address", series: auditSeries(t, metrics())})

	// The lifecycle goes on: b's DEL and its pod deleted, a new pod d.
	require.NoError(t, sb.Del(c))
	require.NoError(t, rig.DeletePod(c, b))
	d := e.Pod("instance-manager-d")
	sd := add(t, n, d)
	auditPod(t, d, network, sd.IP())

	// Two pods, one address: the pool's entry of a's address handed to d by
	// hand, in place of d's own. The pool says d holds a's address, a's
	// network-status says a does: the audit reports both pods' pod-pool
	// mismatch (a: the pools hold nothing for the address it uses, which
	// whereabouts may hand to another pod; d: none for its own). An entry
	// of d at an address d's status does not name reads as an earlier
	// sandbox's leftover (the reconciler's to release): no SharedAddress
	// claim, which is what two Running pods' statuses on one address are
	// (audit's TestJudge, the simulation).
	edited := time.Now()
	pool, err := rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Get(c, n.PoolName(), metav1.GetOptions{})
	require.NoError(t, err)
	for off, x := range pool.Spec.Allocations {
		switch x.PodRef {
		case d.Ref():
			delete(pool.Spec.Allocations, off)
		case a.Ref():
			x.PodRef, x.ContainerID = d.Ref(), "edited-by-hand"
			pool.Spec.Allocations[off] = x
		}
	}
	_, err = rig.WB.WhereaboutsV1alpha1().IPPools(e.PoolNamespace).Update(c, pool, metav1.UpdateOptions{})
	require.NoError(t, err)
	ev = waitEvent(t, e, a.Name, watch.Reason(audit.PodPoolMismatch), 60*time.Second)
	t.Logf("after %s: %s", time.Since(edited).Round(time.Second), ev.Message)
	assert.Contains(t, ev.Message, sa.IP())
	ev = waitEvent(t, e, d.Name, watch.Reason(audit.PodPoolMismatch), 10*time.Second)
	assert.Contains(t, ev.Message, sd.IP())
	require.Eventually(t, func() bool { return strings.Contains(metrics(), fmt.Sprintf(series, audit.PodPoolMismatch)+"2\n") },
		10*time.Second, 200*time.Millisecond)
	scrapes = append(scrapes, alertTest{name: "and two pods on one address", series: auditSeries(t, metrics())})
	// The alerts fire as rancher-monitoring's Prometheus would run the
	// chart's rules on these scrapes: none on the first, the pod without
	// its address's, then the shared address's too.
	for _, s := range scrapes[1:] {
		assert.Equal(t, 1.0, findingOf(s.series, audit.MissingAddress, network), "scrape %q", s.name)
	}
	assert.Equal(t, 2.0, findingOf(scrapes[2].series, audit.PodPoolMismatch, network))
	assertAuditAlerts(t, renderRules(t), scrapes...)

	// Nothing was ever said of b, of its DEL or its deletion, nor of d
	// before the edit.
	evs, err := rig.Kube.CoreV1().Events(e.PodNamespace).List(c, metav1.ListOptions{})
	require.NoError(t, err)
	for _, ev := range evs.Items {
		if ev.Source.Component != watch.Component {
			continue
		}
		t.Logf("event on %s: %s", ev.InvolvedObject.Name, ev.Reason)
		assert.NotEqual(t, b.Name, ev.InvolvedObject.Name, "no finding on a healthy pod's lifecycle: %s", ev.Message)
		if ev.InvolvedObject.Name == d.Name {
			assert.False(t, ev.FirstTimestamp.Time.Before(edited.Truncate(time.Second)), "nothing on d before the edit: %s", ev.Message)
		}
	}
	t.Logf("reconciler's log:\n%s", stderr())
}

// startAuditingReconciler runs the reconciler in Deployment mode on e's
// pools; it returns what its /metrics says now, and its log.
func startAuditingReconciler(t *testing.T, e *env) (metrics func() string, log func() string) {
	t.Helper()
	return startWatchingReconciler(t, e.Kubeconfig, e.PoolNamespace, "--grace", "1h")
}

// startWatchingReconciler runs the reconciler in Deployment mode (loop and
// watch, --interval 1m) against the cluster of kubeconfig, its pools in
// namespace, with extra flags; it returns what its /metrics says now, and
// its log.
func startWatchingReconciler(t *testing.T, kubeconfig, namespace string, extra ...string) (metrics func() string, log func() string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	var out syncBuffer
	args := append([]string{"--kubeconfig", kubeconfig, "--namespace", namespace, "--interval", "1m", "--metrics-addr", addr}, extra...)
	// It lives as long as the test that watches with it (TestKubelet's
	// whole life, more than ctx's 5 minutes on a busy machine): killed at
	// the test's end, never by a timeout of its own.
	cmd := exec.Command(rig.ReconcilerBinary(), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	metrics = func() string {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	require.Eventually(t, func() bool { return strings.Contains(metrics(), "harvester_ipam_audit_findings{") },
		60*time.Second, 200*time.Millisecond, "the audit looked")
	return metrics, out.String
}

// auditPod creates pod Running, asking for network on lhnet1; its
// network-status has ip there, or (ip "") only the cluster network.
func auditPod(t *testing.T, pod testcni.Pod, network, ip string) {
	t.Helper()
	ns, name, _ := strings.Cut(network, "/")
	asks, _ := json.Marshal([]map[string]string{{"namespace": ns, "name": name, "interface": "lhnet1"}})
	status := []map[string]any{{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.42.0.9"}, "default": true}}
	if ip != "" {
		status = append(status, map[string]any{"name": network, "interface": "lhnet1", "ips": []string{ip}})
	}
	st, _ := json.Marshal(status)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name,
			Labels:      map[string]string{"longhorn.io/component": "instance-manager"},
			Annotations: map[string]string{audit.NetworksAnnotation: string(asks), testcni.NetworkStatusAnnotation: string(st)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/longhorn-instance-manager"}}},
	}
	c := ctx(t)
	created, err := rig.Kube.CoreV1().Pods(pod.Namespace).Create(c, p, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Status.Phase = corev1.PodRunning
	_, err = rig.Kube.CoreV1().Pods(pod.Namespace).UpdateStatus(c, created, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// waitEvent waits, at most within, for the audit's Event with reason on the
// pod, and returns it.
func waitEvent(t *testing.T, e *env, pod, reason string, within time.Duration) corev1.Event {
	t.Helper()
	var found *corev1.Event
	require.Eventually(t, func() bool {
		evs, err := rig.Kube.CoreV1().Events(e.PodNamespace).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false
		}
		for i := range evs.Items {
			if evs.Items[i].Reason == reason {
				found = &evs.Items[i]
				return true
			}
		}
		return false
	}, within, 250*time.Millisecond, "an Event %s on %s", reason, pod)
	return *found
}
