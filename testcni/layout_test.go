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
