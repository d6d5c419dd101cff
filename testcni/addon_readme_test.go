package testcni

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// addonREADME is the add-on's README, whose values example an operator
// copies into the Addon's spec.valuesContent.
const addonREADME = "install/addon/harvester-ipam/README.md"

var yamlFenceRE = regexp.MustCompile("(?ms)^[ \t]*```yaml[ \t]*\n(.*?)^[ \t]*```")

// valuesContents are the spec.valuesContent of each yaml block of the
// add-on's README that has one.
func valuesContents(t *testing.T, readme []byte) []string {
	t.Helper()
	var out []string
	for _, m := range yamlFenceRE.FindAllSubmatch(readme, -1) {
		body := m[1]
		if !bytes.Contains(body, []byte("valuesContent:")) {
			continue
		}
		// The block's own indentation (a list item's) is not the YAML's.
		lines := strings.Split(string(body), "\n")
		indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
		for i, l := range lines {
			if len(l) >= indent && strings.TrimSpace(l[:indent]) == "" {
				lines[i] = l[indent:]
			}
		}
		var doc struct {
			Spec struct {
				ValuesContent *string `json:"valuesContent"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &doc); err != nil {
			t.Fatalf("%s: a yaml block with valuesContent does not read: %v\n%s", addonREADME, err, body)
		}
		if doc.Spec.ValuesContent == nil {
			t.Fatalf("%s: a yaml block names valuesContent outside spec:\n%s", addonREADME, body)
		}
		out = append(out, *doc.Spec.ValuesContent)
	}
	return out
}

// helm is the rig's pinned helm, built first if the cache lacks it.
func helm(t *testing.T, root string) string {
	t.Helper()
	script := filepath.Join(root, "testcni", "tools.sh")
	tools, err := toolPaths(script)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tools["helm"]); err != nil {
		if out, err := exec.Command("bash", script, "helm").CombinedOutput(); err != nil {
			t.Fatalf("%s helm: %v\n%s", script, err, out)
		}
	}
	return tools["helm"]
}

// The add-on README's valuesContent example, as an operator pastes it into
// the Addon, is what helm-controller hands the chart as a values file: it
// renders (the chart's schema refuses unknown keys, such as a dotted
// `image.repository` at the top), in the add-on's namespace, with the image
// and pull secret it names.
func TestTheAddonREADMEValuesRender(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, addonREADME))
	if err != nil {
		t.Fatal(err)
	}
	examples := valuesContents(t, readme)
	if len(examples) == 0 {
		t.Fatalf("%s: no ```yaml block with spec.valuesContent: the example an operator copies", addonREADME)
	}
	bin := helm(t, root)
	home := t.TempDir()
	for i, values := range examples {
		var v struct {
			Image struct {
				Repository string `json:"repository"`
			} `json:"image"`
			ImagePullSecrets []struct {
				Name string `json:"name"`
			} `json:"imagePullSecrets"`
		}
		if err := yaml.Unmarshal([]byte(values), &v); err != nil {
			t.Errorf("example %d: valuesContent is not YAML: %v\n%s", i+1, err, values)
			continue
		}
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "template", "harvester-ipam", "install/chart/harvester-ipam", "--namespace", "harvester-system", "-f", f)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("example %d: helm template -f refuses the README's valuesContent: %v: %s\n%s", i+1, err, stderr.String(), values)
			continue
		}
		out := stdout.String()
		if v.Image.Repository != "" && !strings.Contains(out, "image: "+v.Image.Repository+":") {
			t.Errorf("example %d: the DaemonSets do not run %s", i+1, v.Image.Repository)
		}
		for _, s := range v.ImagePullSecrets {
			if !strings.Contains(out, "- name: "+s.Name) {
				t.Errorf("example %d: the pull secret %s is not in the pods", i+1, s.Name)
			}
		}
	}
}
