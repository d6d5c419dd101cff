package testcni

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// make demo builds what the demo runs and nothing else: the set demo names
// only tools tools.sh knows, none of those only make test runs (helm,
// Harvester's webhook, promtool, crane, helm-controller, busybox, the other
// whereabouts versions); and its plan says, in its first second on a fresh
// machine, what it will build and about how long.
func TestTheDemoBuildsOnlyWhatItRuns(t *testing.T) {
	root := moduleRoot(t)
	script := filepath.Join(root, "testcni", "tools.sh")
	tools, err := toolPaths(script)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", script, "set", "demo").Output()
	if err != nil {
		t.Fatal(err)
	}
	set := strings.Fields(string(out))
	if len(set) == 0 {
		t.Fatal("tools.sh set demo names no tool")
	}
	for _, n := range set {
		if _, ok := tools[n]; !ok {
			t.Errorf("the demo's %s is no tool tools.sh paths knows", n)
		}
	}
	for _, n := range []string{"helm", "webhook", "promtool", "crane", "helm-controller", "busybox", "kubectl",
		"whereabouts-v0.9.4", "whereabouts-v0.8.0", "ip-control-loop-v0.9.3", "ip-control-loop-v0.7.0", "whereabouts-reconciler-v0.9.4"} {
		if strings.Contains(" "+string(out)+" ", " "+n+" ") {
			t.Errorf("the demo's set has %s, which the demo does not run", n)
		}
	}

	cmd := exec.Command("bash", script, "plan", "demo")
	cmd.Env = append(os.Environ(), "HARVESTER_IPAM_CACHE="+t.TempDir())
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tools.sh plan demo: %v\n%s", err, b)
	}
	plan := string(b)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("tools.sh plan demo took %s: it is the demo's first second", d)
	}
	for _, want := range []string{"kube-apiserver", "whereabouts-v0.9.3", "whereabouts-v0.7.0", "multus", "about ", " minutes"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan on a fresh machine does not say %q: %s", want, plan)
		}
	}
	if strings.Contains(plan, "helm") || strings.Contains(plan, "promtool") {
		t.Errorf("the plan builds what the demo does not run: %s", plan)
	}
}
