package testcni

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Tools are the third-party binaries the rig runs, pinned in tools.sh.
type Tools map[string]string

// toolNames are the ones every rig needs.
var toolNames = []string{"etcd", "kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler", "busybox",
	"cnitool", "bridge", "host-local", "loopback", "macvlan",
	"whereabouts-v0.9.4", "whereabouts-v0.9.3", "whereabouts-v0.9.2", "whereabouts-v0.8.0", "whereabouts-v0.7.0",
	"ip-control-loop-v0.9.4", "ip-control-loop-v0.9.3", "ip-control-loop-v0.9.2", "ip-control-loop-v0.8.0", "ip-control-loop-v0.7.0",
	"whereabouts-reconciler-v0.9.4", "whereabouts-script-v0.9.4", "whereabouts-script-v0.9.3", "whereabouts-script-v0.9.2", "whereabouts-script-v0.8.0", "whereabouts-script-v0.7.0",
	"whereabouts-crds-v0.9.4", "whereabouts-crds-v0.9.3", "whereabouts-crds-v0.9.2", "whereabouts-crds-v0.8.0", "whereabouts-crds-v0.7.0",
	"multus", "helm", "monitoring-crds", "promtool", "webhook", "webhook-crds",
	"kubectl", "crane", "helm-controller", "harvester-crds", "k3s-crds"}

// toolFiles are files a tool dir must hold: whereabouts v0.9's images carry
// its token-watcher.sh, which their DaemonSet starts beside ip-control-loop.
var toolFiles = map[string]string{
	"whereabouts-script-v0.9.4": "token-watcher.sh",
	"whereabouts-script-v0.9.3": "token-watcher.sh",
	"whereabouts-script-v0.9.2": "token-watcher.sh",
	"harvester-crds":            "harvesterhci.io_addons.yaml",
	"k3s-crds":                  "k3s.cattle.io_addons.yaml",
}

// EnsureTools returns the cached tools, building the missing ones first with
// testcni/tools.sh (minutes on a fresh machine, nothing when cached).
func EnsureTools(root string, progress io.Writer) (Tools, error) {
	return EnsureToolSet(root, "", progress)
}

// EnsureToolSet is EnsureTools for a set of tools.sh's: "" every tool the
// rig's tests run, "demo" only what make demo runs (tools.sh set demo); the
// rest is neither checked nor built.
func EnsureToolSet(root, set string, progress io.Writer) (Tools, error) {
	script := filepath.Join(root, "testcni", "tools.sh")
	tools, err := toolPaths(script)
	if err != nil {
		return nil, err
	}
	names, target := toolNames, "all"
	if set != "" {
		out, err := exec.Command("bash", script, "set", set).Output()
		if err != nil {
			return nil, fmt.Errorf("the tools of set %s (%s set %s): %w", set, script, set, err)
		}
		names, target = strings.Fields(string(out)), set
	}
	in := map[string]bool{}
	for _, n := range names {
		in[n] = true
	}
	files := map[string]string{}
	for tool, file := range toolFiles {
		if in[tool] {
			files[tool] = file
		}
	}
	var missing []string
	for _, n := range names {
		// A binary must be executable; a dir or a manifest (.yaml) exist.
		if st, err := os.Stat(tools[n]); err != nil || (st.Mode().IsRegular() && st.Mode()&0o111 == 0 && !strings.HasSuffix(tools[n], ".yaml")) {
			missing = append(missing, n)
		}
	}
	// Files inside a tool's dir that a cache filled by an older tools.sh lacks.
	for tool, file := range files {
		if _, err := os.Stat(filepath.Join(tools[tool], file)); err != nil {
			missing = append(missing, tool+"/"+file)
		}
	}
	if len(missing) == 0 {
		return tools, nil
	}
	fmt.Fprintf(progress, "rig: building %s from the Go module proxy (cached afterwards)\n", strings.Join(missing, ", "))
	cmd := exec.Command("bash", script, target)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build the rig's tools (%s %s): %w", script, target, err)
	}
	for _, n := range names {
		if _, err := os.Stat(tools[n]); err != nil {
			return nil, fmt.Errorf("tool %s missing after %s %s: %w", n, script, target, err)
		}
	}
	for tool, file := range files {
		if _, err := os.Stat(filepath.Join(tools[tool], file)); err != nil {
			return nil, fmt.Errorf("%s of %s missing after %s %s: %w", file, tool, script, target, err)
		}
	}
	return tools, nil
}

func toolPaths(script string) (Tools, error) {
	out, err := exec.Command("bash", script, "paths").Output()
	if err != nil {
		return nil, fmt.Errorf("list the rig's tools (%s paths): %w", script, err)
	}
	tools := Tools{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			tools[k] = v
		}
	}
	return tools, nil
}

// ModuleRoot finds the harvester-ipam module root above dir.
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/harvester/harvester-ipam\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no harvester-ipam go.mod above %s: run the rig from the repository", dir)
		}
	}
}
