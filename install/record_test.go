package install

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/install/standin"
)

// build is a fake harvester-ipam of one build: it carries the mark, and
// build in its bytes.
func build(t *testing.T, build string) string {
	return script(t, t.TempDir(), "harvester-ipam", strings.ReplaceAll(fakePlugin, "@V@", build)+"# "+standin.Mark+"\n")
}

// node is a bin dir with whereabouts installed by its own DaemonSet.
func node(t *testing.T) string {
	dir := t.TempDir()
	script(t, dir, "whereabouts", fakeReal)
	return dir
}

func contents(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "missing"
	}
	require.NoError(t, err)
	switch s := string(b); {
	case s == fakeReal:
		return "whereabouts"
	case strings.Contains(s, standin.Mark):
		_, rest, _ := strings.Cut(s, `echo "harvester-ipam `)
		v, _, _ := strings.Cut(rest, ":")
		return "harvester-ipam " + v
	default:
		return fmt.Sprintf("%d other bytes", len(b))
	}
}

// The record is written whole, read back, listed, and removed with what a
// kill left of its temporary file; one that is not a record reads as none.
func TestRecord(t *testing.T) {
	dir := t.TempDir()
	_, ok, err := ReadRecord(dir, "whereabouts")
	require.NoError(t, err)
	assert.False(t, ok)
	rec := Record{Name: "whereabouts", Release: "kube-system/harvester-ipam", Pod: "harvester-ipam-x1", HostDir: "/opt/cni/bin"}
	require.NoError(t, writeRecord(dir, rec))
	got, ok, err := ReadRecord(dir, "whereabouts")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, rec, got)
	b, err := os.ReadFile(recordPath(dir, "whereabouts"))
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(b), "\n"), "one line, as cat shows it: %q", b)
	assert.True(t, strings.HasSuffix(string(b), "}\n"))
	require.NoError(t, writeRecord(dir, Record{Name: "other", Release: ByHand, Pod: "pid 1"}))
	require.NoError(t, os.WriteFile(filepath.Join(dir, recordPrefix+"whereabouts.tmp-123"), []byte("{"), 0o644)) // a kill
	all, err := Records(dir)
	require.NoError(t, err)
	assert.Len(t, all, 2)

	for _, bad := range []string{"{", `{"name":"elsewhere","release":"x"}`, `{"name":"whereabouts"}`} {
		require.NoError(t, os.WriteFile(recordPath(dir, "whereabouts"), []byte(bad), 0o644))
		_, ok, err := ReadRecord(dir, "whereabouts")
		require.NoError(t, err)
		assert.False(t, ok, "%s is no record", bad)
	}
	require.NoError(t, removeRecord(dir, "whereabouts"))
	assert.Equal(t, []string{recordPrefix + "other"}, entries(t, dir), "the record and its leftover gone, the other kept")
}

