package testcni

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// `make chart-repo` adds the chart to the repository and keeps the versions
// before it, so that an Addon's spec.version can go back to one: a
// repository made for 0.1.0, then for 0.1.1 (CHART_VERSION, as a release
// with a newer Chart.yaml), serves both, each at the URL given, and making
// one again replaces it rather than adding a second entry.
func TestChartRepoKeepsEveryVersion(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	bin := helm(t, root)
	home := t.TempDir()
	repo := filepath.Join(t.TempDir(), "chart-repo")
	const url = "http://charts.example.com/harvester-ipam"
	mk := func(extra ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "chart-repo", "CHART_REPO=" + repo, "CHART_REPO_URL=" + url, "HELM=" + bin}, extra...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make chart-repo %v: %v\n%s", extra, err, out)
		}
	}
	chart, err := os.ReadFile(filepath.Join(root, "install", "chart", "harvester-ipam", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Version, AppVersion string
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil {
		t.Fatal(err)
	}
	mk()
	mk("CHART_VERSION=99.0.1")
	mk() // the chart's own version again

	var index struct {
		Entries map[string][]struct {
			Version    string   `json:"version"`
			AppVersion string   `json:"appVersion"`
			URLs       []string `json:"urls"`
		} `json:"entries"`
	}
	b, err := os.ReadFile(filepath.Join(repo, "index.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &index); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range index.Entries["harvester-ipam"] {
		if _, dup := got[e.Version]; dup {
			t.Errorf("version %s listed twice", e.Version)
		}
		got[e.Version] = strings.Join(e.URLs, " ")
		if e.AppVersion != meta.AppVersion {
			t.Errorf("version %s: appVersion %s, want the chart's %s (the image)", e.Version, e.AppVersion, meta.AppVersion)
		}
	}
	for _, v := range []string{meta.Version, "99.0.1"} {
		if got[v] != url+"/harvester-ipam-"+v+".tgz" {
			t.Errorf("index.yaml: version %s at %q, want %s/harvester-ipam-%s.tgz (index: %v)", v, got[v], url, v, got)
		}
		if _, err := os.Stat(filepath.Join(repo, "harvester-ipam-"+v+".tgz")); err != nil {
			t.Errorf("the repository lost version %s: %v", v, err)
		}
	}
	if len(got) != 2 {
		t.Errorf("index.yaml lists %v: want %s and 99.0.1", got, meta.Version)
	}
}
