package model

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/install/standin"
)

// The model's paths: one bin dir, the name, and the image's harvester-ipam;
// marker is a give-back's record (standin's givingBackName), in place from
// before its exchange until it is settled.
const (
	binDir   = "/host/opt/cni/bin"
	name     = "whereabouts"
	selfPath = "/usr/bin/harvester-ipam"
	marker   = ".harvester-ipam.standin-giving-back"
)

var (
	namePath  = filepath.Join(binDir, name)
	asidePath = standin.Aside(namePath)
)

// size is the length of every whole binary: a write of half of it leaves a
// fragment, which runs no better than half of a real binary does.
const size = 96

// The binaries, as bytes the product's code reads: harvester-ipam carries
// standin.Mark at its end (so half of it does not), a real whereabouts of
// version v does not.
func real(v int) []byte    { return pad(fmt.Sprintf("\x7fELF whereabouts v0.9.%d", v), "") }
func self() []byte         { return pad("\x7fELF harvester-ipam (this build)", standin.Mark) }
func anotherBuild() []byte { return pad("\x7fELF harvester-ipam (another build)", standin.Mark) }
func half(b []byte) []byte { return append([]byte{}, b[:size/2]...) }
func pad(head, tail string) []byte {
	b := bytes.Repeat([]byte{'.'}, size)
	copy(b, head)
	copy(b[size-len(tail):], tail)
	return b
}

// inode is a file of the model's filesystem.
type inode struct {
	ino     uint64
	data    []byte
	writers int   // open for writing: exec fails with ETXTBSY
	mtime   int64 // the model's clock at its last write
	// wb: whereabouts' cp created or truncated it; a fragment of it at the
	// name is cp's own doing, which no one can prevent.
	wb bool
	// legacy: a bad state an older release left (harvester-ipam aside),
	// there before the run: the invariants judge what this code does.
	legacy bool
	// displacedBy says how the installer took its last name, if it did.
	displacedBy string
}

// what says what a file's bytes are: a whole binary ("real v", "self",
// "another build"), or "part".
func (w *World) what(n *inode) string {
	if n == nil {
		return "nothing"
	}
	switch d := string(n.data); {
	case d == string(self()):
		return "self"
	case d == string(anotherBuild()):
		return "another build"
	}
	for v := range w.maxVersion + 1 {
		if string(n.data) == string(real(v)) {
			return fmt.Sprintf("real %d", v)
		}
	}
	return fmt.Sprintf("part (%d bytes)", len(n.data))
}

// version is the real version a file holds whole, or -1.
func (w *World) version(n *inode) int {
	if n == nil {
		return -1
	}
	for v := range w.maxVersion + 1 {
		if string(n.data) == string(real(v)) {
			return v
		}
	}
	return -1
}

// fsys is the World as standin.FS: each call is one atomic step of the
// installer's, and a step the scheduler may put another actor's before.
type fsys struct{ w *World }

func (f fsys) lookup(path string) *inode {
	if path == selfPath {
		return f.w.self
	}
	if filepath.Dir(path) != binDir {
		return nil
	}
	return f.w.names[filepath.Base(path)]
}

func notExist(op, path string) error { return &fs.PathError{Op: op, Path: path, Err: fs.ErrNotExist} }

func (f fsys) Stat(path string) (standin.File, error) {
	if err := f.w.step("stat "+short(path), f.touches(path), false); err != nil {
		return standin.File{}, err
	}
	n := f.lookup(path)
	if n == nil {
		return standin.File{}, notExist("stat", path)
	}
	return standin.File{Dev: 1, Ino: n.ino, Size: int64(len(n.data)), ModTime: time.Unix(0, n.mtime), Mode: 0o755}, nil
}

func (f fsys) Open(path string) (io.ReadCloser, error) {
	if err := f.w.step("read "+short(path), f.touches(path), false); err != nil {
		return nil, err
	}
	n := f.lookup(path)
	if n == nil {
		return nil, notExist("open", path)
	}
	// One step: what the file holds at this instant.
	return reader{bytes.NewReader(append([]byte{}, n.data...))}, nil
}

func (f fsys) CreateTemp(dir, prefix string, r io.Reader) (string, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	f.w.temps++
	base := fmt.Sprintf("%s%d", prefix, f.w.temps)
	if err := f.w.step("create "+base+" (half)", false, true); err != nil {
		return "", err
	}
	n := f.w.newInode(half(b))
	f.w.names[base] = n
	f.w.dirty = true
	if err := f.w.step("write "+base+" (the rest)", false, true); err != nil {
		return "", err
	}
	n.data, n.mtime = b, f.w.tick()
	return filepath.Join(dir, base), nil
}

func (f fsys) Link(oldpath, newpath string) error {
	if err := f.w.step("link "+short(oldpath)+" "+short(newpath), f.touches(oldpath) || f.touches(newpath), true); err != nil {
		return err
	}
	if !f.w.links {
		return fmt.Errorf("link %s: %w", newpath, standin.ErrNoLink)
	}
	n := f.lookup(oldpath)
	if n == nil {
		return notExist("link", oldpath)
	}
	if f.lookup(newpath) != nil {
		return &fs.PathError{Op: "link", Path: newpath, Err: fs.ErrExist}
	}
	f.w.names[filepath.Base(newpath)] = n
	f.w.dirty = true
	return nil
}