// A release is alive on the node while a process holds its lock; it is not
// once they have all let go of it, however they ended.
func TestAlive(t *testing.T) {
	dir := t.TempDir()
	alive, err := IsAlive(dir, "kube-system/a")
	require.NoError(t, err)
	assert.False(t, alive, "no lock file")
	unlock, err := HoldAlive(dir, "kube-system/a")
	require.NoError(t, err)
	unlock2, err := HoldAlive(dir, "kube-system/a") // a second pod of it (a rollout with surge)
	require.NoError(t, err)
	for range 2 {
		alive, err = IsAlive(dir, "kube-system/a")
		require.NoError(t, err)
		assert.True(t, alive)
	}
	alive, err = IsAlive(dir, "kube-system/b")
	require.NoError(t, err)
	assert.False(t, alive, "another release")
	unlock()
	alive, _ = IsAlive(dir, "kube-system/a")
	assert.True(t, alive, "one pod still runs")
	unlock2()
	alive, _ = IsAlive(dir, "kube-system/a")
	assert.False(t, alive, "none runs")

	// Held whether or not the caller keeps what it was given: the garbage
	// collector lets go of nothing.
	_, err = HoldAlive(dir, "kube-system/d")
	require.NoError(t, err)
	for range 3 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	alive, _ = IsAlive(dir, "kube-system/d")
	assert.True(t, alive, "still held after the garbage collector ran")

	// The binaries the installer runs (its probes) do not hold it with it.
	unlock, err = HoldAlive(dir, "kube-system/e")
	require.NoError(t, err)
	child := exec.Command("sleep", "30")
	require.NoError(t, child.Start())
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	unlock()
	alive, _ = IsAlive(dir, "kube-system/e")
	assert.False(t, alive, "let go of, though a child it started still runs")

	// A process that holds it and is killed lets go of it.
	cmd := exec.Command("flock", "-s", "-o", alivePath(dir, "kube-system/c"), "sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	require.Eventually(t, func() bool { a, _ := IsAlive(dir, "kube-system/c"); return a }, 10*time.Second, 10*time.Millisecond)
	// flock's child holds a copy of the lock's descriptor from its fork
	// until it closes it (-o) and execs sleep: the group is killed, and
	// the lock goes with the last of them (it failed one run in three when
	// flock alone was killed and the lock read at once).
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
	_ = cmd.Wait()
	require.Eventually(t, func() bool { a, _ := IsAlive(dir, "kube-system/c"); return !a }, 10*time.Second, 10*time.Millisecond, "killed")
	removeDeadAlive(dir)
	_, err = os.Stat(alivePath(dir, "kube-system/c"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a lock file no one holds is removed by hand")
}

var (
	releaseA = Identity{Namespace: "kube-system", DaemonSet: "harvester-ipam", Pod: "harvester-ipam-a1"}
	releaseB = Identity{Namespace: "addons", DaemonSet: "other-harvester-ipam", Pod: "other-harvester-ipam-b1"}
)

// Two releases on one node: the first to stand in keeps the name while an
// installer of it runs there; the other takes nothing, says so, is ready,
// and takes the name over once the first has no installer on the node.
func TestTwoReleasesDoNotFight(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	a := Options{Source: build(t, "a"), BinDir: dir}
	b := Options{Source: build(t, "b"), BinDir: dir}
	for _, o := range []Options{a, b} {
		_, err := Install(ctx, o)
		require.NoError(t, err)
	}
	name := filepath.Join(dir, "whereabouts")
	unlockA, err := HoldAlive(dir, releaseA.Release())
	require.NoError(t, err)
	st, err := StandInAs(ctx, a, "whereabouts", releaseA, "/opt/cni/bin", true)
	require.NoError(t, err)
	assert.Equal(t, Holder, st.Role)
	assert.True(t, st.Changed)
	assert.Equal(t, "harvester-ipam a", contents(t, name))

	_, err = HoldAlive(dir, releaseB.Release())
	require.NoError(t, err)
	for _, start := range []bool{true, false, false} {
		ino := inode(t, name)
		st, err = StandInAs(ctx, b, "whereabouts", releaseB, "/opt/cni/bin", start)
		require.NoError(t, err)
		assert.Equal(t, Lost, st.Role)
		assert.False(t, st.Changed)
		assert.Contains(t, st.Why, "release kube-system/harvester-ipam (pod harvester-ipam-a1) stands in for whereabouts in "+dir+"; this release (addons/other-harvester-ipam) does not fight it")
		assert.Equal(t, ino, inode(t, name), "the very same file at the name")
		says, err := VerifyStandInAs(ctx, b, "whereabouts", releaseB)
		require.NoError(t, err, "the other release is ready: a rollout and helm --wait end")
		assert.Contains(t, says, "release kube-system/harvester-ipam (pod harvester-ipam-a1) stands in for whereabouts at "+name)
		st, err = StandInAs(ctx, a, "whereabouts", releaseA, "/opt/cni/bin", false)
		require.NoError(t, err)
		assert.Equal(t, Holder, st.Role)
		assert.False(t, st.Changed, "the holder has nothing to undo")
	}
	says, err := VerifyStandInAs(ctx, a, "whereabouts", releaseA)
	require.NoError(t, err)
	assert.Contains(t, says, "harvester-ipam stands in at "+name)
	// An operator's --verify (kubectl exec, no release of its own) checks
	// the stand-in as it is, and names the release that holds it.
	says, err = VerifyStandInAs(ctx, a, "whereabouts", Identity{Pod: "1234"})
	require.NoError(t, err)
	assert.Contains(t, says, "harvester-ipam stands in at "+name)
	assert.Contains(t, says, "; release kube-system/harvester-ipam holds it (pod harvester-ipam-a1)")
	assert.NotContains(t, says, "does not fight")

	// The other release stops: it gives back nothing, its name or not; when
	// it leaves the node (an uninstall), its lock file goes.
	gave, why, err := StopAs(ctx, b, "whereabouts", releaseB, func(context.Context) (bool, string) { return false, "a restart" })
	require.NoError(t, err)
	assert.False(t, gave)
	assert.Contains(t, why, "release kube-system/harvester-ipam holds whereabouts, not this one")
	assert.FileExists(t, alivePath(dir, releaseB.Release()))
	gave, why, err = StopAs(ctx, b, "whereabouts", releaseB, func(context.Context) (bool, string) { return true, "uninstalled" })
	require.NoError(t, err)
	assert.False(t, gave)
	assert.Contains(t, why, "uninstalled; release kube-system/harvester-ipam holds whereabouts, not this one")
	assert.NoFileExists(t, alivePath(dir, releaseB.Release()))
	assert.Equal(t, "harvester-ipam a", contents(t, name))

	// The first release's installers are gone from the node without giving
	// the name back: the other takes it over.
	unlockA()
	st, err = StandInAs(ctx, b, "whereabouts", releaseB, "/opt/cni/bin", false)
	require.NoError(t, err)
	assert.Equal(t, Holder, st.Role)
	assert.Contains(t, st.Why, "release kube-system/harvester-ipam, which stood in for whereabouts, has no installer on this node any more: addons/other-harvester-ipam takes the name over")
	assert.Equal(t, "harvester-ipam b", contents(t, name))
	assert.Equal(t, "whereabouts", contents(t, filepath.Join(dir, "whereabouts.real")))
}

// Two pods of one release (a restart, a rollout, two builds): the pod that
// starts takes the name over, the one before leaves it; and a new pod's
// first Take that has to wait does not leave its later Takes facing the
// old build as "another build".
func TestAPodTakesOverFromTheOneBefore(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	old, new := Options{Source: build(t, "old"), BinDir: dir}, Options{Source: build(t, "new"), BinDir: dir}
	p1, p2 := releaseA, releaseA
	p2.Pod = "harvester-ipam-a2"
	name, aside := filepath.Join(dir, "whereabouts"), filepath.Join(dir, "whereabouts.real")
	st, err := StandInAs(ctx, old, "whereabouts", p1, "", true)
	require.NoError(t, err)
	require.Equal(t, Holder, st.Role)
	require.Equal(t, "harvester-ipam old", contents(t, name))

	// The new pod's first Take waits: the real binary aside is still being
	// written (a writer has it open).
	w, err := os.OpenFile(aside, os.O_WRONLY, 0)
	require.NoError(t, err)
	st, err = StandInAs(ctx, new, "whereabouts", p2, "", true)
	require.ErrorIs(t, err, standin.ErrPending)
	assert.Equal(t, Holder, st.Role)
	require.NoError(t, w.Close())
	st, err = StandInAs(ctx, old, "whereabouts", p1, "", false)
	require.NoError(t, err)
	assert.Equal(t, Superseded, st.Role, "the pod before leaves it")
	assert.Contains(t, st.Why, "pod harvester-ipam-a2 of this release (kube-system/harvester-ipam) holds whereabouts now")
	assert.Equal(t, "harvester-ipam old", contents(t, name), "untouched")
	st, err = StandInAs(ctx, new, "whereabouts", p2, "", false)
	require.NoError(t, err, "the new pod's later Take replaces the old build")
	assert.Equal(t, Holder, st.Role)
	assert.Equal(t, "harvester-ipam new", contents(t, name))
	assert.Equal(t, "whereabouts", contents(t, aside))

	// Restarted (the same pod): it still holds it.
	st, err = StandInAs(ctx, new, "whereabouts", p2, "", true)
	require.NoError(t, err)
	assert.Equal(t, Holder, st.Role)
	assert.False(t, st.Changed)
}

// A pod of a revision that no longer stands in for a name (the stand-in
// turned off, or moved to another name) gives back what an earlier pod of
// its release took, and only that.
func TestALaterRevisionGivesBackWhatItNoLongerStandsInFor(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	script(t, dir, "other", fakeReal)
	o := Options{Source: build(t, "a"), BinDir: dir}
	_, err := HoldAlive(dir, releaseA.Release())
	require.NoError(t, err)
	for _, n := range []string{"whereabouts", "other"} {
		_, err := StandInAs(ctx, o, n, releaseA, "", true)
		require.NoError(t, err)
	}
	byHand := Identity{Pod: "pid 1"}
	given, err := GiveBackReleased(ctx, o, byHand, "", "")
	require.NoError(t, err)
	assert.Empty(t, given, "a run by hand gives back nothing this way")
	given, err = GiveBackReleased(ctx, o, releaseB, "", "")
	require.NoError(t, err)
	assert.Empty(t, given, "another release gives back nothing")

	later := releaseA
	later.Pod = "harvester-ipam-a2"
	given, err = GiveBackReleased(ctx, o, later, "whereabouts", "")
	require.NoError(t, err)
	assert.Equal(t, []string{"other"}, given, "moved to another name: the old one goes back")
	assert.Equal(t, "whereabouts", contents(t, filepath.Join(dir, "other")))
	assert.Equal(t, "harvester-ipam a", contents(t, filepath.Join(dir, "whereabouts")))

	given, err = GiveBackReleased(ctx, o, later, "", "")
	require.NoError(t, err)
	assert.Equal(t, []string{"whereabouts"}, given, "turned off")
	assert.Equal(t, "whereabouts", contents(t, filepath.Join(dir, "whereabouts")))
	assert.Equal(t, []string{"other", "whereabouts"}, entries(t, dir), "no aside, no record, no lock file left")
}

// Turned off in the upgrade from a release before the records: its pods
// keep the name as they stop (they cannot tell), and the new revision's
// give back harvester-ipam they find there with no record at all, never a
// name another release recorded.
func TestTurnedOffInTheUpgradeFromAReleaseBeforeTheRecords(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	old := Options{Source: build(t, "before the records"), BinDir: dir}
	_, err := StandIn(ctx, old, "whereabouts", true) // what that release did: no record
	require.NoError(t, err)
	require.NoError(t, removeRecord(dir, "whereabouts"))
	o := Options{Source: build(t, "a"), BinDir: dir}
	given, err := GiveBackReleased(ctx, o, releaseA, "", "")
	require.NoError(t, err)
	assert.Empty(t, given, "not told which name it no longer stands in for")
	assert.Equal(t, "harvester-ipam before the records", contents(t, filepath.Join(dir, "whereabouts")))

	// Another release recorded it: not this one's to give back.
	require.NoError(t, writeRecord(dir, Record{Name: "whereabouts", Release: releaseB.Release(), Pod: releaseB.Pod}))
	given, err = GiveBackReleased(ctx, o, releaseA, "", "whereabouts")
	require.NoError(t, err)
	assert.Empty(t, given)
	assert.Equal(t, "harvester-ipam before the records", contents(t, filepath.Join(dir, "whereabouts")))

	require.NoError(t, removeRecord(dir, "whereabouts"))
	given, err = GiveBackReleased(ctx, o, releaseA, "", "whereabouts")
	require.NoError(t, err)
	assert.Equal(t, []string{"whereabouts"}, given)
	assert.Equal(t, "whereabouts", contents(t, filepath.Join(dir, "whereabouts")))
	assert.Equal(t, []string{"whereabouts"}, entries(t, dir), "nothing else left")

	// Nothing of harvester-ipam there: nothing given back, nothing said.
	given, err = GiveBackReleased(ctx, o, releaseA, "", "whereabouts")
	require.NoError(t, err)
	assert.Empty(t, given)
}

// A stop gives the name back only when its release holds it and the chart
// says so; then nothing of the stand-in is left. A stop that may not give
// back leaves the dir as it was.
func TestStopAs(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		removing bool
		giveBack bool
	}{{"restart", false, false}, {"uninstall", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := node(t)
			o := Options{Source: build(t, "a"), BinDir: dir}
			_, err := Install(ctx, o)
			require.NoError(t, err)
			_, err = HoldAlive(dir, releaseA.Release())
			require.NoError(t, err)
			_, err = StandInAs(ctx, o, "whereabouts", releaseA, "", true)
			require.NoError(t, err)
			before := entries(t, dir)
			gave, why, err := StopAs(ctx, o, "whereabouts", releaseA, func(context.Context) (bool, string) { return tt.removing, "the chart says so" })
			require.NoError(t, err)
			assert.Equal(t, tt.giveBack, gave)
			assert.Equal(t, "the chart says so", why)
			if !tt.giveBack {
				assert.Equal(t, before, entries(t, dir))
				return
			}
			assert.Equal(t, "whereabouts", contents(t, filepath.Join(dir, "whereabouts")))
			assert.Equal(t, []string{"harvester-ipam", "whereabouts"}, entries(t, dir), "no aside, no record, no lock file left")
		})
	}
	// Nothing was stood in for (no whereabouts on the node): nothing to give
	// back, and the record goes.
	dir := t.TempDir()
	o := Options{Source: build(t, "a"), BinDir: dir}
	_, err := StandInAs(ctx, o, "whereabouts", releaseA, "", true)
	require.ErrorIs(t, err, standin.ErrNoReal)
	gave, _, err := StopAs(ctx, o, "whereabouts", releaseA, func(context.Context) (bool, string) { return true, "uninstalled" })
	require.NoError(t, err)
	assert.True(t, gave)
	assert.Empty(t, entries(t, dir))
}

// By hand, the name goes back whoever took it, with its record and the lock
// files no installer holds.
func TestGiveBackByHandForgetsTheRecord(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	o := Options{Source: build(t, "a"), BinDir: dir}
	unlock, err := HoldAlive(dir, releaseA.Release())
	require.NoError(t, err)
	_, err = StandInAs(ctx, o, "whereabouts", releaseA, "", true)
	require.NoError(t, err)
	unlock()
	require.NoError(t, GiveBack(ctx, o, "whereabouts"))
	assert.Equal(t, []string{"whereabouts"}, entries(t, dir))
}

// The watcher that cannot start (inotify exhausted) is said once, tried
// again every interval, and never stops the installer.
func TestKeepWatchingWhenInotifyIsExhausted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var tries atomic.Int32
	var warnings []error
	done := make(chan struct{})
	go func() {
		KeepWatching(ctx, 10*time.Millisecond, func(ctx context.Context) error {
			if tries.Add(1) <= 3 {
				return fmt.Errorf("inotify: %w", syscall.EMFILE)
			}
			<-ctx.Done() // watching at last
			return nil
		}, func(err error) { warnings = append(warnings, err) })
		close(done)
	}()
	require.Eventually(t, func() bool { return tries.Load() == 4 }, 10*time.Second, 5*time.Millisecond, "tried again every interval")
	cancel()
	<-done
	require.Len(t, warnings, 1, "said once")
	assert.ErrorIs(t, warnings[0], syscall.EMFILE)
}

