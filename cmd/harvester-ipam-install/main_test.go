package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harvester/harvester-ipam/install/standin"
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

// After the stand-in is turned off, an operator checks the give-back with
// --verify --not-stand-in=whereabouts: exit 0 and what is at the name once
// the real whereabouts is back and nothing is aside; exit 1, saying so,
// while harvester-ipam still stands in. --verify --stand-in=whereabouts (the
// check while it stands in) points there when it finds the real binary.
func TestVerifyAfterTheStandInIsTurnedOff(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "harvester-ipam-install")
	if b, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	dir := t.TempDir()
	write := func(path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugin := filepath.Join(t.TempDir(), "harvester-ipam")
	write(plugin, "#!/bin/sh\nif [ \"$CNI_COMMAND\" = VERSION ]; then\n  echo '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.3.1\",\"1.0.0\",\"1.1.0\"]}'\n  exit 0\nfi\necho \"harvester-ipam v9: test plugin\" >&2\n# "+standin.Mark+"\n")
	real := "#!/bin/sh\nif [ \"$CNI_COMMAND\" = VERSION ]; then\n  echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.1\",\"1.0.0\"]}'\n  exit 0\nfi\nexit 1\n"
	write(filepath.Join(dir, "whereabouts"), real)
	run := func(args ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"--source", plugin, "--cni-bin-dir", dir, "--flat-file", ""}, args...)...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	// Standing in (as the chart's pod does once).
	if out, code := run("--stand-in", "whereabouts"); code != 0 {
		t.Fatalf("install: exit %d\n%s", code, out)
	}
	out, code := run("--verify", "--not-stand-in", "whereabouts")
	if code != 1 || !strings.Contains(out, "harvester-ipam still stands in at "+filepath.Join(dir, "whereabouts")) {
		t.Errorf("--verify --not-stand-in while it stands in: exit %d, want 1 saying it still stands in:\n%s", code, out)
	}
	// Given back (as the turned-off pod does).
	if out, code := run("--give-back", "--stand-in", "whereabouts"); code != 0 {
		t.Fatalf("give back: exit %d\n%s", code, out)
	}
	out, code = run("--verify", "--not-stand-in", "whereabouts")
	if code != 0 || !strings.Contains(out, "the real whereabouts is at "+filepath.Join(dir, "whereabouts")+"; nothing at "+filepath.Join(dir, "whereabouts.real")) ||
		!strings.Contains(out, "\n"+filepath.Join(dir, "whereabouts")+": ") || !strings.Contains(out, "sha256 ") {
		t.Errorf("--verify --not-stand-in once given back: exit %d, want 0 saying the real whereabouts is at its name:\n%s", code, out)
	}
	out, code = run("--verify", "--stand-in", "whereabouts")
	if code != 1 || !strings.Contains(out, "--verify --not-stand-in=whereabouts") {
		t.Errorf("--verify --stand-in once given back: exit %d, want 1 naming the check of a give-back:\n%s", code, out)
	}
	out, code = run("--verify", "--stand-in", "whereabouts", "--not-stand-in", "whereabouts")
	if code != 2 {
		t.Errorf("--stand-in and --not-stand-in of one name: exit %d, want 2:\n%s", code, out)
	}
}
