package testcni

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The operators' READMEs whose every command a test runs as written:
// testcni/e2e's TestKubeletREADME runs README.md's marked blocks (and the
// reference's), TestKubeletAddonREADME the add-on README's.
var operatorDocs = []string{"README.md", addonREADME}

var (
	markedFence = regexp.MustCompile("^\\s*```console\\s+(rig|node):(\\S+)\\s*$")
	anyFence    = regexp.MustCompile("^\\s*```")
	codeSpan    = regexp.MustCompile("`([^`\n]+)`")
	commandWord = regexp.MustCompile(`^(kubectl|helm|make|crane|go|docker|ctr|scp|curl|/var/lib/rancher/rke2/bin/ctr) `)
)

// blockCommands are the commands of a file's marked console blocks (a
// `$ ` line, continued by a trailing \), and the lines of its unmarked
// fences (a sketch, such as the README's first screen), without comments.
func blockCommands(t *testing.T, text string) (marked []string, sketched []string) {
	t.Helper()
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !anyFence.MatchString(lines[i]) {
			continue
		}
		isMarked := markedFence.MatchString(lines[i])
		lang := strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(lines[i]), "`"))
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			l := strings.TrimSpace(lines[i])
			switch {
			case isMarked && strings.HasPrefix(l, "$ "):
				c := strings.TrimPrefix(l, "$ ")
				for strings.HasSuffix(c, "\\") && i+1 < len(lines) {
					i++
					c = strings.TrimSuffix(c, "\\") + " " + strings.TrimSpace(lines[i])
				}
				marked = append(marked, c)
			case !isMarked && lang == "":
				if c, _, _ := strings.Cut(l, "#"); strings.TrimSpace(c) != "" {
					sketched = append(sketched, strings.TrimSpace(c))
				}
			}
		}
	}
	return marked, sketched
}

// runs says whether cmd is one of the block commands, or its start up to a
// word's end (a span such as `helm uninstall` naming a block's command).
func runs(cmd string, blocks []string) bool {
	for _, b := range blocks {
		if b == cmd || strings.HasPrefix(b, cmd+" ") {
			return true
		}
	}
	return false
}

// Every command the operators' READMEs give is one a test runs as written:
// each a command of a marked console block (which the README tests run, and
// whose marks they check), or a code span that names one of those, or its
// start; a command in a table's cell or in a sentence that no block has is
// one no test runs, and fails this test. The Addon is always named in
// full (addons.harvesterhci.io): RKE2 serves k3s' Addon too, and kubectl's
// short addon may name that one.
func TestEveryREADMECommandIsRunByATest(t *testing.T) {
	root := moduleRoot(t)
	var all []string
	texts := map[string]string{}
	for _, f := range operatorDocs {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(b)
		marked, _ := blockCommands(t, string(b))
		if len(marked) == 0 {
			t.Fatalf("%s: no marked console block", f)
		}
		all = append(all, marked...)
	}
	shortAddon := regexp.MustCompile(`\b(get|patch|wait|edit|describe|delete|apply)\s+addons?(/|\s)`)
	for _, f := range operatorDocs {
		text := texts[f]
		_, sketched := blockCommands(t, text)
		for _, c := range sketched {
			if !runs(c, all) {
				t.Errorf("%s: the sketch's %q is no command a README test runs", f, c)
			}
		}
		inFence := false
		for n, l := range strings.Split(text, "\n") {
			if anyFence.MatchString(l) {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range codeSpan.FindAllStringSubmatch(l, -1) {
				span := strings.TrimSpace(m[1])
				if commandWord.MatchString(span) && !runs(span, all) {
					t.Errorf("%s:%d: %q is a command no README test runs: give it a marked block, or name one", f, n+1, span)
				}
			}
		}
		for _, c := range all {
			if shortAddon.MatchString(c) {
				t.Errorf("%s: %q names the Addon short: on Harvester that may be k3s' addons.k3s.cattle.io", f, c)
			}
		}
	}
}

// The README says exactly which whereabouts versions are tested: those the
// rig runs (tools.sh's WHEREABOUTS_VERSIONS), no more, no fewer; and it ends
// at about 2,500 words.
func TestTheREADMEsFirstScreen(t *testing.T) {
	root := moduleRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	m := regexp.MustCompile(`(?s)\*\*Tested\*\*(.*?)Not tested`).FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no **Tested** item on its first screen naming what is tested, then what is not")
	}
	said := map[string]bool{}
	list := regexp.MustCompile(`whereabouts ((?:v[0-9]+\.[0-9]+\.[0-9]+(?:,\s+|,?\s+and\s+))*v[0-9]+\.[0-9]+\.[0-9]+)`).FindStringSubmatch(m[1])
	if list == nil {
		t.Fatalf("README.md: the Tested item names no whereabouts versions: %s", m[1])
	}
	for _, v := range regexp.MustCompile(`v[0-9]+\.[0-9]+\.[0-9]+`).FindAllString(list[1], -1) {
		said[v] = true
	}
	out, err := exec.Command("bash", "-c", `sed -n 's/^WHEREABOUTS_VERSIONS="\(.*\)"$/\1/p' `+filepath.Join(root, "testcni", "tools.sh")).Output()
	if err != nil {
		t.Fatal(err)
	}
	rigs := map[string]bool{}
	for _, v := range strings.Fields(string(out)) {
		rigs[v] = true
	}
	if len(rigs) == 0 {
		t.Fatal("tools.sh: no WHEREABOUTS_VERSIONS")
	}
	if !equalSets(said, rigs) {
		t.Errorf("README.md says whereabouts %v are tested; the rig runs %v", keys(said), keys(rigs))
	}
	if n := len(strings.Fields(readme)); n > 2700 {
		t.Errorf("README.md is %d words: about 2,500 at most (developers' material goes to docs/)", n)
	}
	for _, want := range []string{"**On each node**", "**Undone** by `helm uninstall harvester-ipam -n kube-system --wait`", "**The image** is built from this repository", "every 10 minutes"} {
		if !strings.Contains(readme[:strings.Index(readme, "## Prerequisites")], want) {
			t.Errorf("README.md's first screen does not say %q", want)
		}
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
