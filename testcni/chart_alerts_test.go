package testcni

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// promtool is the rig's pinned promtool, built first if the cache lacks it.
func promtool(t *testing.T, root string) string {
	t.Helper()
	script := filepath.Join(root, "testcni", "tools.sh")
	tools, err := toolPaths(script)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tools["promtool"]); err != nil {
		if out, err := exec.Command("bash", script, "promtool").CombinedOutput(); err != nil {
			t.Fatalf("%s promtool: %v\n%s", script, err, out)
		}
	}
	return tools["promtool"]
}

// chartRules renders the chart in namespace with set and returns its
// PrometheusRule's spec (a Prometheus rule file) and its alerting rules by
// name.
func chartRules(t *testing.T, root, namespace string, set ...string) ([]byte, map[string]map[string]any) {
	t.Helper()
	home := t.TempDir()
	args := []string{"template", "harvester-ipam", "install/chart/harvester-ipam", "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm(t, root), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template %v: %v: %s", set, err, stderr.String())
	}
	for _, doc := range strings.Split(stdout.String(), "\n---\n") {
		var o struct {
			Kind string `json:"kind"`
			Spec struct {
				Groups []struct {
					Rules []map[string]any `json:"rules"`
				} `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil || o.Kind != "PrometheusRule" {
			continue
		}
		var spec map[string]any
		if err := yaml.Unmarshal([]byte(doc), &spec); err != nil {
			t.Fatal(err)
		}
		file, err := yaml.Marshal(spec["spec"])
		if err != nil {
			t.Fatal(err)
		}
		alerts := map[string]map[string]any{}
		for _, g := range o.Spec.Groups {
			for _, r := range g.Rules {
				if name, ok := r["alert"].(string); ok {
					alerts[name] = r
				}
			}
		}
		return file, alerts
	}
	t.Fatalf("helm template %v: no PrometheusRule", set)
	return nil, nil
}

// Every alert the chart can render carries component: harvester-ipam, so
// that one Alertmanager route takes them all, whichever namespace their
// series carry (the pools', the release's, a Job's); the runbook of each
// audit alert that asks for a pod's new sandbox says what each kind of
// Longhorn pod takes and costs, and never says to delete an instance
// manager.
func TestEveryAlertCarriesTheChartsLabel(t *testing.T) {
	root := moduleRoot(t)
	modes := map[string][]string{
		"deployment": {"reconciler.mode=deployment", "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true"},
		"cronjob":    {"monitoring.prometheusRule.enabled=true"},
	}
	for mode, set := range modes {
		_, alerts := chartRules(t, root, "harvester-system", set...)
		if len(alerts) == 0 {
			t.Fatalf("%s: no alerts", mode)
		}
		for name, r := range alerts {
			labels, _ := r["labels"].(map[string]any)
			if labels["component"] != "harvester-ipam" {
				t.Errorf("%s: alert %s has labels %v: want component: harvester-ipam", mode, name, labels)
			}
			if s := labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: alert %s has severity %v", mode, name, s)
			}
		}
		if _, ok := alerts["HarvesterIPAMReconcilerAbsent"]; !ok {
			t.Errorf("%s: no HarvesterIPAMReconcilerAbsent: the reconciler gone silences every other alert", mode)
		}
		for _, name := range []string{"HarvesterIPAMPodWithoutStorageNetwork", "HarvesterIPAMAddressShared", "HarvesterIPAMPodPoolMismatch"} {
			if mode != "deployment" {
				continue
			}
			d, _ := alerts[name]["annotations"].(map[string]any)["description"].(string)
			for _, want := range []string{"instance-manager-*", "maintenance mode", "share-manager-<volume>", "backing-image-manager-*", "backing-image-ds-*", "virt-launcher-*", "docs/reference.md"} {
				if !strings.Contains(d, want) {
					t.Errorf("alert %s's runbook does not say %q: %s", name, want, d)
				}
			}
			if regexp.MustCompile(`delete that pod|delete the newest|delete the pod the finding names`).MatchString(d) {
				t.Errorf("alert %s's runbook says to delete the pod whatever it is: %s", name, d)
			}
			// Each kind's sentence says what the audit's Events say of it
			// (audit.remedy): never a delete of an instance manager or a
			// share manager, a backing-image manager's only once none of
			// its files is in progress, a VM live-migrated.
			for kind, rule := range map[string]struct{ want, never string }{
				"instance-manager-":      {"maintenance mode", "delete the pod"},
				"share-manager-":         {"until the volume is detached", "delete the pod"},
				"backing-image-manager-": {"only once none of its files is in progress", ""},
				"virt-launcher-":         {"live-migrate", "delete the pod"},
			} {
				i := strings.Index(d, kind)
				if i < 0 {
					t.Errorf("alert %s's runbook names no %s", name, kind)
					continue
				}
				sentence, _, _ := strings.Cut(d[i:], ". ")
				if !strings.Contains(sentence, rule.want) {
					t.Errorf("alert %s's runbook for %s does not say %q: %s", name, kind, rule.want, sentence)
				}
				if rule.never != "" && strings.Contains(sentence, rule.never) {
					t.Errorf("alert %s's runbook for %s says %q: %s", name, kind, rule.never, sentence)
				}
			}
		}
	}
	_, cron := chartRules(t, root, "harvester-system", modes["cronjob"]...)
	for _, name := range []string{"HarvesterIPAMReconcilerJobFailed", "HarvesterIPAMReconcilerNotSucceeding", "HarvesterIPAMReconcilerAbsent", "HarvesterIPAMAgentNotServing"} {
		if _, ok := cron[name]; !ok {
			t.Errorf("cronjob mode: no alert %s", name)
		}
	}
	if len(cron) != 4 {
		t.Errorf("cronjob mode renders %d alerts: want the four kube-state-metrics can raise", len(cron))
	}
	_, noAgent := chartRules(t, root, "harvester-system", append(modes["cronjob"], "agent.enabled=false")...)
	if _, ok := noAgent["HarvesterIPAMAgentNotServing"]; ok || len(noAgent) != 3 {
		t.Errorf("cronjob mode without the agent renders %d alerts (HarvesterIPAMAgentNotServing: %v): want the reconciler's three", len(noAgent), ok)
	}
	_, dep := chartRules(t, root, "harvester-system", modes["deployment"]...)
	for _, name := range []string{"HarvesterIPAMAuditNotJudging", "HarvesterIPAMAgentNotServing"} {
		if _, ok := dep[name]; !ok {
			t.Errorf("deployment mode: no alert %s: a silent loss (issue 44) goes unnoticed", name)
		}
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// series is one input series of a promtool test: its labels (the name as
// __name__) and its value, held for 40 minutes of 30 s scrapes.
type series struct {
	labels map[string]string
	value  float64
}

// firing is an alert expected to fire: its name and its labels beyond the
// rule's own (severity, component).
type firing struct {
	name   string
	labels map[string]string
	value  float64 // $value, for its annotations
}

// ruleCase is one promtool test group: the series, the time at which each
// of the alerts is looked at, and the alerts that fire then; every other
// alert of the rule file must be quiet at that time.
type ruleCase struct {
	name   string
	series []series
	at     time.Duration
	fire   []firing
}

var (
	promLabelRef = regexp.MustCompile(`\{\{ \$labels\.([a-z_]+) \}\}`)
	promValueRef = regexp.MustCompile(`\{\{ \$value \}\}`)
	promDuration = regexp.MustCompile(`\{\{ \$value \| humanizeDuration \}\}`)
)

// expandAnnotation renders an annotation's template as Prometheus does for
// the templates the chart's alerts use: $labels.name, $value and $value |
// humanizeDuration (another fails the test: teach it the new one).
func expandAnnotation(t *testing.T, tmpl string, labels map[string]string, value float64) string {
	t.Helper()
	s := promLabelRef.ReplaceAllStringFunc(tmpl, func(m string) string { return labels[promLabelRef.FindStringSubmatch(m)[1]] })
	s = promDuration.ReplaceAllString(s, humanizeDuration(value))
	s = promValueRef.ReplaceAllString(s, fmt.Sprint(value))
	if strings.Contains(s, "{{") {
		t.Fatalf("an annotation template this test cannot render: %s", tmpl)
	}
	return s
}

// humanizeDuration is Prometheus' template function of that name, for a
// whole number of seconds.
func humanizeDuration(v float64) string {
	if v == 0 || math.Abs(v) < 1 {
		return fmt.Sprintf("%.4gs", v)
	}
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	d := int64(v)
	s, m, h, days := d%60, (d/60)%60, (d/3600)%24, d/86400
	switch {
	case days != 0:
		return fmt.Sprintf("%s%dd %dh %dm %ds", sign, days, h, m, s)
	case h != 0:
		return fmt.Sprintf("%s%dh %dm %ds", sign, h, m, s)
	case m != 0:
		return fmt.Sprintf("%s%dm %ds", sign, m, s)
	}
	return fmt.Sprintf("%s%.4gs", sign, v)
}

func promSeries(l map[string]string) string {
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

// assertRulesFire runs each case through Prometheus' own rule engine
// (promtool test rules) against the rule file as the chart renders it.
func assertRulesFire(t *testing.T, root string, file []byte, alerts map[string]map[string]any, cases ...ruleCase) {
	t.Helper()
	var groups []map[string]any
	for _, c := range cases {
		var input []map[string]any
		for _, s := range c.series {
			input = append(input, map[string]any{"series": promSeries(s.labels), "values": fmt.Sprintf("%gx80", s.value)})
		}
		want := map[string][]map[string]any{}
		for _, f := range c.fire {
			rule, ok := alerts[f.name]
			if !ok {
				t.Fatalf("%s: the rule file has no alert %s", c.name, f.name)
			}
			exp := map[string]string{}
			for k, v := range f.labels {
				exp[k] = v
			}
			lbls, _ := rule["labels"].(map[string]any)
			for k, v := range lbls {
				exp[k] = fmt.Sprint(v)
			}
			ann := map[string]string{}
			anns, _ := rule["annotations"].(map[string]any)
			for k, v := range anns {
				ann[k] = expandAnnotation(t, v.(string), f.labels, f.value)
			}
			want[f.name] = append(want[f.name], map[string]any{"exp_labels": exp, "exp_annotations": ann})
		}
		var names []string
		for n := range alerts {
			names = append(names, n)
		}
		sort.Strings(names)
		var checks []map[string]any
		for _, n := range names {
			exp := want[n]
			if exp == nil {
				exp = []map[string]any{}
			}
			checks = append(checks, map[string]any{"eval_time": c.at.String(), "alertname": n, "exp_alerts": exp})
		}
		groups = append(groups, map[string]any{"name": c.name, "interval": "30s", "input_series": input, "alert_rule_test": checks})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "30s", "tests": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool(t, root), "test", "rules", "test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules, the chart's PrometheusRule: %v\n%s\ntest.yaml:\n%s", err, out, b)
	}
}

func ksm(name string, value float64, kv ...string) series {
	l := map[string]string{"__name__": name, "job": "kube-state-metrics", "instance": "10.52.0.9:8080"}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return series{l, value}
}

func without(l map[string]string, keys ...string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		out[k] = v
	}
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// The reconciler gone, or failing, is an alert through what
// rancher-monitoring already scrapes, in each mode: in CronJob mode
// kube-state-metrics' view of the CronJob and its Jobs (a failed Job, no
// Job succeeded for noSuccessForSeconds, the CronJob deleted or suspended),
// in Deployment mode absent() of the reconciler's own series or its
// Deployment without an available replica. A healthy reconciler fires
// none. Through Prometheus' own rule engine (promtool test rules), with the
// chart's rules as helm renders them in the add-on's namespace.
func TestChartReconcilerAlertsFireAsRendered(t *testing.T) {
	root := moduleRoot(t)
	const ns, rec = "harvester-system", "harvester-ipam-reconciler"

	file, alerts := chartRules(t, root, ns, "monitoring.prometheusRule.enabled=true")
	info := ksm("kube_cronjob_info", 1, "namespace", ns, "cronjob", rec, "schedule", "*/10 * * * *")
	running := ksm("kube_cronjob_spec_suspend", 0, "namespace", ns, "cronjob", rec)
	// promtool's clock starts at 0: a success at 0 is 2400 s old at 40m.
	lastOK := ksm("kube_cronjob_status_last_successful_time", 0, "namespace", ns, "cronjob", rec)
	failed := ksm("kube_job_status_failed", 1, "namespace", ns, "job_name", rec+"-29112340", "reason", "BackoffLimitExceeded")
	otherFailed := ksm("kube_job_status_failed", 1, "namespace", ns, "job_name", "backup-29112340", "reason", "BackoffLimitExceeded")
	okJob := ksm("kube_job_status_failed", 0, "namespace", ns, "job_name", rec+"-29112350")
	suspended := ksm("kube_cronjob_spec_suspend", 1, "namespace", ns, "cronjob", rec)
	otherRelease := ksm("kube_cronjob_info", 1, "namespace", "kube-system", "cronjob", rec)
	assertRulesFire(t, root, file, alerts,
		ruleCase{name: "cronjob: healthy, a recent success", at: 20 * time.Minute,
			series: []series{info, running, lastOK, okJob, otherFailed}},
		ruleCase{name: "cronjob: a failed Job", at: 20 * time.Minute,
			series: []series{info, running, lastOK, failed, okJob},
			fire:   []firing{{name: "HarvesterIPAMReconcilerJobFailed", labels: without(failed.labels, "__name__"), value: 1}}},
		ruleCase{name: "cronjob: no success for noSuccessForSeconds", at: 40 * time.Minute,
			series: []series{info, running, lastOK},
			fire:   []firing{{name: "HarvesterIPAMReconcilerNotSucceeding", labels: without(lastOK.labels, "__name__"), value: 2400}}},
		ruleCase{name: "cronjob: suspended", at: 20 * time.Minute,
			series: []series{info, suspended, lastOK},
			fire:   []firing{{name: "HarvesterIPAMReconcilerAbsent", labels: without(suspended.labels, "__name__"), value: 1}}},
		ruleCase{name: "cronjob: gone (another release's is no stand-in)", at: 20 * time.Minute,
			series: []series{otherRelease},
			fire:   []firing{{name: "HarvesterIPAMReconcilerAbsent", labels: map[string]string{"namespace": ns, "cronjob": rec}, value: 1}}},
	)

	file, alerts = chartRules(t, root, ns, "reconciler.mode=deployment", "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true")
	reconciler := reconcilerSeries(ns, rec)
	passes := reconciler("harvester_ipam_reconciler_passes_total", 12)
	// A success "now" at every evaluation: its age stays under 1800 s
	// within the test's 40 minutes.
	success := reconciler("harvester_ipam_reconciler_last_success_timestamp_seconds", 1500)
	available := ksm("kube_deployment_status_replicas_available", 1, "namespace", ns, "deployment", rec)
	unavailable := ksm("kube_deployment_status_replicas_available", 0, "namespace", ns, "deployment", rec)
	otherPasses := series{map[string]string{"__name__": "harvester_ipam_reconciler_passes_total", "namespace": "kube-system", "job": "harvester-ipam-metrics"}, 3}
	following := reconciler("harvester_ipam_audit_following", 1)
	assertRulesFire(t, root, file, alerts,
		ruleCase{name: "deployment: healthy", at: 20 * time.Minute,
			series: []series{passes, success, available, following}},
		ruleCase{name: "deployment: no replica available", at: 20 * time.Minute,
			series: []series{passes, success, unavailable, following},
			fire:   []firing{{name: "HarvesterIPAMReconcilerAbsent", labels: without(unavailable.labels, "__name__"), value: 0}}},
		ruleCase{name: "deployment: not scraped (another release's series are no stand-in)", at: 20 * time.Minute,
			series: []series{available, otherPasses},
			fire:   []firing{{name: "HarvesterIPAMReconcilerAbsent", labels: map[string]string{"namespace": ns}, value: 1}}},
	)
}

// The audit's next commands name the release's own DaemonSet: the chart
// gives the reconciler (CronJob and Deployment) --daemonset, and the
// diagnostics container, where an operator runs inspect --audit by hand,
// HARVESTER_IPAM_DAEMONSET, whatever the release is named.
func TestTheAuditNamesTheReleasesDaemonSet(t *testing.T) {
	root := moduleRoot(t)
	for _, mode := range []string{"cronjob", "deployment"} {
		home := t.TempDir()
		cmd := exec.Command(helm(t, root), "template", "prod", "install/chart/harvester-ipam", "--namespace", "harvester-system", "--set", "reconciler.mode="+mode)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helm template: %v", err)
		}
		s := string(out)
		if !regexp.MustCompile(`- --grace=\S+\n\s+- --daemonset=prod-harvester-ipam\n`).MatchString(s) {
			t.Errorf("%s: the reconciler has no --daemonset=prod-harvester-ipam", mode)
		}
		if !regexp.MustCompile(`name: HARVESTER_IPAM_DAEMONSET\n\s+value: prod-harvester-ipam\n`).MatchString(s) {
			t.Errorf("%s: the diagnostics container has no HARVESTER_IPAM_DAEMONSET=prod-harvester-ipam", mode)
		}
	}
}

// The audit not judging is an alert (issue 44): harvester_ipam_audit_following
// 0 for 5m, longer than an API server restart and the reflectors' backoff
// (up to about a minute); and, scraped through the ServiceMonitor, the
// gauge absent while the reconciler's own series are there (an audit that
// never started: the gauge has no series before its first look, and a
// Watch that failed is not tried again). Not before its for:, not while it
// is 1, not for another release's series, and not with no series at all
// (HarvesterIPAMReconcilerAbsent's).
func TestChartAuditNotJudgingFiresAsRendered(t *testing.T) {
	root := moduleRoot(t)
	const ns, rec = "harvester-system", "harvester-ipam-reconciler"
	file, alerts := chartRules(t, root, ns, "reconciler.mode=deployment", "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true")
	reconciler := reconcilerSeries(ns, rec)
	passes := reconciler("harvester_ipam_reconciler_passes_total", 12)
	success := reconciler("harvester_ipam_reconciler_last_success_timestamp_seconds", 1500)
	available := ksm("kube_deployment_status_replicas_available", 1, "namespace", ns, "deployment", rec)
	healthy := []series{passes, success, available}
	following := reconciler("harvester_ipam_audit_following", 1)
	behind := reconciler("harvester_ipam_audit_following", 0)
	otherBehind := series{map[string]string{"__name__": "harvester_ipam_audit_following", "namespace": "kube-system", "job": "harvester-ipam-metrics"}, 0}
	const hold = 5 * time.Minute
	notJudging := firing{name: "HarvesterIPAMAuditNotJudging", labels: without(behind.labels, "__name__"), value: 0}
	assertRulesFire(t, root, file, alerts,
		ruleCase{name: "audit: following", at: 20 * time.Minute,
			series: append(healthy, following)},
		ruleCase{name: "audit: not following, before for:", at: hold - 30*time.Second,
			series: append(healthy, behind)},
		ruleCase{name: "audit: not following, past for:", at: hold + 30*time.Second,
			series: append(healthy, behind), fire: []firing{notJudging}},
		ruleCase{name: "audit: not following for long", at: 20 * time.Minute,
			series: append(healthy, behind), fire: []firing{notJudging}},
		ruleCase{name: "audit: another release's not following", at: 20 * time.Minute,
			series: append(healthy, following, otherBehind)},
		ruleCase{name: "audit: never started, before for:", at: hold - 30*time.Second,
			series: healthy},
		ruleCase{name: "audit: never started (the gauge absent, the reconciler scraped)", at: hold + 30*time.Second,
			series: healthy, fire: []firing{{name: "HarvesterIPAMAuditNotJudging", labels: map[string]string{"namespace": ns}, value: 1}}},
		ruleCase{name: "audit: no series at all", at: 20 * time.Minute,
			series: []series{available},
			fire:   []firing{{name: "HarvesterIPAMReconcilerAbsent", labels: map[string]string{"namespace": ns}, value: 1}}},
	)

	// Without the ServiceMonitor the reconciler's series may come from
	// elsewhere (or nowhere): only the gauge at 0 fires.
	file, alerts = chartRules(t, root, ns, "reconciler.mode=deployment", "monitoring.prometheusRule.enabled=true")
	assertRulesFire(t, root, file, alerts,
		ruleCase{name: "audit, no ServiceMonitor: the gauge absent", at: 20 * time.Minute,
			series: healthy},
		ruleCase{name: "audit, no ServiceMonitor: not following", at: hold + 30*time.Second,
			series: append(healthy, behind), fire: []firing{notJudging}},
	)
}

// A node agent that serves no request is an alert (issue 44), in either
// mode: its own harvester_ipam_agent_declining{reason} is served on the
// node's loopback only (agent.metricsPort, 127.0.0.1; the chart scrapes
// no agent), but an agent that declines every request fails its readiness
// probe, and kube-state-metrics, which rancher-monitoring scrapes, says so
// by pod and node. For 10m: a rollout or a restart declines briefly
// (docs/agent.md). Not while it is Ready, not for another DaemonSet's pod
// (the installer's, of the same release), not on a node that is not
// Ready, and not with no series.
func TestChartAgentNotServingFiresAsRendered(t *testing.T) {
	root := moduleRoot(t)
	const ns, ds, pod, node = "harvester-system", "harvester-ipam-agent", "harvester-ipam-agent-x7k2p", "harvester-node-1"
	ready := func(pod, uid string, ok bool) []series {
		v := map[bool]float64{true: 1, false: 0}
		return []series{
			ksm("kube_pod_status_ready", v[ok], "namespace", ns, "pod", pod, "uid", uid, "condition", "true"),
			ksm("kube_pod_status_ready", v[!ok], "namespace", ns, "pod", pod, "uid", uid, "condition", "false"),
			ksm("kube_pod_status_ready", 0, "namespace", ns, "pod", pod, "uid", uid, "condition", "unknown"),
		}
	}
	info := func(pod, uid, owner string) series {
		return ksm("kube_pod_info", 1, "namespace", ns, "pod", pod, "uid", uid, "node", node, "host_ip", "10.0.0.11", "pod_ip", "10.0.0.11",
			"created_by_kind", "DaemonSet", "created_by_name", owner, "priority_class", "system-node-critical", "host_network", "true")
	}
	nodeReady := func(ok bool) []series {
		v := map[bool]float64{true: 1, false: 0}
		return []series{
			ksm("kube_node_status_condition", v[ok], "node", node, "condition", "Ready", "status", "true"),
			ksm("kube_node_status_condition", v[!ok], "node", node, "condition", "Ready", "status", "false"),
		}
	}
	cat := func(parts ...[]series) []series {
		var out []series
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	agent := info(pod, "7d1e", ds)
	installer := info("harvester-ipam-q8z4n", "3b9c", "harvester-ipam")
	notReady := ready(pod, "7d1e", false)
	notServing := firing{name: "HarvesterIPAMAgentNotServing", value: 0,
		labels: map[string]string{"job": "kube-state-metrics", "instance": "10.52.0.9:8080", "namespace": ns, "pod": pod, "uid": "7d1e", "condition": "true", "node": node}}
	const hold = 10 * time.Minute
	for _, mode := range [][]string{
		{"monitoring.prometheusRule.enabled=true"},
		{"reconciler.mode=deployment", "monitoring.prometheusRule.enabled=true"},
	} {
		file, alerts := chartRules(t, root, ns, mode...)
		// The reconciler's own alerts quiet: its CronJob (or Deployment)
		// healthy, as kube-state-metrics and its scrape say.
		var quiet []series
		if len(mode) == 1 {
			quiet = []series{
				ksm("kube_cronjob_info", 1, "namespace", ns, "cronjob", "harvester-ipam-reconciler", "schedule", "*/10 * * * *"),
				ksm("kube_cronjob_spec_suspend", 0, "namespace", ns, "cronjob", "harvester-ipam-reconciler"),
				ksm("kube_cronjob_status_last_successful_time", 1500, "namespace", ns, "cronjob", "harvester-ipam-reconciler"),
			}
		} else {
			quiet = []series{
				ksm("kube_deployment_status_replicas_available", 1, "namespace", ns, "deployment", "harvester-ipam-reconciler"),
				{map[string]string{"__name__": "harvester_ipam_reconciler_last_success_timestamp_seconds", "namespace": ns}, 1500},
				{map[string]string{"__name__": "harvester_ipam_audit_following", "namespace": ns}, 1},
			}
		}
		assertRulesFire(t, root, file, alerts,
			ruleCase{name: mode[0] + ": the agent Ready", at: 20 * time.Minute,
				series: cat(quiet, ready(pod, "7d1e", true), []series{agent}, nodeReady(true))},
			ruleCase{name: mode[0] + ": not Ready, before for:", at: hold - 30*time.Second,
				series: cat(quiet, notReady, []series{agent}, nodeReady(true))},
			ruleCase{name: mode[0] + ": not Ready, past for:", at: hold + 30*time.Second,
				series: cat(quiet, notReady, []series{agent}, nodeReady(true)), fire: []firing{notServing}},
			ruleCase{name: mode[0] + ": the installer not Ready (another alert's)", at: 20 * time.Minute,
				series: cat(quiet, ready(pod, "7d1e", true), []series{agent}, ready("harvester-ipam-q8z4n", "3b9c", false), []series{installer}, nodeReady(true))},
			ruleCase{name: mode[0] + ": not Ready on a node that is not Ready", at: 20 * time.Minute,
				series: cat(quiet, notReady, []series{agent}, nodeReady(false))},
			ruleCase{name: mode[0] + ": no series", at: 20 * time.Minute,
				series: quiet},
		)
	}
}

// reconcilerSeries makes a series of the reconciler's Deployment rec in ns
// as the ServiceMonitor scrapes it (its job, service, pod and instance
// labels).
func reconcilerSeries(ns, rec string) func(name string, value float64) series {
	scrape := map[string]string{"job": "harvester-ipam-metrics", "namespace": ns, "service": "harvester-ipam-metrics", "endpoint": "metrics", "pod": rec + "-5d8f7c9b4-x2x7q", "container": "reconcile", "instance": "10.52.0.7:9420"}
	return func(name string, value float64) series {
		l := without(scrape)
		l["__name__"] = name
		return series{l, value}
	}
}
