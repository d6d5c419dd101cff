package testcni

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDesignNamesEveryTopLevelFolder holds docs/design.md's folder table to
// the tree: every top-level folder in git has its row, and every row names a
// folder that exists (bin/, build output, is not in git and keeps its row).
func TestDesignNamesEveryTopLevelFolder(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v (the test reads the tree from git)", err)
	}
	folders := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if i := strings.IndexByte(f, '/'); i > 0 {
			folders[f[:i]] = true
		}
	}
	design, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(design), "\n") {
		if strings.HasPrefix(line, "| `") {
			name := strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(line, "| `"), "`", 2)[0], "/")
			rows[name] = true
		}
	}
	for f := range folders {
		if !rows[f] {
			t.Errorf("docs/design.md's folder table has no row for %s/", f)
		}
	}
	for r := range rows {
		if !folders[r] && r != "bin" {
			t.Errorf("docs/design.md's folder table names %s/, which is not in the tree", r)
		}
	}
}

// TestNoTwoTopLevelFoldersImportEachOther holds the tree to one way down:
// no package of one top-level folder imports (for the product, tests
// aside) a package of a folder that imports back into the first, so that
// what a folder holds reads without what is above it.
func TestNoTwoTopLevelFoldersImportEachOther(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v (the test reads the imports from the go command)", err)
	}
	const module = "github.com/harvester/harvester-ipam/"
	folder := func(p string) string { return strings.SplitN(strings.TrimPrefix(p, module), "/", 2)[0] }
	edges := map[[2]string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], module) {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) && folder(imp) != folder(f[0]) {
				k := [2]string{folder(f[0]), folder(imp)}
				edges[k] = append(edges[k], strings.TrimPrefix(f[0], module)+" -> "+strings.TrimPrefix(imp, module))
			}
		}
	}
	if len(edges) == 0 {
		t.Fatal("no import between top-level folders: the listing read nothing")
	}
	for k, v := range edges {
		if back, ok := edges[[2]string{k[1], k[0]}]; ok && k[0] < k[1] {
			t.Errorf("%s/ and %s/ import each other: %s; and back: %s", k[0], k[1], strings.Join(v, ", "), strings.Join(back, ", "))
		}
	}
}
