package e2e

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// The metrics the reconciler exports (the names the chart's alerts and
// dashboard may use, and nothing else).
var reconcilerMetrics = map[string]bool{
	"harvester_ipam_pool_size": true, "harvester_ipam_pool_allocated": true, "harvester_ipam_pool_stale": true,
	"harvester_ipam_pool_free": true, "harvester_ipam_pool_stale_oldest_seconds": true,
	"harvester_ipam_reconciler_releases_total": true, "harvester_ipam_reconciler_errors_total": true,
	"harvester_ipam_reconciler_passes_total":                   true,
	"harvester_ipam_reconciler_last_success_timestamp_seconds": true,
	"harvester_ipam_reconciler_pass_duration_seconds":          true,
	"harvester_ipam_audit_findings":                            true, "harvester_ipam_audit_free": true, "harvester_ipam_audit_need": true,
	"harvester_ipam_audit_following": true,
}

var metricName = regexp.MustCompile(`\bharvester_ipam_[a-z_]+`)

// kubeStateMetric is a kube-state-metrics series an alert may use: what
// rancher-monitoring scrapes of the reconciler's Deployment, CronJob and
// Jobs, and of the node agent's pods (the chart's tests in testcni run
// those alerts through promtool).
var kubeStateMetric = regexp.MustCompile(`\bkube_(deployment_status_replicas_available|job_status_failed|cronjob_info|cronjob_spec_suspend|cronjob_status_last_successful_time|pod_status_ready)\b`)

// metricsIn are the harvester_ipam_* names an expression uses; any other
// name fails the test.
func metricsIn(t *testing.T, expr string) []string {
	t.Helper()
	names := metricName.FindAllString(expr, -1)
	for _, n := range names {
		assert.True(t, reconcilerMetrics[n], "%q uses %s, which the reconciler does not export", expr, n)
	}
	return names
}

var monitoringCRDs struct {
	sync.Once
	err error
}

func withHooks(t *testing.T, objs []unstructured.Unstructured) (hooks, rest []unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetAnnotations()["helm.sh/hook"] != "" {
			hooks = append(hooks, o)
		} else {
			rest = append(rest, o)
		}
	}
	return hooks, rest
}