func (f fsys) Rename(oldpath, newpath string) error {
	if err := f.w.step("rename "+short(oldpath)+" "+short(newpath), f.touches(oldpath) || f.touches(newpath), true); err != nil {
		return err
	}
	n := f.lookup(oldpath)
	if n == nil {
		return notExist("rename", oldpath)
	}
	old := f.lookup(newpath)
	if old == n {
		return nil // two links of one file: rename does nothing
	}
	delete(f.w.names, filepath.Base(oldpath))
	f.w.names[filepath.Base(newpath)] = n
	f.w.dirty = true
	if old != nil {
		f.w.displaced(old, "renamed over by the installer")
	}
	return nil
}

func (f fsys) Exchange(a, b string) error {
	if err := f.w.step("exchange "+short(a)+" "+short(b), f.touches(a) || f.touches(b), true); err != nil {
		return err
	}
	if !f.w.exchange {
		return fmt.Errorf("exchange %s %s: %w", a, b, standin.ErrNoExchange)
	}
	na, nb := f.lookup(a), f.lookup(b)
	if na == nil || nb == nil {
		return notExist("exchange", a+" "+b)
	}
	f.w.names[filepath.Base(a)], f.w.names[filepath.Base(b)] = nb, na
	f.w.dirty = true
	return nil
}

func (f fsys) RenameNoReplace(oldpath, newpath string) error {
	if err := f.w.step("rename (no replace) "+short(oldpath)+" "+short(newpath), f.touches(oldpath) || f.touches(newpath), true); err != nil {
		return err
	}
	if !f.w.exchange { // renameat2's flags come together
		return fmt.Errorf("rename %s: %w", newpath, standin.ErrNoExchange)
	}
	n := f.lookup(oldpath)
	if n == nil {
		return notExist("rename", oldpath)
	}
	if f.lookup(newpath) != nil {
		return &fs.PathError{Op: "rename", Path: newpath, Err: fs.ErrExist}
	}
	delete(f.w.names, filepath.Base(oldpath))
	f.w.names[filepath.Base(newpath)] = n
	f.w.dirty = true
	return nil
}

func (f fsys) Remove(path string) error {
	if err := f.w.step("remove "+short(path), f.touches(path), true); err != nil {
		return err
	}
	n := f.lookup(path)
	if n == nil {
		return notExist("remove", path)
	}
	delete(f.w.names, filepath.Base(path))
	f.w.dirty = true
	f.w.displaced(n, "removed by the installer")
	return nil
}

func (f fsys) Glob(pattern string) ([]string, error) {
	if err := f.w.step("glob", false, false); err != nil {
		return nil, err
	}
	var out []string
	for base := range f.w.names {
		if ok, _ := filepath.Match(filepath.Base(pattern), base); ok {
			out = append(out, filepath.Join(binDir, base))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f fsys) SyncDir(string) error {
	if err := f.w.step("fsync the dir", false, false); err != nil {
		return err
	}
	f.w.dirty = false
	return nil
}

func (f fsys) Sleep(time.Duration) { _ = f.w.step("sleep", true, false) }

// touches says whether a call on path may see or change what whereabouts'
// cp does: the name, or a file cp has open. Only such calls, and the
// installer's own writes, are points where the scheduler may run cp (or a
// kill) first; the rest commute with every step of cp.
func (f fsys) touches(path string) bool {
	if path == namePath {
		return true
	}
	n := f.lookup(path)
	return n != nil && (n.writers > 0 || n == f.w.cp.file)
}

// probe is the model's standin.Dir.Probe: whole binaries answer, files open
// for writing are busy, parts are broken; any of them may also not answer
// (a timeout), as the scheduler chooses.
func (w *World) probe(ctx context.Context, path string) error {
	f := fsys{w}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := w.step("run "+short(path), f.touches(path), false); err != nil {
		return err
	}
	n := f.lookup(path)
	if n == nil {
		return notExist("exec", path)
	}
	what := w.what(n)
	whole := n.writers == 0 && !strings.HasPrefix(what, "part")
	if w.noAnswers > 0 {
		// A probe that gives no answer (a timeout), or, of a whole binary,
		// one that crashes once (the node out of memory): neither says the
		// file does not run.
		choices := 2
		if whole {
			choices = 3
		}
		switch w.choose("probe "+short(path)+" answers", choices) {
		case 1:
			w.noAnswers--
			return fmt.Errorf("run %s: no answer within 10s: %w", path, errNoAnswer)
		case 2:
			w.noAnswers--
			return fmt.Errorf("run %s: signal: killed by the node running out of memory: %w", path, standin.ErrBroken)
		}
	}
	switch {
	case n.writers > 0:
		return fmt.Errorf("run %s: text file busy: %w", path, standin.ErrBusy)
	case strings.HasPrefix(what, "part"):
		return fmt.Errorf("run %s: signal: segmentation fault: %w", path, standin.ErrBroken)
	}
	return nil
}

func short(path string) string {
	if path == selfPath {
		return "image:harvester-ipam"
	}
	return strings.Replace(filepath.Base(path), ".harvester-ipam.standin-", "tmp.", 1)
}

// reader is a file's bytes as read at one instant; its Len lets the
// product's code read it in one small block.
type reader struct{ *bytes.Reader }

func (reader) Close() error { return nil }
