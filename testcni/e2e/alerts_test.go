package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// auditAlerts is the alert of the chart's PrometheusRule that each finding
// kind fires (issue 38: a pod without its storage network, two pods one
// address, pod and pool disagree, headroom).
var auditAlerts = map[audit.Kind]string{
	audit.MissingAddress:           "HarvesterIPAMPodWithoutStorageNetwork",
	audit.SharedAddress:            "HarvesterIPAMAddressShared",
	audit.PodPoolMismatch:          "HarvesterIPAMPodPoolMismatch",
	audit.EntryReservationMismatch: "HarvesterIPAMPodPoolMismatch",
	audit.Headroom:                 "HarvesterIPAMHeadroomLow",
}

// monitoringOn are the values that render the reconciler's Deployment, its
// ServiceMonitor and the PrometheusRule.
var monitoringOn = []string{"reconciler.mode=deployment", "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true"}

// renderedRules is what the chart renders for Prometheus: the
// PrometheusRule's groups (a Prometheus rule file, as the Prometheus
// Operator hands it to Prometheus), each audit alert's for: and its
// templates, and the labels a scrape through the ServiceMonitor adds to the
// reconciler's series (the Prometheus Operator's: job and service from the
// Service, namespace, pod, container, endpoint, instance).
type renderedRules struct {
	file   []byte
	alerts map[string]map[string]any // by name: the rule
	scrape map[string]string
}

func renderRules(t *testing.T) renderedRules {
	t.Helper()
	const ns = "harvester-system"
	rr := renderedRules{alerts: map[string]map[string]any{}, scrape: map[string]string{"namespace": ns, "instance": "10.52.0.7:9420"}}
	for _, o := range objects(t, render(t, "harvester-ipam", ns, monitoringOn...)) {
		switch o.GetKind() {
		case "PrometheusRule":
			spec, _, _ := unstructured.NestedMap(o.Object, "spec")
			b, err := yaml.Marshal(spec)
			require.NoError(t, err)
			rr.file = b
			groups, _, _ := unstructured.NestedSlice(spec, "groups")
			for _, g := range groups {
				rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
				for _, r := range rules {
					r := r.(map[string]any)
					if name, ok := r["alert"].(string); ok {
						rr.alerts[name] = r
					}
				}
			}
		case "Service":
			rr.scrape["service"], rr.scrape["job"] = o.GetName(), o.GetName()
		case "ServiceMonitor":
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			rr.scrape["endpoint"] = eps[0].(map[string]any)["port"].(string)
			assert.Equal(t, true, eps[0].(map[string]any)["honorLabels"], "the reconciler's own labels win over the scrape's")
		case "Deployment":
			d := typed[appsv1.Deployment](t, []unstructured.Unstructured{o}, "Deployment")
			rr.scrape["pod"] = d.Name + "-5d8f7c9b4-x2x7q"
			rr.scrape["container"] = d.Spec.Template.Spec.Containers[0].Name
		}
	}
	require.NotEmpty(t, rr.file, "the chart renders a PrometheusRule with %v", monitoringOn)
	for _, k := range []string{"job", "endpoint", "pod", "container"} {
		require.NotEmpty(t, rr.scrape[k], "the render names the scrape's %s", k)
	}
	for _, name := range auditAlerts {
		require.Contains(t, rr.alerts, name, "the PrometheusRule has alert %s", name)
	}
	return rr
}

// series are a scrape's samples: each series' labels (its name as
// __name__) and its value.
type sample struct {
	labels map[string]string
	value  float64
}

// auditSeries parses the reconciler's /metrics text and keeps the audit's
// series (harvester_ipam_audit_*), which the audit's alerts read.
func auditSeries(t *testing.T, metrics string) []sample {
	t.Helper()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(strings.NewReader(metrics))
	require.NoError(t, err, "the reconciler's /metrics parses")
	var out []sample
	for name, f := range fams {
		if !strings.HasPrefix(name, "harvester_ipam_audit_") {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{"__name__": name}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, sample{l, m.GetGauge().GetValue()})
		}
	}
	require.NotEmpty(t, out, "the scrape has the audit's series:\n%s", metrics)
	return out
}

// findingOf is the value of harvester_ipam_audit_findings{kind, network}
// in series; -1 when it has none.
func findingOf(series []sample, kind audit.Kind, network string) float64 {
	for _, s := range series {
		if s.labels["__name__"] == "harvester_ipam_audit_findings" && s.labels["kind"] == string(kind) && s.labels["network"] == network {
			return s.value
		}
	}
	return -1
}

var (
	labelRef = regexp.MustCompile(`\{\{ \$labels\.([a-z_]+) \}\}`)
	valueRef = regexp.MustCompile(`\{\{ \$value \}\}`)
)

// expand renders an annotation's template for an alert of the series
// labels with value: $labels.name and $value, the only ones the audit's
// alerts use (another fails the test: teach it the new one).
func expand(t *testing.T, tmpl string, labels map[string]string, value float64) string {
	t.Helper()
	s := labelRef.ReplaceAllStringFunc(tmpl, func(m string) string { return labels[labelRef.FindStringSubmatch(m)[1]] })
	s = valueRef.ReplaceAllString(s, fmt.Sprint(value))
	require.NotContains(t, s, "{{", "an annotation template this test cannot render: %s", tmpl)
	return s
}

// alertTest is one promtool test group: the series, held at their values,
// and the audit alerts expected to fire from each.
type alertTest struct {
	name   string
	series []sample
}

