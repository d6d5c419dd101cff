package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A person reads --help for the installer's modes and exit codes, --version
// for which build it is, and gets exit 2 for a command line that cannot run.
func TestHelpVersionAndBadUsage(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "harvester-ipam-install")
	if b, err := exec.Command("go", "build", "-ldflags", "-X main.Version=v9.8.7", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "harvester-ipam-install v9.8.7" {
		t.Errorf("--version: %v %q", err, out)
	}
	out, err = exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Errorf("--help exits %v", err)
	}
	for _, want := range []string{"--verify", "--give-back", "Exit status: 0", "2 bad flags", "--cni-bin-dir /opt/cni/bin"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not say %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"extra"}, {"--give-back"}, {"--no-such-flag"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%v: %v %q, want exit 2", args, err, out)
		}
	}
}
