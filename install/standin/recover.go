package standin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// recover finishes what a killed or waiting run left in temporary files: a
// give-back's record first (until it is settled, which of two real
// binaries is the newer is not known, and nothing else is decided), then
// each other file: see settle. changed says whether it wrote.
func (d Dir) recover(ctx context.Context) (changed bool, err error) {
	fsys := d.fs()
	temps, err := fsys.Glob(filepath.Join(d.Path, tempPrefix+"*"))
	if err != nil {
		return false, err
	}
	if slices.Contains(temps, d.marker()) {
		if changed, err = d.settleGiveBack(ctx); err != nil {
			return changed, err
		}
	}
	var waiting []error
	for _, t := range temps {
		var err error
		switch base := filepath.Base(t); {
		case base == givingBackName:
			continue
		case strings.HasPrefix(base, givingBackName):
			// A give-back's record killed before it was put in place: no
			// binary, and nothing was exchanged after it.
			err = fsys.Remove(t)
			if errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		default:
			err = d.settle(ctx, t, nil)
		}
		switch {
		case errors.Is(err, ErrPending):
			waiting = append(waiting, err)
		case err != nil:
			return changed, fmt.Errorf("recover %s: %w", t, err)
		default:
			changed = true
		}
	}
	if changed {
		if err := fsys.SyncDir(d.Path); err != nil {
			return changed, err
		}
	}
	return changed, errors.Join(waiting...)
}

// settle deals with a temporary file that may hold what an exchange moved
// out of the name: a real binary that runs becomes the aside (it left the
// name after the one aside did, so it is the newer); harvester-ipam, or a
// fragment whose writer is gone, is removed; anything else (being written,
// not answering) is kept, and looked at again when its writer is done.
// Nothing that may be the real binary is deleted because a probe failed.
func (d Dir) settle(ctx context.Context, tmp string, was *look) error {
	fsys := d.fs()
	// What an exchange moved out as it was looked at at the name, unwritten
	// since (a writer that opened it since has truncated it: its size or
	// mtime differ), needs no second look.
	var l look
	if now, err := fsys.Stat(tmp); was != nil && err == nil && was.file.Unchanged(now) {
		l = *was
	} else if l, err = d.look(ctx, tmp); err != nil {
		return err
	}
	switch l.kind {
	case missing:
		return nil
	case ours, broken:
		if err := fsys.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s (%s): %w", tmp, l.kind, err)
		}
		return nil
	case runs:
		return d.keepAside(tmp)
	default:
		return pending(tmp, l)
	}
}

// keepAside makes the real binary at tmp the aside, unless tmp is the aside
// itself (a second link to it, which is removed). tmp came from the name (an
// exchange moved it out, or a capture linked or copied it), and a real
// binary at the name is never older than the aside: whereabouts' installer
// wrote it there after the aside was put aside. So it is the newer, whatever
// the files' times say: no clock orders real binaries (SAFETY.md).
func (d Dir) keepAside(tmp string) error {
	fsys := d.fs()
	t, err := fsys.Stat(tmp)
	if err != nil {
		return fmt.Errorf("keep the real %s aside: %w", d.Name, err)
	}
	if a, err := fsys.Stat(d.aside()); err == nil && a.Same(t) {
		return fsys.Remove(tmp)
	}
	if err := fsys.Rename(tmp, d.aside()); err != nil {
		return fmt.Errorf("keep the real %s aside: %w", d.Name, err)
	}
	d.at(StepAsideKept)
	return nil
}
