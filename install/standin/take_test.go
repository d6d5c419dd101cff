package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A test run's harvester-ipam, built once from cmd/harvester-ipam: what
// stands in must be told apart from the real binary by its build info.
var (
	buildOnce sync.Once
	selfBin   string
	buildErr  error
)

func harvesterIPAM(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "standin-test-")
		builds = append(builds, dir)
		if err != nil {
			buildErr = err
			return
		}
		selfBin = filepath.Join(dir, "harvester-ipam")
		cmd := exec.Command("go", "build", "-o", selfBin, "github.com/harvester/harvester-ipam/cmd/harvester-ipam")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build harvester-ipam: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return selfBin
}

// realBinary is a stand-in for whereabouts of a version: a small static
// program that answers VERSION as a CNI plugin does (an ELF binary, as
// whereabouts is: a script is read by path a second time by its interpreter,
// so a rename in between would run half of one and half of another), with
// the version appended to its bytes.
func realBinary(version string) []byte {
	realOnce.Do(func() {
		dir, err := os.MkdirTemp("", "standin-real-")
		builds = append(builds, dir)
		if err != nil {
			realErr = err
			return
		}
		src := `package main

import "os"

func main() {
	if os.Getenv("CNI_COMMAND") == "VERSION" {
		os.Stdout.WriteString("{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.1\",\"1.0.0\"]}")
		return
	}
	os.Exit(1)
}
`
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			realErr = err
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module fakewhereabouts\n\ngo 1.26\n"), 0o644); err != nil {
			realErr = err
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", "whereabouts", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			realErr = fmt.Errorf("build a fake whereabouts: %v\n%s", err, out)
			return
		}
		realELF, realErr = os.ReadFile(filepath.Join(dir, "whereabouts"))
	})
	if realErr != nil {
		panic(realErr)
	}
	return append(append([]byte{}, realELF...), []byte("whereabouts "+version)...)
}

var (
	realOnce sync.Once
	realELF  []byte
	realErr  error
	// builds are the dirs the builds above went to, removed when the
	// package's tests end (a mutation run runs them hundreds of times).
	builds []string
)

func probeVersion(ctx context.Context, path string) error {
	var out []byte
	var err error
	for attempt := 0; attempt < 20; attempt++ { // ETXTBSY passes in moments
		cmd := exec.CommandContext(ctx, path)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		if out, err = cmd.Output(); err == nil || !strings.Contains(err.Error(), "text file busy") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return RunError(err)
	}
	var v struct{ SupportedVersions []string }
	if json.Unmarshal(out, &v) != nil || len(v.SupportedVersions) == 0 {
		return fmt.Errorf("no version info: %q: %w", out, ErrBroken)
	}
	return nil
}

func newDir(t *testing.T, real []byte) Dir {
	t.Helper()
	d := Dir{Path: t.TempDir(), Name: "whereabouts", Self: harvesterIPAM(t), Probe: probeVersion}
	if real != nil {
		require.NoError(t, os.WriteFile(d.name(), real, 0o755))
	}
	return d
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return b
}

func temps(t *testing.T, d Dir) []string {
	m, err := filepath.Glob(filepath.Join(d.Path, tempPrefix+"*"))
	require.NoError(t, err)
	return m
}

func TestTakeAndGiveBack(t *testing.T) {
	ctx := bounded(t)
	self := read(t, harvesterIPAM(t))
	v093 := realBinary("v0.9.3")
	d := newDir(t, v093)

	changed, err := d.Take(ctx, true)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, self, read(t, d.name()), "harvester-ipam at the name")
	assert.Equal(t, v093, read(t, d.aside()), "the real binary aside, byte for byte")
	assert.Empty(t, temps(t, d))

	changed, err = d.Take(ctx, true)
	require.NoError(t, err)
	assert.False(t, changed, "taking again changes nothing")

	require.NoError(t, d.GiveBack(ctx))
	assert.Equal(t, v093, read(t, d.name()), "the real binary back at its name, byte for byte")
	st, err := os.Stat(d.name())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())
	assert.Nil(t, read(t, d.aside()), "no aside left")
	require.NoError(t, d.GiveBack(ctx), "giving back again is a no-op")
	assert.Equal(t, v093, read(t, d.name()))
}

