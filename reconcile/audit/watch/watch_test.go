package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
)

// fixed is a Source whose snapshot a test changes.
type fixed struct {
	mu sync.Mutex
	s  audit.Snapshot
}

func (f *fixed) Snapshot(context.Context) (audit.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s, nil
}

func (f *fixed) set(s audit.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s = s
}

// world is one instance manager on the storage network; withStatus says
// whether its network-status has its address.
func world(withStatus bool) audit.Snapshot {
	cfg := `{"cniVersion":"0.3.1","type":"bridge","ipam":{"type":"whereabouts","range":"10.0.50.0/24"}}`
	p := shim.Pool{}
	p.Name, p.Namespace, p.Spec.Range = "10.0.50.0-24", "kube-system", "10.0.50.0/24"
	p.Spec.Allocations = map[string]shim.IPAllocation{"1": {PodRef: "longhorn-system/instance-manager-a", ContainerID: "c1", IfName: "lhnet1"}}
	o := shim.Reservation{}
	o.Name, o.Namespace, o.Spec.PodRef = "10.0.50.1", "kube-system", "longhorn-system/instance-manager-a"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "instance-manager-a", UID: "u1",
		Annotations: map[string]string{audit.NetworksAnnotation: `[{"namespace":"harvester-system","name":"storagenetwork","interface":"lhnet1"}]`}}}
	pod.Status.Phase = corev1.PodRunning
	st := []map[string]any{{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.52.0.9"}}}
	if withStatus {
		st = append(st, map[string]any{"name": "harvester-system/storagenetwork", "interface": "lhnet1", "ips": []string{"10.0.50.1"}})
	}
	b, _ := json.Marshal(st)
	pod.Annotations[reconcile.NetworkStatusAnnotation] = string(b)
	return audit.Snapshot{NADs: []reconcile.NAD{{Namespace: "harvester-system", Name: "storagenetwork", Config: cfg}},
		PoolNamespace: "kube-system", Pools: []shim.Pool{p}, Reservations: []shim.Reservation{o}, Pods: []*corev1.Pod{pod}, Nodes: 1}
}

// TestRunReportsAMissingAddressWithinTheGrace: the watch re-judges on a
// change and when a finding is due, so a pod that comes up without its
// storage network has its Event and metric within the grace and a moment,
// and a healthy world has neither.
func TestRunReportsAMissingAddressWithinTheGrace(t *testing.T) {
	grace := 300 * time.Millisecond
	src := &fixed{s: world(true)}
	kube := fake.NewClientset()
	m := NewCollector()
	var log bytes.Buffer
	var logMu sync.Mutex
	a := &Auditor{Source: src, Tracker: audit.NewTracker(map[audit.Kind]time.Duration{audit.MissingAddress: grace}),
		Kube: kube, Metrics: m, Log: &lockedWriter{w: &log, mu: &logMu}}
	changed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { a.Run(ctx, changed, time.Hour, 10*time.Millisecond); close(done) }()

	events := func() []corev1.Event {
		l, err := kube.CoreV1().Events("longhorn-system").List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		return l.Items
	}
	time.Sleep(3 * grace)
	assert.Empty(t, events(), "healthy: no Event")
	assert.Equal(t, 0.0, testutil.ToFloat64(gauge(t, m, "MissingAddress")), "healthy: a zero series")

	src.set(world(false))
	start := time.Now()
	changed <- struct{}{}
	require.Eventually(t, func() bool { return len(events()) == 1 }, 5*time.Second, 10*time.Millisecond)
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, grace, "not before the grace")
	assert.Less(t, took, grace+time.Second, "within the grace and a moment, with no change after the first")
	ev := events()[0]
	assert.Equal(t, "StorageNetworkAddressMissing", ev.Reason)
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Equal(t, "instance-manager-a", ev.InvolvedObject.Name)
	assert.Contains(t, ev.Message, "Next: kubectl -n longhorn-system get pod instance-manager-a -o wide", "an instance manager is never to be deleted")
	assert.Contains(t, ev.Message, "Do not delete it. Put its node into maintenance")
	assert.Equal(t, 1.0, testutil.ToFloat64(gauge(t, m, "MissingAddress")))

	src.set(world(true))
	changed <- struct{}{}
	require.Eventually(t, func() bool { return testutil.ToFloat64(gauge(t, m, "MissingAddress")) == 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Len(t, events(), 1, "one Event per opening")
	cancel()
	<-done
	logMu.Lock()
	defer logMu.Unlock()
	assert.Contains(t, log.String(), "audit: open: MissingAddress harvester-system/storagenetwork")
	assert.Contains(t, log.String(), "audit: resolved: MissingAddress")
}

// gauge is the findings series of kind on the storage network, alone in a
// registry.
func gauge(t *testing.T, m *Collector, kind string) prometheus.Collector {
	t.Helper()
	return &one{c: m, kind: kind}
}

// one is the single series of a Collector with kind and the storage network.
type one struct {
	c    *Collector
	kind string
}

func (o *one) Describe(ch chan<- *prometheus.Desc) { ch <- findingsDesc }
func (o *one) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 100)
	o.c.Collect(all)
	close(all)
	for m := range all {
		if strings.Contains(m.Desc().String(), "harvester_ipam_audit_findings") && metricHas(m, o.kind, "harvester-system/storagenetwork") {
			ch <- m
		}
	}
}

