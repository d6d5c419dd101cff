package standin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FS is what a Dir does to the bin dir and reads from it: the operating
// system's (OS), or the model's (install/standin/model), which explores every
// interleaving of these calls with whereabouts' own writes.
type FS interface {
	// Stat describes the file at path (fs.ErrNotExist when there is none).
	Stat(path string) (File, error)
	// Open opens the file at path for reading.
	Open(path string) (io.ReadCloser, error)
	// CreateTemp writes r to a new file in dir whose name starts with
	// prefix, executable, fsynced and closed, and returns its path. A
	// failure leaves no file behind, but a kill may leave part of one.
	CreateTemp(dir, prefix string, r io.Reader) (string, error)
	// Link gives the file at oldpath the name newpath too; fs.ErrExist when
	// newpath exists, ErrNoLink where the filesystem has no hard links.
	Link(oldpath, newpath string) error
	// Rename moves oldpath to newpath, replacing what is there, atomically.
	Rename(oldpath, newpath string) error
	// Exchange swaps the files at a and b atomically; ErrNoExchange where
	// the filesystem cannot (renameat2 RENAME_EXCHANGE answers EINVAL).
	Exchange(a, b string) error
	// RenameNoReplace moves oldpath to newpath, atomically, unless newpath
	// exists (fs.ErrExist); ErrNoExchange where the filesystem has no
	// renameat2 flags.
	RenameNoReplace(oldpath, newpath string) error
	Remove(path string) error
	// Glob lists the paths matching pattern (filepath.Glob).
	Glob(pattern string) ([]string, error)
	// SyncDir makes the renames in dir durable.
	SyncDir(dir string) error
	// Sleep waits d, or until the model lets another step run.
	Sleep(d time.Duration)
}

// File is what Dir needs to know of a file without reading it.
type File struct {
	Dev, Ino uint64
	Size     int64
	ModTime  time.Time
	Mode     fs.FileMode
}

// Same says whether f and g are one file (the same inode).
func (f File) Same(g File) bool { return f.Dev == g.Dev && f.Ino == g.Ino }

// Unchanged says whether g is f, unwritten since f was taken.
func (f File) Unchanged(g File) bool {
	return f.Same(g) && f.Size == g.Size && f.ModTime.Equal(g.ModTime)
}

var (
	// ErrNoExchange: the filesystem cannot swap two names atomically
	// (vfat, several network and FUSE filesystems, ZFS before 2.2, kernels
	// before 3.15).
	ErrNoExchange = errors.New("the filesystem has no renameat2 flags (RENAME_EXCHANGE, RENAME_NOREPLACE)")
	// ErrNoLink: the filesystem has no hard links.
	ErrNoLink = errors.New("the filesystem has no hard links")
)

// OS is the operating system's filesystem.
type OS struct{}

func (OS) Stat(path string) (File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return File{}, err
	}
	f := File{Size: st.Size(), ModTime: st.ModTime(), Mode: st.Mode()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		f.Dev, f.Ino = uint64(sys.Dev), sys.Ino
	}
	return f, nil
}

func (OS) Open(path string) (io.ReadCloser, error) { return os.Open(path) }

func (OS) CreateTemp(dir, prefix string, r io.Reader) (string, error) {
	// Executable from the start: a kill mid-write leaves a fragment that
	// fails to run (and is removed), not one that cannot be run at all.
	var f *os.File
	var err error
	for range 100 {
		f, err = os.OpenFile(filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o755)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	if _, err = io.Copy(f, r); err == nil {
		err = f.Chmod(0o755) // whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write a temporary file in %s: %w", dir, err)
	}
	return tmp, nil
}

func (OS) Link(oldpath, newpath string) error {
	err := os.Link(oldpath, newpath)
	var le *os.LinkError
	if errors.As(err, &le) && (errors.Is(le.Err, unix.EPERM) || errors.Is(le.Err, unix.EOPNOTSUPP) || errors.Is(le.Err, unix.EMLINK)) {
		return fmt.Errorf("link %s %s: %w (%w)", oldpath, newpath, ErrNoLink, le.Err)
	}
	return err
}

func (OS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

func (OS) Exchange(a, b string) error {
	err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("exchange %s and %s: %w (%w)", a, b, ErrNoExchange, err)
	default:
		return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
	}
}

func (OS) RenameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("rename %s %s without replacing: %w (%w)", oldpath, newpath, ErrNoExchange, err)
	default:
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
}

func (OS) Remove(path string) error              { return os.Remove(path) }
func (OS) Glob(pattern string) ([]string, error) { return filepath.Glob(pattern) }
func (OS) Sleep(d time.Duration)                 { time.Sleep(d) }

func (OS) SyncDir(dir string) error {
	f, err := os.Open(dir)
	if f == nil { // err says why
		return err
	}
	defer f.Close()
	return f.Sync()
}

// contains says whether the file at path holds needle, reading it in
// blocks: a bin dir's files are tens of megabytes, the installer's memory
// limit a few times that.
func contains(fsys FS, path string, needle []byte) (bool, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, blockSize(f, 256<<10)+len(needle))
	keep := len(needle) - 1 // a needle may straddle two blocks
	n := 0
	for {
		m, err := f.Read(buf[n:])
		n += m
		if bytes.Contains(buf[:n], needle) {
			return true, nil
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if n > keep {
			n = copy(buf, buf[n-keep:n])
		}
	}
}

// sameContent says whether the files at a and b hold the same bytes.
func sameContent(fsys FS, a, b string) (bool, error) {
	fa, err := fsys.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := fsys.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, blockSize(fa, 128<<10)), make([]byte, blockSize(fb, 128<<10))
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		aDone := ea == io.EOF || ea == io.ErrUnexpectedEOF
		bDone := eb == io.EOF || eb == io.ErrUnexpectedEOF
		switch {
		case ea != nil && !aDone:
			return false, ea
		case eb != nil && !bDone:
			return false, eb
		case aDone || bDone:
			return aDone && bDone, nil
		}
	}
}

// blockSize is the size of the blocks to read r in: max, or less for a
// reader that knows it holds less (a small file of the model's).
func blockSize(r io.Reader, max int) int {
	if l, ok := r.(interface{ Len() int }); ok && l.Len() < max {
		return l.Len() + 1
	}
	return max
}