// whereabouts' install-cni.sh writes its binary over the name in place
// (`cp -f`), at every start of its pod and at an upgrade: the next Take keeps
// that binary aside and stands in again; harvester-ipam is never put aside.
func TestTakeAgainAfterTheRealInstallerWroteTheName(t *testing.T) {
	ctx := bounded(t)
	self := read(t, harvesterIPAM(t))
	d := newDir(t, realBinary("v0.9.3"))
	_, err := d.Take(ctx, true)
	require.NoError(t, err)

	v094 := realBinary("v0.9.4")
	f, err := os.OpenFile(d.name(), os.O_WRONLY|os.O_TRUNC, 0) // as cp -f does, into the inode
	require.NoError(t, err)
	_, err = f.Write(v094)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	changed, err := d.Take(ctx, true)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, self, read(t, d.name()))
	assert.Equal(t, v094, read(t, d.aside()), "the new version is the delegate now")

	// Written again, then given back: the newest stays at the name.
	v095 := realBinary("v0.9.5")
	require.NoError(t, os.WriteFile(d.name(), v095, 0o755))
	require.NoError(t, d.GiveBack(ctx))
	assert.Equal(t, v095, read(t, d.name()))
	assert.Nil(t, read(t, d.aside()))
}

func TestTakeRefusesWhatItCannotDo(t *testing.T) {
	ctx := bounded(t)
	t.Run("nothing to stand in for", func(t *testing.T) {
		d := newDir(t, nil)
		_, err := d.Take(ctx, true)
		assert.ErrorIs(t, err, ErrNoReal)
		assert.Nil(t, read(t, d.name()), "harvester-ipam not put where it would have no delegate")
	})
	t.Run("a real binary that does not run", func(t *testing.T) {
		d := newDir(t, []byte("\x7fELF half of a binary"))
		_, err := d.Take(ctx, true)
		assert.ErrorContains(t, err, "does not run")
		assert.Equal(t, "\x7fELF half of a binary", string(read(t, d.name())), "left as it was")
		assert.Nil(t, read(t, d.aside()))
	})
	t.Run("harvester-ipam at the name, nothing aside", func(t *testing.T) {
		d := newDir(t, read(t, harvesterIPAM(t)))
		_, err := d.Take(ctx, true)
		assert.ErrorContains(t, err, "the real whereabouts is missing at "+d.aside())
		assert.Nil(t, read(t, d.aside()), "harvester-ipam is never put aside")
		assert.ErrorIs(t, d.GiveBack(ctx), ErrNoReal, "nothing to give back")
	})
}

// An older harvester-ipam at the name (an upgrade of the DaemonSet) is
// replaced; the aside, the real binary, is kept.
func TestTakeReplacesAnotherHarvesterIPAM(t *testing.T) {
	ctx := bounded(t)
	d := newDir(t, realBinary("v0.9.3"))
	_, err := d.Take(ctx, true)
	require.NoError(t, err)
	older := append(read(t, d.Self), []byte("older build")...) // still harvester-ipam by its build info
	require.NoError(t, os.WriteFile(d.name(), older, 0o755))
	require.True(t, IsHarvesterIPAM(d.name()))

	changed, err := d.Take(ctx, true)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, read(t, d.Self), read(t, d.name()))
	assert.Equal(t, realBinary("v0.9.3"), read(t, d.aside()))
}

