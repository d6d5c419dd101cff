package standin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// confirmBroken is how long a file that crashed is left before it is run
// once more: a whole binary that failed for a passing reason (the node out of
// memory) must not be taken for a fragment.
const confirmBroken = 200 * time.Millisecond

// kind is what a look found a file to be.
type kind int

const (
	missing kind = iota
	ours         // carries Mark: harvester-ipam, whole or in part
	runs         // answers the probe and is not harvester-ipam: a real binary
	busy         // a writer still has it open
	broken       // does not run, twice, with no writer: a fragment
	unknown      // no answer, or it changed while it was looked at
)

var kindNames = [...]string{"missing", "harvester-ipam", "a real binary", "being written", "a fragment that does not run", "not answering"}

func (k kind) String() string { return kindNames[k] }

// look says what the file at path is, and which file that was.
type look struct {
	kind kind
	file File
	why  error // the probe's answer, for unknown, busy and broken
}

func (d Dir) look(ctx context.Context, path string) (look, error) {
	fsys := d.fs()
	f, err := fsys.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return look{kind: missing}, nil
	}
	if err != nil {
		return look{}, fmt.Errorf("stat %s: %w", path, err)
	}
	l := look{file: f}
	isOurs, err := isOurs(fsys, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return look{kind: missing}, nil
	case err != nil:
		return look{}, fmt.Errorf("read %s: %w", path, err)
	case isOurs:
		l.kind = ours
		return l, nil
	}
	l.why = d.Probe(ctx, path)
	if errors.Is(l.why, ErrBroken) {
		fsys.Sleep(confirmBroken)
		l.why = d.Probe(ctx, path)
	}
	switch {
	case l.why == nil:
		l.kind = runs
	case errors.Is(l.why, ErrBusy):
		l.kind = busy
	case errors.Is(l.why, ErrBroken):
		l.kind = broken
	default:
		l.kind = unknown
	}
	// What was probed must be what was stat'ed and read.
	if now, err := fsys.Stat(path); err != nil || !f.Unchanged(now) {
		l.kind, l.why = unknown, fmt.Errorf("%s changed while it was looked at", path)
	}
	return l, nil
}

// pending is the error of a Take or GiveBack that found a file it must not
// decide about yet.
func pending(path string, l look) error {
	if l.why != nil {
		return fmt.Errorf("%s is %s (%v): %w", path, l.kind, l.why, ErrPending)
	}
	return fmt.Errorf("%s is %s: %w", path, l.kind, ErrPending)
}

// still fails with ErrPending unless the file at path is n's, unwritten.
func (d Dir) still(n look, path string) error {
	now, err := d.fs().Stat(path)
	if err != nil || !n.file.Unchanged(now) {
		return fmt.Errorf("%s changed while it was looked at: %w", path, ErrPending)
	}
	return nil
}
