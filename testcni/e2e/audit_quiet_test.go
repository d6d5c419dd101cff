package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/reconcile/audit/watch"
	"github.com/harvester/harvester-ipam/testcni"
)

// auditQuiet is the audit watching a lifecycle test's cluster, as the
// chart's Deployment mode runs it (the reconciler's loop, its informers, its
// 30 s grace), from the test's side and in dry run: it releases nothing,
// so what the test asserts of the pools stays the chart's and whereabouts'
// doing. Issue 38: a healthy cluster through the lifecycle reports nothing,
// ever.
type auditQuiet struct {
	c       *testcni.Rig
	metrics func() string
	log     func() string
	// What was already told, so that each finding fails the step that saw
	// it, once.
	logSeen  int
	eventsOf map[string]bool
}

// watchAudit starts the audit on c's pools (in poolNS) once c has a NAD
// of whereabouts, and waits for its first look.
func watchAudit(t *testing.T, c *testcni.Rig, poolNS string) *auditQuiet {
	t.Helper()
	metrics, log := startWatchingReconciler(t, c.Kubeconfig, poolNS, "--dry-run")
	return &auditQuiet{c: c, metrics: metrics, log: log, eventsOf: map[string]bool{}}
}

var auditReasons = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range audit.Kinds {
		m[watch.Reason(k)] = true
	}
	return m
}()

// quiet fails t, naming each, for every finding the audit reported since
// the last look here.
func (a *auditQuiet) quiet(t *testing.T, step string) {
	t.Helper()
	for _, r := range a.reported(t) {
		t.Errorf("%s: the audit reported a finding on a healthy cluster: %s", step, r)
	}
}

// reported is what the audit reported since the last call: each open line
// of its log, each Event of the audit's (any namespace), and each
// harvester_ipam_audit_findings series above 0 now.
func (a *auditQuiet) reported(t *testing.T) []string {
	t.Helper()
	var out []string
	log := a.log()
	for _, line := range strings.Split(log[min(a.logSeen, len(log)):], "\n") {
		if strings.Contains(line, "audit: open:") {
			out = append(out, "log: "+line)
		}
	}
	a.logSeen = len(log)
	evs, err := a.c.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx(t), metav1.ListOptions{})
	require.NoError(t, err)
	for _, ev := range evs.Items {
		if !auditReasons[ev.Reason] || a.eventsOf[string(ev.UID)] {
			continue
		}
		a.eventsOf[string(ev.UID)] = true
		out = append(out, fmt.Sprintf("Event %s on %s %s/%s: %s", ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Namespace, ev.InvolvedObject.Name, ev.Message))
	}
	m := a.metrics()
	require.Contains(t, m, "harvester_ipam_audit_findings{", "the audit is looking (its /metrics)")
	for _, s := range auditSeries(t, m) {
		if s.labels["__name__"] == "harvester_ipam_audit_findings" && s.value > 0 {
			out = append(out, fmt.Sprintf("metric: %g open %s finding(s) on network %s", s.value, s.labels["kind"], s.labels["network"]))
		}
	}
	return out
}

// settle waits for what the last step left to be judged (the audit's grace,
// 30 s, and the look when it is due), then asserts quiet, and that the
// audit ran throughout and judged network (a NAD's namespace/name).
func (a *auditQuiet) settle(t *testing.T, step, network string) {
	t.Helper()
	time.Sleep(audit.DefaultGrace + 5*time.Second)
	a.quiet(t, step)
	assert.NotContains(t, a.log(), "the audit does not run", "the audit ran throughout")
	for _, k := range audit.Kinds {
		assert.Equal(t, 0.0, findingOf(auditSeries(t, a.metrics()), k, network), "the audit judged network %s: no %s", network, k)
	}
}