// The stand-in's and the monitoring values: what each renders, and the real
// API server accepts all of it (server-side dry run; the ServiceMonitor and
// PrometheusRule against the Prometheus Operator's own CRDs, from its
// module). The defaults render none of it (TestChartRendersObjectsTheServerAccepts
// pins their kinds); values that make no sense are refused, saying why.
func TestChartStandInAndMonitoringValues(t *testing.T) {
	t.Parallel()
	monitoringCRDs.Do(func() { monitoringCRDs.err = rig.InstallMonitoringCRDs(ctx(t)) })
	require.NoError(t, monitoringCRDs.err, "the monitoring.coreos.com CRDs from %s", "the Prometheus Operator module")
	all := []string{"reconciler.mode=deployment", "standIn.enabled=false",
		"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true"}
	_, err := rig.Helm(ctx(t), append([]string{"lint", "--strict", chartDir}, setArgs(all)...)...)
	require.NoError(t, err, "helm lint with every new value on")

	for _, tt := range []struct {
		name  string
		set   []string
		want  map[string]int
		check func(t *testing.T, objs []unstructured.Unstructured)
	}{
		{
			name: "named in NADs only, no stand-in",
			set:  []string{"standIn.enabled=false"},
			// The installer's Role and ClusterRole stay: a revision before,
			// which stood in, reads through them while its pods stop.
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				c := typed[appsv1.DaemonSet](t, objs, "DaemonSet").Spec.Template.Spec.Containers[0]
				assert.NotContains(t, strings.Join(c.Args, " "), "--stand-in")
				assert.NotContains(t, strings.Join(c.ReadinessProbe.Exec.Command, " "), "--stand-in")
				assertStartupProbe(t, c)
			},
		},
		{
			name: "stand in for another name",
			set:  []string{"standIn.name=whereabouts-v2"},
			// The installer's Role and ClusterRole: it reads its own DaemonSet,
			// namespace and node.
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				c := typed[appsv1.DaemonSet](t, objs, "DaemonSet").Spec.Template.Spec.Containers[0]
				assert.Contains(t, c.Args, "--stand-in=whereabouts-v2")
				assert.Contains(t, c.ReadinessProbe.Exec.Command, "--stand-in=whereabouts-v2")
				assertStartupProbe(t, c)
			},
		},
		{
			name: "monitoring",
			set: []string{"reconciler.mode=deployment",
				"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "Deployment": 1,
				"Service": 1, "ServiceMonitor": 1, "PrometheusRule": 1, "ConfigMap": 1},
			check: checkMonitoring,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			manifest := render(t, "harvester-ipam", "harvester-system", tt.set...)
			objs := objects(t, manifest)
			assert.Equal(t, tt.want, kinds(objs))
			if tt.check != nil {
				tt.check(t, objs)
			}
			for _, o := range objs {
				if ns := o.GetNamespace(); ns != "" {
					require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
				}
			}
			require.NoError(t, rig.Apply(ctx(t), manifest, true), "server-side dry run of what the chart renders")
		})
	}

	// What `helm install` tells the operator.
	notes, err := rig.Helm(ctx(t), "install", "--dry-run", "--kubeconfig", rig.Kubeconfig, "-n", "harvester-system", "notes", chartDir)
	require.NoError(t, err)
	assert.Contains(t, string(notes), "It stands in for whereabouts on every node: harvester-ipam at /opt/cni/bin/whereabouts")
	assert.Contains(t, string(notes), "no NAD is edited")
	assert.Contains(t, string(notes), "`helm uninstall` gives the name back to the real binary")
	assert.Contains(t, string(notes), "kubectl -n harvester-system exec ds/notes-harvester-ipam -c install -- harvester-ipam-install --verify --stand-in=whereabouts")
	assert.Contains(t, string(notes), "kubectl -n harvester-system exec ds/notes-harvester-ipam -c diagnostics -- harvester-ipam-reconciler inspect")
	notes, err = rig.Helm(ctx(t), "install", "--dry-run", "--kubeconfig", rig.Kubeconfig, "-n", "harvester-system", "notes", chartDir, "--set", "standIn.enabled=false")
	require.NoError(t, err)
	assert.Contains(t, string(notes), `NADs that name it ("ipam": {"type": "harvester-ipam", ...}`)

	for set, msg := range map[string]string{
		"follower.enabled=true":                                           "follower.* values are no longer supported: the NAD follower only edited NADs, which Harvester's network webhook refuses",
		"follower.namespace=harvester-system":                             "harvester-ipam now stands in for whereabouts on every node (standIn.enabled, the default)",
		"standIn.name=harvester-ipam":                                     "standIn.name: Must not validate the schema",
		"standIn.name=../whereabouts":                                     "standIn.name: Does not match pattern",
		"monitoring.serviceMonitor.enabled=true":                          "monitoring.serviceMonitor and monitoring.grafanaDashboard need reconciler.enabled=true and reconciler.mode=deployment",
		"monitoring.grafanaDashboard.enabled=true":                        "monitoring.serviceMonitor and monitoring.grafanaDashboard need reconciler.enabled=true and reconciler.mode=deployment",
		"monitoring.prometheusRule.enabled=true,reconciler.enabled=false": "monitoring.prometheusRule needs reconciler.enabled=true",
		"monitoring.prometheusRule.freeBelow=0":                           "monitoring.prometheusRule.freeBelow: Must be greater than or equal to 1",
		"monitoring.serviceMonitor.interval=1min":                         "monitoring.serviceMonitor.interval: Does not match pattern",
	} {
		_, err := rig.Helm(ctx(t), "template", "x", chartDir, "--set", set)
		require.Error(t, err, "--set %s", set)
		assert.Contains(t, err.Error(), msg, "--set %s", set)
	}
}

func setArgs(set []string) []string {
	var out []string
	for _, s := range set {
		out = append(out, "--set", s)
	}
	return out
}

