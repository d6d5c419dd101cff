package testcni

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// renderDaemonSet renders the chart with helm template and returns its
// installer DaemonSet (harvester-ipam).
func renderDaemonSet(t *testing.T, root string, set ...string) *appsv1.DaemonSet {
	t.Helper()
	return renderDaemonSetNamed(t, root, "harvester-ipam", set...)
}

// renderDaemonSetNamed renders the chart and returns its DaemonSet name.
func renderDaemonSetNamed(t *testing.T, root, name string, set ...string) *appsv1.DaemonSet {
	t.Helper()
	home := t.TempDir()
	args := []string{"template", "harvester-ipam", "install/chart/harvester-ipam", "--namespace", "kube-system"}
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
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil || ds.Kind != "DaemonSet" || ds.Name != name {
			continue
		}
		return &ds
	}
	t.Fatalf("helm template %v: no DaemonSet %s", set, name)
	return nil
}

func container(ds *appsv1.DaemonSet, name string) *corev1.Container {
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == name {
			return &ds.Spec.Template.Spec.Containers[i]
		}
	}
	return nil
}

// The reconciler an operator runs by hand (inspect, a pass) lists the
// cluster: it runs in a container of its own in the installer's pods, the
// diagnostics container, idle until then (harvester-ipam-reconciler
// standby), with its own memory limit (diagnostics.resources), so that
// what it reads of a large cluster can never OOM-kill the installer, whose
// 64 MiB it shared. Without the reconciler's permissions there (no
// reconciler, or rbac.diagnostics=false) there is no such container. Every
// command the README, the chart's NOTES, the reconciler's help and the
// plugin's errors give for the reconciler names that container.
func TestDiagnosticsRunInAContainerOfTheirOwn(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	ds := renderDaemonSet(t, root)
	install, diag := container(ds, "install"), container(ds, "diagnostics")
	if install == nil || diag == nil {
		t.Fatalf("the installer's pod has containers %v: want install and diagnostics", containerNames(ds))
	}
	if got := strings.Join(append(diag.Command, diag.Args...), " "); got != "/usr/bin/harvester-ipam-reconciler standby" {
		t.Errorf("diagnostics runs %q: want harvester-ipam-reconciler standby", got)
	}
	if diag.Image != install.Image {
		t.Errorf("diagnostics runs %s, the installer %s: want the one image", diag.Image, install.Image)
	}
	if l := diag.Resources.Limits.Memory(); l.Cmp(resource.MustParse("256Mi")) != 0 {
		t.Errorf("diagnostics' memory limit is %s: want its own, 256Mi", l)
	}
	if r := diag.Resources.Requests.Memory(); r.Cmp(resource.MustParse("16Mi")) > 0 {
		t.Errorf("diagnostics requests %s of memory on every node: want little, it is idle", r)
	}
	if l := install.Resources.Limits.Memory(); l.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Errorf("the installer's memory limit is %s: want 64Mi, as before", l)
	}
	sc := diag.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || len(diag.VolumeMounts) != 0 {
		t.Errorf("diagnostics must run as non-root with no host path: %+v, mounts %v", sc, diag.VolumeMounts)
	}
	if ds.Spec.Template.Annotations["kubectl.kubernetes.io/default-container"] != "install" {
		t.Error("kubectl logs and exec without -c must still land in the installer")
	}
	ds = renderDaemonSet(t, root, "diagnostics.resources.limits.memory=512Mi")
	if l := container(ds, "diagnostics").Resources.Limits.Memory(); l.Cmp(resource.MustParse("512Mi")) != 0 {
		t.Errorf("diagnostics.resources.limits.memory=512Mi renders %s", l)
	}
	for _, set := range []string{"rbac.diagnostics=false", "reconciler.enabled=false"} {
		if c := container(renderDaemonSet(t, root, set), "diagnostics"); c != nil {
			t.Errorf("%s: a diagnostics container without the reconciler's permissions", set)
		}
	}

	// Every command given for the reconciler names the container.
	wrong := regexp.MustCompile(`-c install -- harvester-ipam-reconciler|ds/harvester-ipam -- harvester-ipam-reconciler`)
	for _, f := range []string{"README.md", "docs/reference.md", "docs/design.md", "install/README.md", "install/addon/harvester-ipam/README.md",
		"install/chart/harvester-ipam/templates/NOTES.txt", "install/chart/harvester-ipam/values.yaml",
		"install/chart/harvester-ipam/templates/monitoring.yaml", "plugin/full.go", "cmd/harvester-ipam-reconciler/main.go"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Error(err)
			continue
		}
		for _, m := range wrong.FindAll(b, -1) {
			t.Errorf("%s: %q runs the reconciler in the installer's container (want -c diagnostics)", f, m)
		}
	}
}

func containerNames(ds *appsv1.DaemonSet) []string {
	var out []string
	for _, c := range ds.Spec.Template.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

// The plugin waits for the node agent, however busy the node, so the
// agent's CPU weight is every sandbox's on a busy node: with a request of
// 10m its container's cpu.shares were 10, against containerd's (where the
// plugin alone runs) 1024, and through the agent every pod of a node at
// load 20 started slower than through the plugin alone (whereabouts'
// node-slice suite on the rig: 79 s and 90 s against 46 s and 62 s). It
// requests what Multus thick's daemon, the same kind of server on the same
// path, requests: 100m.
func TestTheAgentRequestsTheCPUOfADaemonOnEverySandboxsPath(t *testing.T) {
	agent := container(renderDaemonSetNamed(t, moduleRoot(t), "harvester-ipam-agent"), "agent")
	if agent == nil {
		t.Fatal("the chart's harvester-ipam-agent DaemonSet has no container agent")
	}
	if r := agent.Resources.Requests.Cpu(); r.Cmp(resource.MustParse("100m")) < 0 {
		t.Errorf("the agent requests %s of CPU: want at least 100m (its weight on a busy node is every sandbox's)", r)
	}
	if l := agent.Resources.Limits.Cpu(); !l.IsZero() {
		t.Errorf("the agent's CPU is limited to %s: a limit throttles it on the path of every sandbox; want none", l)
	}
}
