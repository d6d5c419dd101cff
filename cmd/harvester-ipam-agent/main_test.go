package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// build builds the command into a directory of the test's.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "harvester-ipam-agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func runBin(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	require.NoError(t, err)
	return string(out), 0
}

func TestFlags(t *testing.T) {
	bin := build(t)
	out, code := runBin(t, bin, "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "harvester-ipam-agent probe")
	assert.Contains(t, out, "-socket")
	out, code = runBin(t, bin, "--version")
	assert.Equal(t, 0, code)
	assert.Equal(t, "harvester-ipam-agent dev\n", out)
	out, code = runBin(t, bin, "serve")
	assert.Equal(t, 2, code)
	assert.Contains(t, out, `unexpected argument "serve"`)
	out, code = runBin(t, bin, "--namespace", " , ", "--kubeconfig", "/nonexistent")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--namespace names no namespace")
	out, code = runBin(t, bin, "probe", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "not serving: node agent at")
}
