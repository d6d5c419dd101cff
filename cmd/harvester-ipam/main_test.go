package main

import (
	"os/exec"
	"strings"
	"testing"
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
