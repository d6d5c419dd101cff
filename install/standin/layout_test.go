package standin

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// moduleRoot is the root of the module under test.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Builds of harvester-ipam that its main package path does not name: from
// the main file alone ("command-line-arguments"), and from a fork whose
// module and main package moved.
var (
	forkOnce   sync.Once
	forkBuilds map[string]string
	forkErr    error
)

func forks(t *testing.T) map[string]string {
	t.Helper()
	forkOnce.Do(func() {
		root := moduleRoot(t)
		dir, err := os.MkdirTemp("", "standin-forks-")
		builds = append(builds, dir)
		if err != nil {
			forkErr = err
			return
		}
		forkBuilds = map[string]string{
			"main.go alone":         filepath.Join(dir, "main-go-alone"),
			"a fork, its cmd moved": filepath.Join(dir, "fork"),
		}
		cmd := exec.Command("go", "build", "-o", forkBuilds["main.go alone"], "cmd/harvester-ipam/main.go")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			forkErr = &buildError{string(out), err}
			return
		}
		src := filepath.Join(dir, "src")
		if forkErr = copyFork(root, src, "example.com/someone/ipam-fork"); forkErr != nil {
			return
		}
		cmd = exec.Command("go", "build", "-o", forkBuilds["a fork, its cmd moved"], "./cmd/ipam")
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			forkErr = &buildError{string(out), err}
		}
	})
	require.NoError(t, forkErr)
	return forkBuilds
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "build: " + e.err.Error() + "\n" + e.out }

// copyFork copies the module's Go sources to dst as a fork would have them:
// another module path, the plugin's main package at cmd/ipam.
func copyFork(root, dst, module string) error {
	return filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if e.IsDir() {
			if rel == ".git" || rel == "testcni" || rel == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") && rel != "go.mod" && rel != "go.sum" || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		b = []byte(strings.ReplaceAll(string(b), Module, module))
		rel = strings.Replace(rel, "cmd/harvester-ipam/", "cmd/ipam/", 1)
		out := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
}

// Every build of harvester-ipam is told apart from the real binary, whatever
// its main package path or module; no real binary is taken for it.
func TestEveryBuildIsHarvesterIPAM(t *testing.T) {
	builds := forks(t)
	builds["the module's own build"] = harvesterIPAM(t)
	for what, path := range builds {
		assert.True(t, IsHarvesterIPAM(path), "%s is harvester-ipam", what)
	}
	real := filepath.Join(t.TempDir(), "whereabouts")
	require.NoError(t, os.WriteFile(real, realBinary("v0.9.3"), 0o755))
	assert.False(t, IsHarvesterIPAM(real), "the real binary is not")
	assert.False(t, IsHarvesterIPAM(filepath.Join(t.TempDir(), "missing")), "nothing is not")
	// The plugin's cheap look knows a build by its module (a moved main
	// package too); one from main.go alone names no module, and the guard
	// stops it when it is run as a delegate.
	assert.True(t, IsBuildOfThisModule(harvesterIPAM(t)))
	assert.False(t, IsBuildOfThisModule(builds["main.go alone"]))
	assert.False(t, IsBuildOfThisModule(real))
}

// A build the old identity (its main package path) missed stands in like any
// other: taken once, never aside, never taken again for a real binary (no
// write feeds the watcher its own events), and giving back restores the
// real binary.
func TestAForkStandsInAndGivesBack(t *testing.T) {
	ctx := bounded(t)
	v093 := realBinary("v0.9.3")
	for what, self := range forks(t) {
		t.Run(what, func(t *testing.T) {
			d := newDir(t, v093)
			d.Self = self
			changed, err := d.Take(ctx, true)
			require.NoError(t, err)
			assert.True(t, changed)
			assert.Equal(t, read(t, self), read(t, d.name()))
			assert.Equal(t, v093, read(t, d.aside()))
			for i := 0; i < 3; i++ {
				changed, err = d.Take(ctx, false)
				require.NoError(t, err)
				assert.False(t, changed, "standing in already: nothing written")
			}
			assert.Equal(t, v093, read(t, d.aside()), "harvester-ipam never aside")
			require.NoError(t, d.GiveBack(ctx))
			assert.Equal(t, v093, read(t, d.name()), "the real binary back")
			assert.Nil(t, read(t, d.aside()))
		})
	}
}