// assertAuditAlerts runs each test group through Prometheus' rule engine
// (promtool test rules) with the chart's rules as rendered: every audit
// alert fires, once its for: is past, for each series of its kinds above
// 0 and with the summary and description its templates say, and for
// nothing else; a group whose series are all 0 fires none.
func assertAuditAlerts(t *testing.T, rr renderedRules, tests ...alertTest) {
	t.Helper()
	promtool := rig.Tools["promtool"]
	if st, err := os.Stat(promtool); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("no promtool at %q: testcni/tools.sh promtool builds it", promtool)
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), rr.file, 0o644))
	var groups []map[string]any
	for _, tt := range tests {
		groups = append(groups, rr.group(t, tt))
	}
	b, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "30s", "tests": groups})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o644))
	cmd := exec.CommandContext(ctx(t), promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "promtool test rules, the chart's PrometheusRule against the reconciler's series:\n%s\ntest.yaml:\n%s", out, b)
}

// group is tt as a promtool test group: each series scraped every 30 s for
// 20 minutes as the ServiceMonitor labels it; each audit alert looked at
// one evaluation after its for:.
func (rr renderedRules) group(t *testing.T, tt alertTest) map[string]any {
	t.Helper()
	var input []map[string]any
	want := map[string][]map[string]any{}
	for _, s := range tt.series {
		l := map[string]string{}
		for k, v := range rr.scrape {
			l[k] = v
		}
		for k, v := range s.labels { // honorLabels: the series' own win
			l[k] = v
		}
		input = append(input, map[string]any{"series": seriesText(l), "values": fmt.Sprintf("%gx40", s.value)})
		if l["__name__"] != "harvester_ipam_audit_findings" || s.value <= 0 {
			continue
		}
		name, ok := auditAlerts[audit.Kind(l["kind"])]
		require.True(t, ok, "a finding of kind %q, which no alert is named for", l["kind"])
		rule := rr.alerts[name]
		exp := map[string]string{}
		for k, v := range l {
			if k != "__name__" {
				exp[k] = v
			}
		}
		lbls, _ := rule["labels"].(map[string]any)
		for k, v := range lbls {
			exp[k] = fmt.Sprint(v)
		}
		ann := map[string]string{}
		anns, _ := rule["annotations"].(map[string]any)
		for k, v := range anns {
			ann[k] = expand(t, v.(string), l, s.value)
		}
		want[name] = append(want[name], map[string]any{"exp_labels": exp, "exp_annotations": ann})
	}
	var checks []map[string]any
	for _, name := range sortedAlerts() {
		var forDur time.Duration
		if f, ok := rr.alerts[name]["for"].(string); ok {
			d, err := time.ParseDuration(f)
			require.NoError(t, err, "alert %s's for: %q", name, f)
			forDur = d
		}
		exp := want[name]
		if exp == nil {
			exp = []map[string]any{}
		}
		checks = append(checks, map[string]any{"eval_time": (forDur + time.Minute).String(), "alertname": name, "exp_alerts": exp})
	}
	return map[string]any{"name": tt.name, "interval": "30s", "input_series": input, "alert_rule_test": checks}
}

func sortedAlerts() []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range auditAlerts {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// seriesText is a series in PromQL's notation: name{label="value", ...}.
func seriesText(l map[string]string) string {
	var keys []string
	for k := range l {
		if k != "__name__" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return l["__name__"] + "{" + strings.Join(parts, ",") + "}"
}

// findings are the reconciler's audit series for one network: every kind at
// 0 but those given, and its headroom figures, as the audit exports them.
func findings(network string, open map[audit.Kind]float64) []sample {
	var out []sample
	for _, k := range audit.Kinds {
		out = append(out, sample{map[string]string{"__name__": "harvester_ipam_audit_findings", "kind": string(k), "network": network}, open[k]})
	}
	return append(out,
		sample{map[string]string{"__name__": "harvester_ipam_audit_free", "network": network}, 20},
		sample{map[string]string{"__name__": "harvester_ipam_audit_need", "network": network}, 4})
}

// TestChartAuditAlertsFireAsRendered: the chart's PrometheusRule as helm
// renders it, in Prometheus' own rule engine (promtool test rules): each
// audit alert fires, past its for:, when a finding of its kind is open on a
// network, naming the network, and none fires while no finding is open.
// TestAuditReportsWhatBreaks does the same with the real reconciler's
// scrape.
func TestChartAuditAlertsFireAsRendered(t *testing.T) {
	t.Parallel()
	rr := renderRules(t)
	const sn, rwx = "harvester-system/storagenetwork", "harvester-system/rwx"
	tests := []alertTest{{name: "none open", series: append(findings(sn, nil), findings(rwx, nil)...)}}
	for _, k := range audit.Kinds {
		tests = append(tests, alertTest{name: string(k) + " open", series: append(findings(sn, map[audit.Kind]float64{k: 2}), findings(rwx, nil)...)})
	}
	tests = append(tests, alertTest{name: "every kind open on two networks", series: append(
		findings(sn, map[audit.Kind]float64{audit.MissingAddress: 1, audit.SharedAddress: 1, audit.PodPoolMismatch: 3, audit.EntryReservationMismatch: 1, audit.Headroom: 1}),
		findings(rwx, map[audit.Kind]float64{audit.MissingAddress: 1, audit.EntryReservationMismatch: 2})...)})
	assertAuditAlerts(t, rr, tests...)
}