// crashEnv makes the test binary, run as a child, do one operation on a
// dir and die by SIGKILL at a step.
const crashEnv = "STANDIN_TEST_CRASH"

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashEnv); spec != "" {
		// op:step:dir:self
		parts := strings.SplitN(spec, ":", 4)
		d := Dir{Path: parts[2], Name: "whereabouts", Self: parts[3], Probe: probeVersion,
			AtStep: func(step string) {
				if step == parts[1] {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			}}
		var err error
		if parts[0] == "take" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			_, err = d.Take(ctx, true)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			err = d.GiveBack(ctx)
		}
		fmt.Fprintln(os.Stderr, "finished without crashing:", err)
		os.Exit(0)
	}
	code := m.Run()
	for _, d := range builds {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// A kill at any step of taking the name or giving it back leaves a whole
// runnable binary at the name, the real one at the name or aside, and never
// harvester-ipam aside; the next run of the same operation finishes it.
func TestAKillAtAnyStepLosesNothing(t *testing.T) {
	ctx := bounded(t)
	self := read(t, harvesterIPAM(t))
	v093 := realBinary("v0.9.3")
	tests := []struct {
		op, step string
		// setup runs before the child; taken says the dir starts stood in.
		taken bool
		// rewrite writes v0.9.4 over the name first (whereabouts' pod restarted).
		rewrite bool
	}{
		{"take", StepSelfReady, false, false},
		{"take", StepExchanged, false, false},
		{"take", StepAsideKept, false, false},
		{"take", StepSelfReady, true, true},
		{"take", StepExchanged, true, true},
		{"take", StepAsideKept, true, true},
		{"giveback", StepMarked, true, false},
		{"giveback", StepGivenBack, true, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s killed at %s (stood in %v, rewritten %v)", tt.op, tt.step, tt.taken, tt.rewrite), func(t *testing.T) {
			d := newDir(t, v093)
			want := v093
			if tt.taken {
				_, err := d.Take(ctx, true)
				require.NoError(t, err)
			}
			if tt.rewrite {
				want = realBinary("v0.9.4")
				require.NoError(t, os.WriteFile(d.name(), want, 0o755))
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%s:%s:%s", crashEnv, tt.op, tt.step, d.Path, d.Self))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the child must be killed at %s: %s", tt.step, out)
			require.Equal(t, "signal: killed", exit.Error())

			// Right after the kill.
			at := read(t, d.name())
			require.True(t, bytes.Equal(at, self) || bytes.Equal(at, want), "a whole binary at the name: %.40q", at)
			require.NoError(t, probeVersion(ctx, d.name()), "it runs")
			aside := read(t, d.aside())
			if tt.op == "giveback" && bytes.Equal(at, self) {
				// An uninstall's give-back has no run after it: the name must
				// run on its own, harvester-ipam with its delegate aside.
				assert.True(t, bytes.Equal(want, aside), "harvester-ipam at the name, the real binary aside: aside %s", whatIs(t, aside))
			} else {
				// Right after a give-back's exchange what came out of the name
				// is at the aside's name; the real binary is at the name.
				assert.True(t, tt.op == "giveback" && tt.step == StepGivenBack || !bytes.Equal(aside, self), "harvester-ipam is never aside")
			}
			realSomewhere := bytes.Equal(at, want) || bytes.Equal(aside, want)
			for _, tmp := range temps(t, d) {
				realSomewhere = realSomewhere || bytes.Equal(read(t, tmp), want)
			}
			assert.True(t, realSomewhere, "the real binary is kept")

			// The next run of the operation finishes it.
			if tt.op == "take" {
				_, err := d.Take(ctx, true)
				require.NoError(t, err)
				assert.Equal(t, self, read(t, d.name()))
				assert.Equal(t, want, read(t, d.aside()))
			} else {
				require.NoError(t, d.GiveBack(ctx))
				assert.Equal(t, want, read(t, d.name()))
				assert.Nil(t, read(t, d.aside()))
			}
			assert.Empty(t, temps(t, d))
		})
	}
}

// A loop that execs the name throughout take, rewrite, retake and give-back
// never fails to start a whole binary.
func TestTheNameAlwaysRuns(t *testing.T) {
	ctx := context.Background() // 20 rounds, long on a loaded machine: earlier tests catch a hang first (-failfast)
	d := newDir(t, realBinary("v0.9.3"))
	var execs, failures atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				execs.Add(1)
				if err := probeVersion(ctx, d.name()); err != nil {
					failures.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		_, err := d.Take(ctx, true)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(d.name()+".new", realBinary(fmt.Sprintf("v0.9.%d", i)), 0o755))
		require.NoError(t, os.Rename(d.name()+".new", d.name())) // a new version lands
		_, err = d.Take(ctx, true)
		require.NoError(t, err)
		require.NoError(t, d.GiveBack(ctx))
	}
	close(stop)
	wg.Wait()
	t.Logf("%d execs of the name, %d failed", execs.Load(), failures.Load())
	assert.Greater(t, execs.Load(), int64(50))
	assert.Zero(t, failures.Load(), "first failure: %v", firstFailure.Load())
}