func metricHas(m prometheus.Metric, values ...string) bool {
	pb := &dto.Metric{}
	if err := m.Write(pb); err != nil {
		return false
	}
	have := map[string]bool{}
	for _, l := range pb.Label {
		have[l.GetValue()] = true
	}
	for _, v := range values {
		if !have[v] {
			return false
		}
	}
	return true
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestCollectorSeries: every kind of every judged network has a series,
// and each network Longhorn uses its free and need.
func TestCollectorSeries(t *testing.T) {
	m := NewCollector()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing before the first look")
	m.set([]audit.Open{{Finding: audit.Finding{Kind: audit.SharedAddress, Network: "a/b"}}},
		[]audit.Figures{{Network: "a/b", Free: 3, Need: 4}}, []string{"a/b", "c/d"})
	n, err = testutil.GatherAndCount(reg, "harvester_ipam_audit_findings")
	require.NoError(t, err)
	assert.Equal(t, 2*len(audit.Kinds), n)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP harvester_ipam_audit_need Addresses the network's Longhorn pods need at once: max(nodes, instance managers) + share managers + backing-image managers using it (docs/audit.md).
# TYPE harvester_ipam_audit_need gauge
harvester_ipam_audit_need{network="a/b"} 4
`), "harvester_ipam_audit_need"))
}

// TestTwice: a single run's two looks open only what both
// saw past its grace.
func TestTwice(t *testing.T) {
	src := &fixed{s: world(false)}
	a := &Auditor{Source: src, Tracker: audit.NewTracker(map[audit.Kind]time.Duration{audit.MissingAddress: 50 * time.Millisecond})}
	c, _, err := a.Twice(context.Background(), 60*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, c.Open, 1)
	assert.Equal(t, audit.MissingAddress, c.Open[0].Kind)
	var out bytes.Buffer
	WriteOpen(&out, c.Open, time.Now())
	assert.Contains(t, out.String(), "next: kubectl -n longhorn-system get pod instance-manager-a -o wide", "inspect --audit: an instance manager is never to be deleted")
	assert.Contains(t, out.String(), "Do not delete it. Put its node into maintenance")

	a.Tracker = audit.NewTracker(map[audit.Kind]time.Duration{audit.MissingAddress: time.Hour})
	c, _, err = a.Twice(context.Background(), time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, c.Open, "within its grace: not open")
}

// A pod update that changes nothing the audit reads (its trimmed copy the
// same but for the resourceVersion) does not wake the audit; one that
// changes what it reads does.
func TestAPodUpdateWakesTheAuditOnlyForWhatItReads(t *testing.T) {
	base := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "im-a", ResourceVersion: "1",
				Labels:      map[string]string{"longhorn.io/component": "instance-manager", "touch": "1"},
				Annotations: map[string]string{audit.NetworksAnnotation: "harvester-system/storagenetwork", reconcile.NetworkStatusAnnotation: `[]`}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	now := metav1.Now()
	for _, tt := range []struct {
		name   string
		change func(p *corev1.Pod)
		wakes  bool
	}{
		{"a label the audit does not read", func(p *corev1.Pod) { p.Labels["touch"] = "2" }, false},
		{"a condition", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, false},
		{"the network-status", func(p *corev1.Pod) { p.Annotations[reconcile.NetworkStatusAnnotation] = `[{"name":"x"}]` }, true},
		{"the networks asked for", func(p *corev1.Pod) { p.Annotations[audit.NetworksAnnotation] = "" }, true},
		{"the phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, true},
		{"being deleted", func(p *corev1.Pod) { p.DeletionTimestamp = &now }, true},
		{"Longhorn's component", func(p *corev1.Pod) { p.Labels["longhorn.io/component"] = "share-manager" }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			old, cur := base(), base()
			tt.change(cur)
			cur.ResourceVersion = "2"
			assert.Equal(t, !tt.wakes, unchangedForAudit(audit.TrimPod(old), audit.TrimPod(cur)))
		})
	}
	assert.False(t, unchangedForAudit(&shim.Pool{}, &shim.Pool{}), "only pods are told apart")
}

// The findings gauge counts every open finding, not those that opened at
// this look: a finding open for many looks keeps its alert firing until it
// resolves.
func TestTheFindingsGaugeCountsEveryOpenFinding(t *testing.T) {
	m := NewCollector()
	src := &fixed{s: world(false)}
	a := &Auditor{Source: src, Tracker: audit.NewTracker(map[audit.Kind]time.Duration{audit.MissingAddress: 0}), Metrics: m}
	for i, want := range []float64{0, 1, 1, 1} {
		c, _, err := a.Look(context.Background())
		require.NoError(t, err)
		assert.Equal(t, want, testutil.ToFloat64(gauge(t, m, "MissingAddress")), "look %d (%d opened at it)", i, len(c.Opened))
	}
	src.set(world(true))
	_, _, err := a.Look(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 0.0, testutil.ToFloat64(gauge(t, m, "MissingAddress")), "resolved")
}

// The audit's next commands name the release's own DaemonSet (the chart's
// --daemonset), in the reconciler's namespace: a release named other than
// harvester-ipam, or installed as the add-on, gets commands that run.
func TestNextCommandsNameTheReleasesDaemonSet(t *testing.T) {
	for _, tt := range []struct {
		ns        string
		nsErr     error
		daemonSet string
		want      string
	}{
		{"harvester-system", nil, "prod-harvester-ipam", "kubectl -n harvester-system exec ds/prod-harvester-ipam -c diagnostics -- harvester-ipam-reconciler"},
		{"kube-system", nil, "", "kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler"},
		{"", os.ErrNotExist, "", audit.DefaultDiagnose},
	} {
		if got := diagnose(tt.ns, tt.nsErr, tt.daemonSet).Diagnose; got != tt.want {
			t.Errorf("diagnose(%q, %v, %q) = %q, want %q", tt.ns, tt.nsErr, tt.daemonSet, got, tt.want)
		}
	}
}