// Two releases of two builds on one node: the one that stands in owns
// harvester-ipam under its own name too. The other leaves that file alone
// (rewriting it every interval in turn with the first, each pod's probe
// would pass only after its own write: readiness flaps, rollouts and helm
// --wait stall) and its readiness accepts the holder's build there, as long
// as it runs. Once the holder has no installer on the node, the other
// installs its own.
func TestTwoReleasesShareTheOwnName(t *testing.T) {
	ctx := context.Background()
	dir := node(t)
	a := Options{Source: build(t, "a"), BinDir: dir}
	b := Options{Source: build(t, "b"), BinDir: dir}
	own := filepath.Join(dir, "harvester-ipam")
	unlockA, err := HoldAlive(dir, releaseA.Release())
	require.NoError(t, err)
	_, why, err := InstallAs(ctx, a, "whereabouts", releaseA)
	require.NoError(t, err)
	assert.Empty(t, why)
	_, err = StandInAs(ctx, a, "whereabouts", releaseA, "/opt/cni/bin", true)
	require.NoError(t, err)
	require.Equal(t, "harvester-ipam a", contents(t, own))

	ino := inode(t, own)
	res, why, err := InstallAs(ctx, b, "whereabouts", releaseB)
	require.NoError(t, err)
	assert.False(t, res.Changed)
	assert.Contains(t, why, "release kube-system/harvester-ipam (pod harvester-ipam-a1) stands in for whereabouts here")
	assert.Equal(t, ino, inode(t, own), "the other release leaves harvester-ipam's own name as it is")
	res, err = VerifyAs(ctx, b, "whereabouts", releaseB)
	require.NoError(t, err, "the other release is ready with the holder's build at the own name")
	assert.Contains(t, res.About, "harvester-ipam a")
	_, err = VerifyAs(ctx, b, "", releaseB)
	require.Error(t, err, "without a stand-in, the own name is this image's or not ready")

	unlockA()
	res, why, err = InstallAs(ctx, b, "whereabouts", releaseB)
	require.NoError(t, err)
	assert.Empty(t, why)
	assert.True(t, res.Changed, "the holder gone from the node: this release installs its own")
	assert.Equal(t, "harvester-ipam b", contents(t, own))
}
