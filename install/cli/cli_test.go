package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/install"
	"github.com/harvester/harvester-ipam/install/standin"
)

// After the stand-in is turned off, an operator checks the give-back with
// --verify --not-stand-in=whereabouts: exit 0 and what is at the name once
// the real whereabouts is back and nothing is aside; exit 1, saying so,
// while harvester-ipam still stands in. --verify --stand-in=whereabouts (the
// check while it stands in) points there when it finds the real binary.
func TestVerifyAfterTheStandInIsTurnedOff(t *testing.T) {
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
	// The command line the test gives, over the flags' defaults.
	type args struct {
		standIn, notStandIn string
		verify, giveBack    bool
	}
	run := func(a args) (string, int) {
		t.Helper()
		var out bytes.Buffer
		code := Main(context.Background(), Config{
			Install:  install.Options{Source: plugin, BinDir: dir, Name: "harvester-ipam", Timeout: 10 * time.Second},
			Require:  "0.3.1",
			Delegate: "whereabouts",
			StandIn:  a.standIn, NotStandIn: a.notStandIn, Verify: a.verify, GiveBack: a.giveBack,
			Stdout: &out, Stderr: &out,
		})
		return out.String(), code
	}
	// Standing in (as the chart's pod does once).
	if out, code := run(args{standIn: "whereabouts"}); code != 0 {
		t.Fatalf("install: exit %d\n%s", code, out)
	}
	out, code := run(args{verify: true, notStandIn: "whereabouts"})
	if code != 1 || !strings.Contains(out, "harvester-ipam still stands in at "+filepath.Join(dir, "whereabouts")) {
		t.Errorf("--verify --not-stand-in while it stands in: exit %d, want 1 saying it still stands in:\n%s", code, out)
	}
	// Given back (as the turned-off pod does).
	if out, code := run(args{giveBack: true, standIn: "whereabouts"}); code != 0 {
		t.Fatalf("give back: exit %d\n%s", code, out)
	}
	out, code = run(args{verify: true, notStandIn: "whereabouts"})
	if code != 0 || !strings.Contains(out, "the real whereabouts is at "+filepath.Join(dir, "whereabouts")+"; nothing at "+filepath.Join(dir, "whereabouts.real")) ||
		!strings.Contains(out, "\n"+filepath.Join(dir, "whereabouts")+": ") || !strings.Contains(out, "sha256 ") {
		t.Errorf("--verify --not-stand-in once given back: exit %d, want 0 saying the real whereabouts is at its name:\n%s", code, out)
	}
	out, code = run(args{verify: true, standIn: "whereabouts"})
	if code != 1 || !strings.Contains(out, "--verify --not-stand-in=whereabouts") {
		t.Errorf("--verify --stand-in once given back: exit %d, want 1 naming the check of a give-back:\n%s", code, out)
	}
	out, code = run(args{verify: true, standIn: "whereabouts", notStandIn: "whereabouts"})
	if code != 2 {
		t.Errorf("--stand-in and --not-stand-in of one name: exit %d, want 2:\n%s", code, out)
	}
}
