package standin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// watching runs Watch on dir for name and counts its calls.
func watching(t *testing.T, dir, name string, changed func()) *atomic.Int64 {
	t.Helper()
	var calls atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, dir, name, func() {
			calls.Add(1)
			if changed != nil {
				changed()
			}
		})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	time.Sleep(50 * time.Millisecond) // the watch is in place
	return &calls
}

// eventually waits for cond, as long as a loaded machine may need.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), msg)
	}
}

// What whereabouts' install step does to the name is seen, however it
// writes: GNU cp -f into the same inode (only its close tells), busybox cp -f
// a new file, a rename over it, a removal; so is a writer closing a file an
// exchange moved to a temporary name, and the aside changing.
func TestWatchSeesEveryWrite(t *testing.T) {
	tests := []struct {
		name  string
		setup func(dir string) // before the watch
		write func(t *testing.T, dir string)
	}{
		{"in place (GNU cp -f)", func(dir string) { mustWrite(dir, "whereabouts", "old") }, func(t *testing.T, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, "whereabouts"), os.O_WRONLY|os.O_TRUNC, 0)
			require.NoError(t, err)
			_, err = f.WriteString("new")
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"a new file (busybox cp -f)", func(dir string) { mustWrite(dir, "whereabouts", "old") }, func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "whereabouts")))
			mustWrite(dir, "whereabouts", "new")
		}},
		{"renamed over", func(dir string) { mustWrite(dir, "whereabouts", "old"); mustWrite(dir, "x", "new") }, func(t *testing.T, dir string) {
			require.NoError(t, os.Rename(filepath.Join(dir, "x"), filepath.Join(dir, "whereabouts")))
		}},
		{"a temporary file closed by its writer", func(dir string) { mustWrite(dir, tempPrefix+"abc", "half") }, func(t *testing.T, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, tempPrefix+"abc"), os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.WriteString(" and the rest")
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"the aside", func(string) {}, func(t *testing.T, dir string) { mustWrite(dir, "whereabouts.real", "real") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(dir)
			calls := watching(t, dir, "whereabouts", nil)
			mustWrite(dir, "bridge", "another plugin")
			time.Sleep(100 * time.Millisecond)
			require.Zero(t, calls.Load(), "another plugin's file is not watched")
			tt.write(t, dir)
			eventually(t, func() bool { return calls.Load() > 0 }, "the write is seen")
		})
	}
}

// A Take that finds nothing to change writes nothing: Take called on every
// event, standing in once, ends with the events of that one Take.
func TestTakesDoNotFeedTheWatcher(t *testing.T) {
	ctx := context.Background()
	d := newDir(t, realBinary("v0.9.3"))
	var changes atomic.Int64
	var mu sync.Mutex // as the installers' lock serialises them
	calls := watching(t, d.Path, d.Name, func() {
		mu.Lock()
		defer mu.Unlock()
		if changed, err := d.Take(ctx, false); err == nil && changed {
			changes.Add(1)
		}
	})
	mu.Lock()
	changed, err := d.Take(ctx, true)
	mu.Unlock()
	require.NoError(t, err)
	require.True(t, changed)
	eventually(t, func() bool { return calls.Load() > 0 }, "the Take's own writes are seen")
	time.Sleep(time.Second)
	settled := calls.Load()
	time.Sleep(2 * time.Second)
	assert.Equal(t, settled, calls.Load(), "no more events once nothing changes")
	assert.Zero(t, changes.Load(), "no Take after the first wrote anything")
}

func mustWrite(dir, name, content string) {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o755); err != nil {
		panic(err)
	}
}

// A watcher stopped lets go of its inotify instance: the installer starts one
// at each start, and a stopped one must not keep a descriptor, a watch on the
// bin dir and a goroutine blocked in read until the next event.
func TestWatchLetsGoWhenStopped(t *testing.T) {
	before := inotifyFDs(t)
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Watch(ctx, t.TempDir(), "whereabouts", func() {}) }()
		time.Sleep(20 * time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}
	assert.Equal(t, before, inotifyFDs(t), "inotify descriptors open before and after three watchers")
}

func inotifyFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range es {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// The watcher's descriptor stays in the installer: the binaries it probes
// (whatever is in the bin dir) do not inherit it.
func TestWatchIsNotInherited(t *testing.T) {
	watching(t, t.TempDir(), "whereabouts", nil)
	out, err := exec.Command("/bin/sh", "-c", "ls -l /proc/$$/fd").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, string(out), "inotify", "a child's descriptors")
}

// mentions reads inotify's records: a name padded with NULs to its length,
// several records in one read, a queue overflow (events lost: look anyway).
func TestMentions(t *testing.T) {
	record := func(mask uint32, name string) []byte {
		n := (len(name) + 1 + 15) / 16 * 16 // NUL-terminated, padded
		b := make([]byte, unix.SizeofInotifyEvent+n)
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		ev.Mask, ev.Len = mask, uint32(n)
		copy(b[unix.SizeofInotifyEvent:], name)
		return b
	}
	watched := func(n string) bool { return n == "whereabouts" }
	for _, tt := range []struct {
		name string
		buf  []byte
		want bool
	}{
		{"the name", record(unix.IN_CLOSE_WRITE, "whereabouts"), true},
		{"another file", record(unix.IN_CLOSE_WRITE, "bridge"), false},
		{"a longer name that starts alike", record(unix.IN_CLOSE_WRITE, "whereabouts\x01"), false},
		{"the name second in one read", append(record(unix.IN_CREATE, "bridge"), record(unix.IN_MOVED_TO, "whereabouts")...), true},
		{"events lost", record(unix.IN_Q_OVERFLOW, ""), true},
		{"a record cut short", record(unix.IN_CLOSE_WRITE, "whereabouts")[:unix.SizeofInotifyEvent+4], false},
	} {
		assert.Equal(t, tt.want, mentions(tt.buf, watched), tt.name)
	}
}