// A filesystem without RENAME_EXCHANGE (bindfs, a FUSE filesystem, answers
// EINVAL): the real binary is kept aside before anything is renamed over the
// name, at the first Take and at a Take after an upgrade; giving back puts
// the newest back.
func TestWithoutExchangeTheRealBinaryIsKept(t *testing.T) {
	ctx := bounded(t)
	d := newDir(t, nil)
	d.Path = bindfs(t)
	for _, f := range []string{"a", "b"} {
		require.NoError(t, os.WriteFile(filepath.Join(d.Path, f), nil, 0o644))
	}
	require.ErrorIs(t, OS{}.Exchange(filepath.Join(d.Path, "a"), filepath.Join(d.Path, "b")), ErrNoExchange, "bindfs lacks the exchange on this machine")
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	require.NoError(t, os.WriteFile(d.name(), v093, 0o755))

	changed, err := d.Take(ctx, true)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, read(t, d.Self), read(t, d.name()))
	assert.Equal(t, v093, read(t, d.aside()), "the real binary aside")

	// whereabouts' pod upgraded: its cp -f writes into the file at the name.
	f, err := os.OpenFile(d.name(), os.O_WRONLY|os.O_TRUNC, 0)
	require.NoError(t, err)
	_, err = f.Write(v094)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = d.Take(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, read(t, d.Self), read(t, d.name()))
	assert.Equal(t, v094, read(t, d.aside()), "the new version aside, not the old")

	require.NoError(t, d.GiveBack(ctx))
	assert.Equal(t, v094, read(t, d.name()), "the newest given back")
	assert.Nil(t, read(t, d.aside()))
	assert.Empty(t, temps(t, d))
}

// bindfs mounts a new directory through bindfs and returns the mount.
func bindfs(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bindfs"); err != nil {
		t.Fatalf("this test needs bindfs, a FUSE filesystem without RENAME_EXCHANGE (apt-get install bindfs): %v", err)
	}
	src, mnt := t.TempDir(), t.TempDir()
	out, err := exec.Command("bindfs", src, mnt).CombinedOutput()
	require.NoError(t, err, "bindfs: %s", out)
	t.Cleanup(func() { _ = exec.Command("fusermount", "-u", mnt).Run() })
	return mnt
}

// whereabouts' installer still writing the file at the name (GNU cp -f, in
// place, in two halves) when an exchange moves it out to a temporary name:
// it is kept, not deleted for failing a probe, and becomes the aside once
// its writer is done.
func TestAWriterStillWritingWhenTakenIsKept(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	d := newDir(t, v093)
	_, err := d.Take(ctx, true)
	require.NoError(t, err)
	// The name is written by cp again, and taken again while cp writes:
	// the first half is in when the exchange comes.
	require.NoError(t, os.WriteFile(d.name(), v093, 0o755))
	var w *os.File
	d.AtStep = func(step string) {
		if step == StepChecked && w == nil {
			var err error
			w, err = os.OpenFile(d.name(), os.O_WRONLY|os.O_TRUNC, 0)
			require.NoError(t, err)
			_, err = w.Write(v094[:len(v094)/2])
			require.NoError(t, err)
		}
	}
	changed, err := d.Take(ctx, false)
	assert.True(t, changed)
	require.ErrorIs(t, err, ErrPending, "what the exchange moved out is still being written")
	require.NotNil(t, w)
	assert.Equal(t, read(t, d.Self), read(t, d.name()), "harvester-ipam at the name meanwhile")
	assert.Equal(t, v093, read(t, d.aside()), "the old version still aside meanwhile")
	require.Len(t, temps(t, d), 1, "the file being written is kept")

	_, err = d.Take(ctx, false)
	require.ErrorIs(t, err, ErrPending, "still being written: nothing decided")
	_, err = w.Write(v094[len(v094)/2:])
	require.NoError(t, err)
	require.NoError(t, w.Close())

	_, err = d.Take(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, v094, read(t, d.aside()), "the new version aside once written")
	assert.Equal(t, read(t, d.Self), read(t, d.name()))
	assert.Empty(t, temps(t, d))
}

