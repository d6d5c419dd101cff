package standin

import (
	"context"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// quiet is how long a name must stay quiet after an event before it is
// looked at: a rename, a create and a close of one install come together.
const quiet = 20 * time.Millisecond

// Watch calls changed whenever the file at dir/name, its aside or one of
// Dir's temporary files is created, written, renamed over, removed or has
// its mode changed, once it has been quiet for a moment, until ctx ends. It
// uses inotify on the directory (a rename over the name replaces the inode,
// so the file itself cannot be watched). Writes into the file at the name
// (GNU `cp -f` writes into the same inode) are seen by their close; a
// writer whose file an exchange moved to a temporary name is seen closing
// it there, and Take then keeps what it wrote.
func Watch(ctx context.Context, dir, name string, changed func()) error {
	watched := func(n string) bool { return n == name || n == Aside(name) || IsTemp(n) }
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	const mask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_CREATE | unix.IN_DELETE | unix.IN_ATTRIB
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	events := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, err := f.Read(buf) // the runtime poller: Close ends it
			if err != nil {
				return
			}
			if mentions(buf[:n], watched) {
				select {
				case events <- struct{}{}:
				default:
				}
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
		}
		// Quiet for a moment, then look.
		for settled := false; !settled; {
			select {
			case <-ctx.Done():
				return nil
			case <-events:
			case <-time.After(quiet):
				settled = true
			}
		}
		changed()
	}
}

// mentions says whether a buffer of inotify events names a watched file.
func mentions(buf []byte, watched func(string) bool) bool {
	for off := 0; off+unix.SizeofInotifyEvent <= len(buf); {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			return true // events were lost: look anyway
		}
		end := off + unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			return false
		}
		n := buf[off+unix.SizeofInotifyEvent : end]
		for i, c := range n {
			if c == 0 {
				n = n[:i]
				break
			}
		}
		if watched(string(n)) {
			return true
		}
		off = end
	}
	return false
}
