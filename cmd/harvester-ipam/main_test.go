package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/version"
)

// The runtime execs the plugin for every sandbox: what it links, it pays for
// at each start. client-go's scheme of every built-in API group (brought in
// by any typed client of k8s.io/client-go/kubernetes) doubled its memory and
// added tens of milliseconds to every ADD and DEL; the metrics and informer
// machinery belong to the reconciler; the core/v1 types made the binary a
// quarter bigger for the pods named when a range is full.
func TestThePluginLinksNoHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, heavy := range []string{
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/kubernetes/scheme",
		"k8s.io/client-go/informers",
		"k8s.io/client-go/dynamic",
		"github.com/prometheus/client_golang/prometheus",
		"k8s.io/api/apps/v1",
		// the core types (a fifth of the binary) for a message on a full range
		"k8s.io/api/core/v1",
	} {
		if deps[heavy] {
			t.Errorf("the plugin links %s", heavy)
		}
	}
	if !deps["github.com/harvester/harvester-ipam/plugin"] {
		t.Fatalf("go list -deps does not list the plugin package: %s", out)
	}
}

// buildPlugin builds this command into dir under name, with a version.
func buildPlugin(t *testing.T, dir, name, version string) string {
	t.Helper()
	out := dir + "/" + name
	b, err := exec.Command("go", "build", "-ldflags", "-X main.Version="+version, "-o", out, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// A person who runs the plugin asks it what it is: --help names its verbs
// and exit codes, --version its version; a runtime never passes arguments.
func TestHelpAndVersion(t *testing.T) {
	bin := buildPlugin(t, t.TempDir(), "harvester-ipam", "v9.8.7")
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "harvester-ipam v9.8.7" {
		t.Errorf("--version: %v %q", err, out)
	}
	out, err = exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Errorf("--help: %v", err)
	}
	for _, want := range []string{"CNI_COMMAND", "ADD, DEL, CHECK, GC, STATUS, VERSION", "Exit status", "11 try again later", "whereabouts.real"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not say %q:\n%s", want, out)
		}
	}
	cmd := exec.Command(bin, "--frobnicate")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--help") {
		t.Errorf("an unknown argument: %v %q, want exit 2 pointing at --help", err, out)
	}
}

// CNI_COMMAND=VERSION prints the CNI version info on stdout, as the spec
// wants, and names both binaries on stderr: harvester-ipam at whereabouts'
// name and the real whereabouts aside (or that it is missing).
func TestVersionNamesBothBinaries(t *testing.T) {
	dir := t.TempDir()
	bin := buildPlugin(t, dir, "whereabouts", "v9.8.7")
	run := func() (string, string) {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("CNI_COMMAND=VERSION: %v %s", err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	stdout, stderr := run()
	if !strings.Contains(stdout, `"supportedVersions"`) || strings.Contains(stdout, "harvester-ipam") {
		t.Errorf("stdout is the CNI version info alone: %q", stdout)
	}
	if !strings.Contains(stderr, "harvester-ipam v9.8.7 at "+bin) || !strings.Contains(stderr, "whereabouts.real is missing") {
		t.Errorf("without the real binary aside, stderr: %q", stderr)
	}
	if err := os.WriteFile(bin+".real", []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, stderr = run()
	if !strings.Contains(stderr, "standing in for whereabouts: allocations go to the real whereabouts at "+bin+".real") {
		t.Errorf("with the real binary aside, stderr: %q", stderr)
	}
}

// At whereabouts' name, the plugin is handed every config that names
// whereabouts, in whatever cniVersion it was written: it must answer every
// version whereabouts answers (whereabouts' cmd/whereabouts.go passes
// version.All to skel), or the runtime's ADD fails where whereabouts' would
// not. Found by whereabouts' own end-to-end suite, whose NADs say 0.3.0:
// "incompatible CNI versions; config is "0.3.0"".
func TestAnswersEveryCNIVersionWhereaboutsAnswers(t *testing.T) {
	bin := buildPlugin(t, t.TempDir(), "harvester-ipam", "v9.8.7")
	for _, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			cmd.Stdin = strings.NewReader(`{"cniVersion":"` + v + `"}`)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("VERSION: %v %s", err, out)
			}
			var info struct {
				SupportedVersions []string `json:"supportedVersions"`
			}
			if err := json.Unmarshal(out, &info); err != nil || !slices.Contains(info.SupportedVersions, v) {
				t.Errorf("VERSION says %s (%v): want %s among them, as whereabouts answers it", out, err, v)
			}
			// An ADD of that version gets past skel's version check: it
			// fails later, for want of a pod and a delegate, not with
			// "incompatible CNI versions".
			cmd = exec.Command(bin)
			cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=abc", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=net1", "CNI_PATH=" + t.TempDir()}
			cmd.Stdin = strings.NewReader(`{"cniVersion":"` + v + `","name":"wa-nad","type":"macvlan","ipam":{"type":"whereabouts","range":"10.10.0.0/16"}}`)
			out, _ = cmd.Output()
			if strings.Contains(string(out), "incompatible CNI versions") {
				t.Errorf("ADD of a cniVersion %s config: %s", v, out)
			}
		})
	}
}