// A kill between the exchange and the aside on a first Take leaves the only
// real binary at a temporary name. A recovery whose probe has no answer (the
// timeout on a loaded node, a cancelled context) keeps it; the next one
// makes it the aside.
func TestRecoveryWithoutAnAnswerKeepsTheOnlyRealBinary(t *testing.T) {
	ctx := bounded(t)
	v093 := realBinary("v0.9.3")
	d := newDir(t, v093)
	killedAt(t, d, "take", StepExchanged)
	require.Len(t, temps(t, d), 1)
	require.Equal(t, v093, read(t, temps(t, d)[0]), "the only real binary, at a temporary name")

	for _, noAnswer := range []error{context.DeadlineExceeded, context.Canceled} {
		slow := d
		slow.Probe = func(context.Context, string) error { return noAnswer }
		_, err := slow.Take(ctx, false)
		require.ErrorIs(t, err, ErrPending)
		require.Len(t, temps(t, d), 1, "kept (%v)", noAnswer)
		assert.Equal(t, v093, read(t, temps(t, d)[0]))
		assert.Equal(t, read(t, d.Self), read(t, d.name()))
		// Giving back (an uninstall) waits for an answer, and keeps the file
		// when its time is up.
		require.ErrorIs(t, slow.GiveBack(canceled()), ErrPending)
		require.Len(t, temps(t, d), 1, "kept by giving back (%v)", noAnswer)
	}
	_, err := d.Take(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, v093, read(t, d.aside()))
	assert.Empty(t, temps(t, d))
}

// A fragment at the name (whereabouts' cp -f killed mid-write, a full disk)
// gets harvester-ipam back, the good aside kept; giving back never replaces
// a runnable aside by a file that does not run.
func TestAHalfWrittenNameIsRepaired(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	fragment := v094[:len(v094)/3]
	for _, op := range []string{"take", "give back"} {
		t.Run(op, func(t *testing.T) {
			d := newDir(t, v093)
			_, err := d.Take(ctx, true)
			require.NoError(t, err)
			require.NoError(t, os.Remove(d.name())) // busybox cp -f: a new file at the name
			require.NoError(t, os.WriteFile(d.name(), fragment, 0o755))
			require.Error(t, probeVersion(ctx, d.name()), "a fragment does not run")
			if op == "take" {
				changed, err := d.Take(ctx, false)
				require.NoError(t, err)
				assert.True(t, changed)
				assert.Equal(t, read(t, d.Self), read(t, d.name()), "harvester-ipam at the name again")
			} else {
				require.NoError(t, d.GiveBack(ctx))
				assert.Nil(t, read(t, d.aside()))
			}
			want := map[string][]byte{"take": read(t, d.Self), "give back": v093}[op]
			assert.Equal(t, want, read(t, d.name()))
			if op == "take" {
				assert.Equal(t, v093, read(t, d.aside()), "the good aside kept")
			}
			assert.Empty(t, temps(t, d), "the fragment is gone")
		})
	}
}

// The name missing and the real binary aside (removed by hand, or between
// busybox cp's unlink and create): harvester-ipam is put back, without an
// error.
func TestTheNameMissingIsFilled(t *testing.T) {
	ctx := bounded(t)
	v093 := realBinary("v0.9.3")
	d := newDir(t, v093)
	_, err := d.Take(ctx, true)
	require.NoError(t, err)
	require.NoError(t, os.Remove(d.name()))
	changed, err := d.Take(ctx, false)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, read(t, d.Self), read(t, d.name()))
	assert.Equal(t, v093, read(t, d.aside()))
	assert.Empty(t, temps(t, d))
}

// killedAt runs op on d in a child that is killed at step.
func killedAt(t *testing.T, d Dir, op, step string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%s:%s:%s", crashEnv, op, step, d.Path, d.Self))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child must be killed at %s: %s", step, out)
	require.Equal(t, "signal: killed", exit.Error())
}

// bounded is a test's context: a step that would wait for ever (a writer
// that never finishes, a bug that makes every file look changed) fails the
// test after five minutes (a loaded machine's whole test) instead of
// hanging it until the test binary's own timeout.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func ino(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := OS{}.Stat(path)
	require.NoError(t, err)
	return st.Ino
}

// cpF writes b over path as GNU cp -f does (into the file, truncated), and
// dates it at: a clock that was somewhere else when it wrote.
func cpF(t *testing.T, path string, b []byte, at time.Time) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o755)
	require.NoError(t, err)
	_, err = f.Write(b)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Chtimes(path, at, at))
}