// checkMonitoring: the Service reaches the Deployment's metrics port, the
// ServiceMonitor scrapes /metrics through it, every alert and every panel
// uses only metrics the reconciler exports, and together they cover them.
func checkMonitoring(t *testing.T, objs []unstructured.Unstructured) {
	d := typed[appsv1.Deployment](t, objs, "Deployment")
	svc := typed[corev1.Service](t, objs, "Service")
	assert.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)), "the Service selects the reconciler's pod")
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, "metrics", svc.Spec.Ports[0].TargetPort.String())
	assert.Equal(t, "metrics", d.Spec.Template.Spec.Containers[0].Ports[0].Name)
	var svcLabels map[string]string
	for _, o := range objs {
		switch o.GetKind() {
		case "Service":
			svcLabels = o.GetLabels()
		case "ServiceMonitor":
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			assert.True(t, labels.SelectorFromSet(sel).Matches(labels.Set(svcLabels)), "the ServiceMonitor selects the Service")
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			ep := eps[0].(map[string]any)
			assert.Equal(t, "metrics", ep["port"])
			assert.Equal(t, "/metrics", ep["path"])
			assert.Equal(t, true, ep["honorLabels"], "the pools' namespace label kept")
		}
	}

	used := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
		require.Len(t, groups, 1)
		rules, _, _ := unstructured.NestedSlice(groups[0].(map[string]any), "rules")
		alerts := map[string]string{}
		for _, r := range rules {
			r := r.(map[string]any)
			expr := r["expr"].(string)
			names := metricsIn(t, expr)
			assert.True(t, len(names) > 0 || kubeStateMetric.MatchString(expr), "alert %v uses a reconciler metric, or kube-state-metrics'", r["alert"])
			assert.Equal(t, "harvester-ipam", r["labels"].(map[string]any)["component"], "alert %v carries the chart's one label", r["alert"])
			for _, n := range names {
				used[n] = true
			}
			alerts[r["alert"].(string)] = expr
			ann := r["annotations"].(map[string]any)
			assert.NotEmpty(t, ann["summary"])
			assert.NotEmpty(t, ann["description"])
		}
		assert.Equal(t, map[string]string{
			"HarvesterIPAMPoolNearlyFull":           "harvester_ipam_pool_free < 5",
			"HarvesterIPAMStaleNotReleased":         "harvester_ipam_pool_stale_oldest_seconds > 3600",
			"HarvesterIPAMReconcilerNotSucceeding":  "time() - harvester_ipam_reconciler_last_success_timestamp_seconds > 1800",
			"HarvesterIPAMPodWithoutStorageNetwork": `harvester_ipam_audit_findings{kind="MissingAddress"} > 0`,
			"HarvesterIPAMAddressShared":            `harvester_ipam_audit_findings{kind="SharedAddress"} > 0`,
			"HarvesterIPAMPodPoolMismatch":          `harvester_ipam_audit_findings{kind=~"PodPoolMismatch|EntryReservationMismatch"} > 0`,
			"HarvesterIPAMHeadroomLow":              `harvester_ipam_audit_findings{kind="Headroom"} > 0`,
			"HarvesterIPAMAuditNotJudging": `harvester_ipam_audit_following{namespace="harvester-system"} == 0 or ` +
				`(absent(harvester_ipam_audit_following{namespace="harvester-system"}) and on() harvester_ipam_reconciler_passes_total{namespace="harvester-system"})`,
			"HarvesterIPAMReconcilerAbsent": `absent(harvester_ipam_reconciler_passes_total{namespace="harvester-system"}) or ` +
				`kube_deployment_status_replicas_available{namespace="harvester-system",deployment="harvester-ipam-reconciler"} < 1`,
			"HarvesterIPAMAgentNotServing": `(kube_pod_status_ready{namespace="harvester-system",condition="true"} == 0) * on(namespace, pod) group_left(node) ` +
				`max by (namespace, pod, node) (kube_pod_info{namespace="harvester-system",created_by_kind="DaemonSet",created_by_name="harvester-ipam-agent"}) ` +
				`unless on(node) (kube_node_status_condition{condition="Ready",status="true"} == 0)`,
		}, alerts)
	}

	cm := typed[corev1.ConfigMap](t, objs, "ConfigMap")
	assert.Equal(t, "1", cm.Labels["grafana_dashboard"], "Grafana's sidecar finds it by this label")
	assert.Equal(t, "cattle-dashboards", cm.Namespace)
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal([]byte(cm.Data["harvester-ipam.json"]), &dash), "the dashboard is JSON")
	assert.Equal(t, "harvester-ipam", dash.UID)
	require.NotEmpty(t, dash.Panels)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, tg := range p.Targets {
			names := metricsIn(t, tg.Expr)
			assert.NotEmpty(t, names, "panel %q: %s", p.Title, tg.Expr)
			for _, n := range names {
				used[n] = true
			}
		}
	}
	for _, v := range dash.Templating.List {
		metricsIn(t, v.Definition)
	}
	var unused []string
	for n := range reconcilerMetrics {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	assert.Empty(t, unused, "metrics neither an alert nor a panel shows")
	assert.True(t, strings.Contains(cm.Data["harvester-ipam.json"], "rate(harvester_ipam_reconciler_releases_total"), "releases as a rate")
}

// assertStartupProbe: the installer's container is Ready as soon as the node
// is in order, not a readiness period (60 s) after its first look, which
// came before the installer had stood in: a rollout waits that per node.
func assertStartupProbe(t *testing.T, c corev1.Container) {
	t.Helper()
	require.NotNil(t, c.StartupProbe, "the installer has a startup probe")
	assert.Equal(t, c.ReadinessProbe.Exec.Command, c.StartupProbe.Exec.Command, "the startup probe checks what readiness checks")
	assert.LessOrEqual(t, c.StartupProbe.PeriodSeconds, int32(2), "the startup probe looks every few seconds")
	assert.GreaterOrEqual(t, c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold, int32(300),
		"a node whose whereabouts is being written gets minutes before the kubelet restarts the installer")
}
