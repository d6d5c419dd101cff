package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is the agent's socket. Two agents may run on a node at once (a
// rollout that starts the new pod before the old one stops): the new one
// takes the path over atomically (it binds a name of its own, then renames
// it over the path), and the old one, when it stops, removes the path only
// while it is still its own socket. Both steps hold a lock beside the
// socket, so that neither lands between the other's look and act.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
}

// lockName is the lock file beside the socket.
const lockName = ".agent.lock"

// Listen binds the socket at path: its directory root's only (0700), the
// socket 0600. A socket already there (an agent that died, or one being
// replaced) is replaced.
func Listen(path string) (*Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket %q: not an absolute path", path)
	}
	dir := filepath.Dir(path)
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	unlock, err := lock(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	// Names of binds that never got renamed (an agent killed in between).
	stale, _ := filepath.Glob(path + ".*.tmp")
	for _, s := range stale {
		_ = os.Remove(s)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", tmp, err)
	}
	// The path is removed by Close, and only while it is ours.
	ul.SetUnlinkOnClose(false)
	l := &Listener{UnixListener: ul, path: path}
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.abandon(tmp)
		return nil, fmt.Errorf("chmod %s: %w", tmp, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err != nil {
		l.abandon(tmp)
		return nil, fmt.Errorf("stat %s: %w", tmp, err)
	}
	l.dev, l.ino = st.Dev, st.Ino
	if err := os.Rename(tmp, path); err != nil {
		l.abandon(tmp)
		return nil, fmt.Errorf("take %s: %w", path, err)
	}
	return l, nil
}

func (l *Listener) abandon(tmp string) {
	_ = l.UnixListener.Close()
	_ = os.Remove(tmp)
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket if the path is still this
// listener's: an agent that replaced it keeps its own.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	unlock, lerr := lock(filepath.Dir(l.path))
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	defer unlock()
	if l.Owns() {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// Owns says whether the path is still this listener's socket.
func (l *Listener) Owns() bool {
	var st unix.Stat_t
	return unix.Lstat(l.path, &st) == nil && st.Dev == l.dev && st.Ino == l.ino
}

// privateDir makes dir a directory only root reaches: made if missing, its
// mode set to 0700 if it was anything else. A symbolic link or a file there
// is refused.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory (%s)", dir, st.Mode().Type())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 && os.Geteuid() == 0 {
		if err := os.Chown(dir, 0, 0); err != nil {
			return fmt.Errorf("socket directory %s: owned by uid %d: %w", dir, sys.Uid, err)
		}
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
	}
	return nil
}

// lock takes the exclusive lock of the socket directory.
func lock(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// peerUID is the uid of the process at the other end of a unix connection,
// as the kernel recorded it when it connected (SO_PEERCRED).
func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return cred.Uid, nil
}

// peerGone says whether the client has closed its end, without waiting and
// without consuming what it sent: a client that gave up right after its
// go-ahead gets nothing done for it.
func peerGone(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		gone = n == 0 && err == nil // an orderly end of stream
		if err != nil && !errors.Is(err, unix.EAGAIN) {
			gone = true
		}
	})
	return gone
}

// ServeAt serves l until ctx ends, then closes it. Every interval it looks
// at l's path: when nothing is there any more (another agent took the path
// over, a second release's, then stopped and removed its socket), it
// listens there again, so that clients and the readiness probe reach it.
// A path that holds another agent's socket is left to it.
func (s *Server) ServeAt(ctx context.Context, l *Listener, every time.Duration) error {
	served := make(chan error, 4)
	serve := func(l *Listener) {
		if err := s.Serve(l); err != nil {
			served <- err
		}
	}
	go serve(l)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return l.Close()
		case err := <-served:
			_ = l.Close()
			return fmt.Errorf("serve: %w", err)
		case <-t.C:
			if _, err := os.Lstat(l.path); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			nl, err := Listen(l.path)
			if err != nil {
				s.log.Printf("the socket %s is gone; listening there again: %v", l.path, err)
				continue
			}
			s.log.Printf("the socket %s was gone (another agent that had taken it over stopped): serving there again", l.path)
			go serve(nl)
			_ = l.UnixListener.Close() // no longer reached; its path is nl's now
			l = nl
		}
	}
}