// busyboxCP writes b at path as busybox cp -f does (the old file unlinked, a
// new one written), dated at.
func busyboxCP(t *testing.T, path string, b []byte, at time.Time) {
	t.Helper()
	require.NoError(t, os.Remove(path))
	cpF(t, path, b, at)
}

// Which real binary is the newer is what whereabouts' installer wrote last,
// never the files' times: whereabouts.real written while the node's clock
// was an hour ahead (NTP then stepped it back), and v0.9.4 written after it
// at an earlier time, is still the newer: aside when standing in, at the
// name when given back.
func TestNoClockOrdersTheRealBinaries(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	ahead, now := time.Now().Add(time.Hour), time.Now()
	for _, cp := range []struct {
		name  string
		write func(t *testing.T, path string, b []byte, at time.Time)
	}{{"GNU cp -f", cpF}, {"busybox cp -f", busyboxCP}} {
		t.Run(cp.name, func(t *testing.T) {
			d := newDir(t, v093)
			_, err := d.Take(ctx, true)
			require.NoError(t, err)
			require.NoError(t, os.Chtimes(d.aside(), ahead, ahead))
			cp.write(t, d.name(), v094, now)
			_, err = d.Take(ctx, false)
			require.NoError(t, err)
			holds(t, "harvester-ipam", d.name(), "standing in")
			holds(t, "whereabouts v0.9.4", d.aside(), "v0.9.4, written last, aside")

			// Given back while whereabouts writes its binary again, dated
			// earlier still: the last write is what the name holds.
			require.NoError(t, os.Chtimes(d.aside(), ahead, ahead))
			cp.write(t, d.name(), v093, now.Add(-time.Hour))
			require.NoError(t, d.GiveBack(ctx))
			holds(t, "whereabouts v0.9.3", d.name(), "v0.9.3, written last (a downgrade), at the name")
			holds(t, "missing", d.aside(), "given back")
			assert.Empty(t, temps(t, d))
		})
	}
}

// whatIs names a binary of these tests by its bytes, for a message.
func whatIs(t *testing.T, b []byte) string {
	switch {
	case b == nil:
		return "missing"
	case bytes.Equal(b, read(t, harvesterIPAM(t))):
		return "harvester-ipam"
	}
	for _, v := range []string{"v0.9.3", "v0.9.4"} {
		if bytes.Equal(b, realBinary(v)) {
			return "whereabouts " + v
		}
	}
	return fmt.Sprintf("%d other bytes", len(b))
}

// holds asserts what the file at path is, by name.
func holds(t *testing.T, want, path, msg string) {
	t.Helper()
	assert.Equal(t, want, whatIs(t, read(t, path)), "%s: %s", path, msg)
}

func stat(t *testing.T, path string) File {
	t.Helper()
	f, err := OS{}.Stat(path)
	require.NoError(t, err)
	return f
}

// hookFS is the operating system's filesystem with a hook after each Stat,
// given the path and how many times it was stat'ed: a writer acting at one
// exact point of a step.
type hookFS struct {
	OS
	stats     map[string]int
	afterStat func(path string, n int)
}

func (h *hookFS) Stat(path string) (File, error) {
	f, err := h.OS.Stat(path)
	if h.stats == nil {
		h.stats = map[string]int{}
	}
	h.stats[path]++
	if h.afterStat != nil {
		h.afterStat(path, h.stats[path])
	}
	return f, err
}

// Without the exchange, the real binary at the name is linked aside as it
// was looked at; a name replaced since gets no capture (the link would be
// of the new file, and the aside would share the name's inode, which
// whereabouts' next cp -f writes into).
func TestACaptureIsOfTheFileLookedAt(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	d := newDir(t, v093)
	n, err := d.look(ctx, d.name())
	require.NoError(t, err)
	require.Equal(t, runs, n.kind)
	busyboxCP(t, d.name(), v094, time.Now())
	err = d.capture(n)
	require.ErrorIs(t, err, ErrPending)
	assert.Empty(t, temps(t, d), "no capture of the file written since")
	holds(t, "whereabouts v0.9.4", d.name(), "the new binary untouched")

	// The name as it was looked at: captured, one file under two names.
	n, err = d.look(ctx, d.name())
	require.NoError(t, err)
	require.NoError(t, d.capture(n))
	c := stat(t, filepath.Join(d.Path, captureName))
	assert.True(t, c.Same(stat(t, d.name())))
}
