package client

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// The agent's process as the kernel's scheduler sees it: what tells an
// agent that is busy, or waiting for a CPU on a node busy with everything
// else, from one that is wedged, without a timer that a busy node trips.
// A healthy agent that has a request waiting on its socket is never idle:
// the kernel wakes its poller at once, and from then on one of its threads
// runs or waits for a CPU (state R) until the request is read. An agent
// none of whose threads is running, runnable or in uninterruptible sleep
// (R, D), and which hardly ran, while a request waits is not reading it.
// (A thread's time waiting for a CPU is added to its schedstat only once it
// runs: a starved thread is told by its state, not by its counters.)

// Sample is what the kernel says of the agent's process at one moment.
type Sample struct {
	// Gone: the process is no more.
	Gone bool
	// Stopped: stopped or traced (SIGSTOP, a debugger): it runs nothing
	// until it is continued.
	Stopped bool
	// Running: one of its threads runs, waits for a CPU, or waits in the
	// kernel (a disk, a page fault).
	Running bool
	// CPU is the time its threads have run, in all.
	CPU time.Duration
}

// Watcher samples the agent's process.
type Watcher interface {
	Sample() (Sample, error)
}

// WatchProc watches the process pid in /proc: the state of each of its
// threads and the time each ran.
func WatchProc(pid int) Watcher { return procWatcher{dir: "/proc/" + strconv.Itoa(pid) + "/task"} }

type procWatcher struct{ dir string }

// clockTick is the unit of /proc's times (USER_HZ, 100 on every Linux).
const clockTick = 10 * time.Millisecond

func (w procWatcher) Sample() (Sample, error) {
	tasks, err := os.ReadDir(w.dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return Sample{Gone: true}, nil
	}
	if err != nil {
		return Sample{}, fmt.Errorf("read %s: %w", w.dir, err)
	}
	var s Sample
	live, stopped := 0, 0
	for _, t := range tasks {
		b, err := os.ReadFile(w.dir + "/" + t.Name() + "/stat")
		if err != nil {
			continue // a thread that ended meanwhile
		}
		// tid (comm) state ppid ... utime stime ...: comm may hold
		// anything, ")" included.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			return Sample{}, fmt.Errorf("%s/%s/stat: %q", w.dir, t.Name(), b)
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 13 || len(f[0]) != 1 {
			return Sample{}, fmt.Errorf("%s/%s/stat: %q", w.dir, t.Name(), b)
		}
		utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
		stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
		if err1 != nil || err2 != nil {
			return Sample{}, fmt.Errorf("%s/%s/stat: %q", w.dir, t.Name(), b)
		}
		s.CPU += time.Duration(utime+stime) * clockTick
		switch f[0][0] {
		case 'Z', 'X', 'x':
			continue
		case 'T', 't':
			stopped++
		case 'R', 'D':
			s.Running = true
		}
		live++
	}
	switch {
	case live == 0:
		return Sample{Gone: true}, nil
	case stopped == live:
		s.Stopped = true
	}
	return s, nil
}

// peerPID is the process that listens at the other end of a connection,
// as the kernel recorded it at the connect (SO_PEERCRED: the listener's
// creator, in this process's PID namespace); 0 when it cannot say.
func peerPID(conn net.Conn) int {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// silence counts the time an agent leaves a request unread while it is
// idle: an interval at whose end none of its threads runs or waits for a
// CPU, and in which they ran less than a quarter of it, counts whole,
// against limit. An agent it cannot watch
// (no PID, no /proc) counts every interval, against blindLimit. It looks
// at the process first at the first observe, not at the connect: a request
// read at once costs no look at all.
type silence struct {
	watch             func() Watcher
	w                 Watcher
	started           bool
	last              Sample
	lastAt            time.Time
	idle              time.Duration
	limit, blindLimit time.Duration
}

func newSilence(watch func() Watcher, limit, blindLimit time.Duration) *silence {
	return &silence{watch: watch, limit: limit, blindLimit: blindLimit}
}

// bound is the idle time after which the agent is taken for wedged.
func (s *silence) bound() time.Duration {
	if s.w == nil {
		return s.blindLimit
	}
	return s.limit
}

// observe samples the agent at now. It says why the agent is absent (""
// while it is not): gone, stopped, or idle for the bound while the request
// waited.
func (s *silence) observe(now time.Time) string {
	if !s.started {
		s.started, s.lastAt = true, now
		if s.w = s.watch(); s.w == nil {
			return ""
		}
		smp, err := s.w.Sample()
		switch {
		case err != nil:
			s.w = nil
		case smp.Gone:
			return "its process is gone"
		case smp.Stopped:
			return "its process is stopped"
		}
		s.last = smp
		return ""
	}
	dt := now.Sub(s.lastAt)
	s.lastAt = now
	if s.w != nil {
		smp, err := s.w.Sample()
		switch {
		case err != nil:
			// Watched a moment ago and no longer: blind from here on.
			s.w = nil
		case smp.Gone:
			return "its process is gone"
		case smp.Stopped:
			return "its process is stopped"
		default:
			ran := smp.CPU - s.last.CPU
			s.last = smp
			// A thread that ended takes its time with it (ran < 0): not idle.
			if smp.Running || ran < 0 || ran*4 >= dt {
				return ""
			}
		}
	}
	s.idle += dt
	if s.idle >= s.bound() {
		if s.w == nil {
			return fmt.Sprintf("silent for %s (its process cannot be watched)", s.bound())
		}
		return fmt.Sprintf("silent for %s in which its process was idle (wedged)", s.bound())
	}
	return ""
}
