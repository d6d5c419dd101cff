package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"
)

// givingBackName is the record a give-back writes before it exchanges the
// aside with the name: which file it gives back. It is what orders two real
// binaries that meet after a kill, without a clock (see settleGiveBack).
// Its own temporary file, before it is renamed into place, starts with it
// too.
const givingBackName = tempPrefix + "giving-back"

// markerHeader starts a give-back's record.
const markerHeader = "harvester-ipam give-back 1: dev ino size mtime of the real binary given back"

func (d Dir) marker() string { return filepath.Join(d.Path, givingBackName) }

// writeMarker records, before a give-back's exchange, which file it gives
// back: written whole to a temporary file, renamed into place and made
// durable, so that whatever the exchange moves out of the name is known for
// newer than it after any kill or power cut.
func (d Dir) writeMarker(f File) error {
	fsys := d.fs()
	body := fmt.Sprintf("%s\n%d %d %d %d\n", markerHeader, f.Dev, f.Ino, f.Size, f.ModTime.UnixNano())
	tmp, err := fsys.CreateTemp(d.Path, givingBackName+"-", strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("record the give-back of %s: %w", d.name(), err)
	}
	if err := fsys.Rename(tmp, d.marker()); err != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("record the give-back of %s: %w", d.name(), err)
	}
	return fsys.SyncDir(d.Path)
}

// readMarker reads a give-back's record; ok is false when there is none, or
// one that is not whole (it is renamed into place only when it is).
func (d Dir) readMarker() (f File, ok bool, err error) {
	r, err := d.fs().Open(d.marker())
	if errors.Is(err, fs.ErrNotExist) {
		return File{}, false, nil
	}
	if err != nil {
		return File{}, false, fmt.Errorf("read %s: %w", d.marker(), err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 4096))
	if err != nil {
		return File{}, false, fmt.Errorf("read %s: %w", d.marker(), err)
	}
	head, rest, _ := strings.Cut(string(b), "\n")
	var ns int64
	if head != markerHeader {
		return File{}, false, nil
	}
	if _, err := fmt.Sscan(rest, &f.Dev, &f.Ino, &f.Size, &ns); err != nil {
		return File{}, false, nil
	}
	f.ModTime = time.Unix(0, ns)
	return f, true, nil
}

// settleGiveBack finishes a give-back its record names, and removes the
// record. The record names the file given back (F). Two real binaries at
// the name and the aside are ordered by it, without a clock: F unwritten
// since is the older (the other left the name after F was put there);
// F written into since is the newer (whereabouts' installer wrote it while
// it was at the name, after the other had left it); F at neither name was
// replaced at the name by whereabouts' installer, whose file there is the
// newer. The newer goes to (or stays at) the name, the older goes; what is
// at the aside that is harvester-ipam or a fragment goes too.
func (d Dir) settleGiveBack(ctx context.Context) (changed bool, err error) {
	fsys := d.fs()
	f, ok, err := d.readMarker()
	if err != nil {
		return false, err
	}
	for round := 0; ok; round++ {
		if round == 4 { // a writer that keeps writing: looked at again later
			return changed, fmt.Errorf("%s keeps changing: %w", d.name(), ErrPending)
		}
		var done bool
		done, err = d.orderByMarker(ctx, f)
		if err != nil {
			return true, err
		}
		changed = true
		if done {
			break
		}
	}
	if err := fsys.Remove(d.marker()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, err
	}
	return true, fsys.SyncDir(d.Path)
}

// orderByMarker is one round of settleGiveBack: done when the name holds
// the newer of the real binaries and nothing is left aside to order.
func (d Dir) orderByMarker(ctx context.Context, f File) (done bool, err error) {
	fsys := d.fs()
	n, err := d.look(ctx, d.name())
	if err != nil {
		return false, err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return false, err
	}
	switch {
	case n.kind == busy || n.kind == unknown:
		return false, pending(d.name(), n)
	case a.kind == busy || a.kind == unknown:
		return false, pending(d.aside(), a)
	case a.kind == ours || a.kind == broken:
		// What the exchange moved out of the name: never aside.
		if err := fsys.Remove(d.aside()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
		return true, nil
	case a.kind != runs || n.kind != runs:
		// No two real binaries to order: the give-back's next round, or the
		// next Take, deals with what is there.
		return true, nil
	}
	asideNewer := false
	switch {
	case a.file.Same(n.file): // one file under two names
	case a.file.Same(f):
		asideNewer = !a.file.Unchanged(f)
	case n.file.Same(f):
		asideNewer = n.file.Unchanged(f)
	}
	if err := d.still(n, d.name()); err != nil {
		return false, err
	}
	if !asideNewer {
		if err := fsys.Remove(d.aside()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
		return true, nil
	}
	// The newer is aside: it goes to the name, and the next round looks at
	// what came out in its place.
	err = fsys.Exchange(d.aside(), d.name())
	if errors.Is(err, ErrNoExchange) {
		err = fsys.Rename(d.aside(), d.name())
	}
	if err != nil {
		return false, fmt.Errorf("put %s's newer binary at %s: %w (it is at %s)", d.Name, d.name(), err, d.aside())
	}
	d.at(StepGivenBack)
	return false, nil
}
