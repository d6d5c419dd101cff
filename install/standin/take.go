package standin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
)

// captureName is the one temporary name a capture uses (without an
// exchange): under the installers' lock, after recovery, it is free.
const captureName = tempPrefix + "captured"

// Take puts harvester-ipam at the name and keeps the real binary aside. It is
// idempotent, and it is what runs again whenever the plugin's own installer
// (whereabouts' install-cni.sh: `cp -f`) has written the name: the binary it
// finds there becomes the one aside. Another build of harvester-ipam at the
// name is replaced only when claim is set (the caller holds the name: the
// stand-in's record names it, see install.StandInAs): two installers of two
// builds never undo each other's Take for ever. A Take
// that finds nothing to change writes nothing, so the watcher's own events
// end. changed says whether it wrote.
func (d Dir) Take(ctx context.Context, claim bool) (changed bool, err error) {
	changed, err = d.recover(ctx)
	if err != nil {
		return changed, err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return changed, err
	}
	switch a.kind {
	case busy, unknown:
		return changed, pending(d.aside(), a)
	case ours: // never harvester-ipam aside, under any identity
		if err := d.fs().Remove(d.aside()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return changed, fmt.Errorf("remove harvester-ipam from %s: %w", d.aside(), err)
		}
		changed, a = true, look{kind: missing}
	}
	realAside := a.kind == runs
	noReal := func(what string) error {
		aside := "is missing"
		if a.kind == broken {
			aside = "does not run"
		}
		return fmt.Errorf("%s, and the real %s %s at %s: %w; restart %s's DaemonSet pod on this node, which writes it again",
			what, d.Name, aside, d.aside(), ErrNoReal, d.Name)
	}

	n, err := d.look(ctx, d.name())
	if err != nil {
		return changed, err
	}
	switch n.kind {
	case missing:
		if !realAside {
			return changed, noReal(d.name() + " is missing")
		}
	case ours:
		same, err := sameContent(d.fs(), d.name(), d.Self)
		if err != nil {
			return changed, fmt.Errorf("compare %s with %s: %w", d.name(), d.Self, err)
		}
		switch {
		case !realAside:
			return changed, noReal("harvester-ipam is at " + d.name())
		case same:
			return changed, nil
		case !claim:
			return changed, fmt.Errorf("%s: %w; left to the installer that put it there", d.name(), ErrAnotherBuild)
		}
	case runs:
		// The real binary, perhaps a new version: it goes aside.
	case busy, unknown:
		return changed, pending(d.name(), n)
	case broken:
		// A fragment whose writer is gone (a `cp -f` killed, a full disk).
		if !realAside {
			return changed, noReal(d.name() + " does not run")
		}
	}
	wrote, err := d.replace(ctx, n)
	return changed || wrote, err
}

// replace puts harvester-ipam at the name, which holds what n looked at:
// nothing, harvester-ipam, a real binary (kept aside first) or a fragment.
func (d Dir) replace(ctx context.Context, n look) (changed bool, err error) {
	fsys := d.fs()
	// What goes to the name must be known for harvester-ipam when looked at
	// again, or the next Take would keep it aside as the real binary.
	if ok, err := isOurs(fsys, d.Self); err != nil || !ok {
		return false, fmt.Errorf("%s is not a build of harvester-ipam (it does not carry %q; %v): %s left as it was", d.Self, Mark, err, d.name())
	}
	src, err := fsys.Open(d.Self)
	if err != nil {
		return false, fmt.Errorf("read harvester-ipam at %s: %w", d.Self, err)
	}
	tmp, err := fsys.CreateTemp(d.Path, tempPrefix, src)
	src.Close()
	if err != nil {
		return false, err
	}
	defer func() {
		if tmp != "" {
			_ = fsys.Remove(tmp)
		}
	}()
	if err := d.Probe(ctx, tmp); err != nil {
		return false, fmt.Errorf("harvester-ipam from %s does not run: %w; %s left as it was", d.Self, err, d.name())
	}
	d.at(StepSelfReady)

	if n.kind == missing {
		// A link, not a rename: it fails rather than replace a file that a
		// writer created meanwhile.
		err := fsys.Link(tmp, d.name())
		if errors.Is(err, ErrNoLink) {
			if err = fsys.Rename(tmp, d.name()); err == nil {
				tmp = ""
			}
		}
		switch {
		case errors.Is(err, fs.ErrExist):
			return false, fmt.Errorf("%s was written while harvester-ipam was put there: %w", d.name(), ErrPending)
		case err != nil:
			return false, fmt.Errorf("put harvester-ipam at %s: %w", d.name(), err)
		}
		d.at(StepExchanged)
		if tmp != "" {
			if err := fsys.Remove(tmp); err != nil {
				return true, fmt.Errorf("remove %s: %w", tmp, err)
			}
			tmp = ""
		}
		return true, fsys.SyncDir(d.Path)
	}
	if err := d.still(n, d.name()); err != nil {
		return false, err
	}
	d.at(StepChecked)
	err = fsys.Exchange(tmp, d.name())
	if errors.Is(err, ErrNoExchange) {
		self := tmp
		tmp = "" // its own to remove
		return d.replaceWithoutExchange(ctx, self, n)
	}
	if err != nil {
		return false, fmt.Errorf("put harvester-ipam at %s: %w; left as it was", d.name(), err)
	}
	d.at(StepExchanged)
	// tmp now holds what was at the name at the instant of the exchange:
	// the file looked at, or one the plugin's installer wrote since.
	out := tmp
	tmp = ""
	if err := d.settle(ctx, out, &n); err != nil {
		return true, err
	}
	return true, fsys.SyncDir(d.Path)
}

// replaceWithoutExchange is replace on a filesystem that cannot exchange two
// names: the real binary at the name is kept aside (a hard link, else a
// verified copy) before harvester-ipam is renamed over the name. One window
// is left (SAFETY.md): a file created at the name between the last look and
// the rename is replaced unseen.
func (d Dir) replaceWithoutExchange(ctx context.Context, tmp string, n look) (changed bool, err error) {
	fsys := d.fs()
	defer func() {
		if err != nil {
			_ = fsys.Remove(tmp)
		}
	}()
	if n.kind == runs {
		if err := d.capture(n); err != nil {
			return false, err
		}
		d.at(StepCaptured)
		if err := d.keepAside(filepath.Join(d.Path, captureName)); err != nil {
			return true, err
		}
		changed = true
	}
	if err := d.still(n, d.name()); err != nil {
		return changed, err
	}
	if err := fsys.Rename(tmp, d.name()); err != nil {
		return changed, fmt.Errorf("put harvester-ipam at %s: %w", d.name(), err)
	}
	d.at(StepExchanged)
	return true, fsys.SyncDir(d.Path)
}

// capture gives the real binary at the name, as n looked at it, the capture
// name too: a hard link, else a copy checked against the name.
func (d Dir) capture(n look) error {
	fsys := d.fs()
	capture := filepath.Join(d.Path, captureName)
	err := fsys.Link(d.name(), capture)
	if errors.Is(err, ErrNoLink) {
		src, err := fsys.Open(d.name())
		if err != nil {
			return fmt.Errorf("copy the real %s aside: %w", d.Name, err)
		}
		tmp, err := fsys.CreateTemp(d.Path, tempPrefix, src)
		src.Close()
		if err != nil {
			return fmt.Errorf("copy the real %s aside: %w", d.Name, err)
		}
		if err := fsys.Rename(tmp, capture); err != nil {
			_ = fsys.Remove(tmp)
			return fmt.Errorf("copy the real %s aside: %w", d.Name, err)
		}
		// The copy is the binary looked at only if the name did not change
		// meanwhile and the bytes agree.
		same, err := sameContent(fsys, d.name(), capture)
		if err == nil && same {
			err = d.still(n, d.name())
		} else if err == nil {
			err = fmt.Errorf("%s changed while it was copied: %w", d.name(), ErrPending)
		}
		if err != nil {
			_ = fsys.Remove(capture)
			return err
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("link the real %s aside: %w", d.Name, err)
	}
	c, err := fsys.Stat(capture)
	if err != nil || !n.file.Unchanged(c) {
		// A writer replaced the name since the look: the link is the new
		// file, still at the name too. Nothing is lost by dropping it.
		_ = fsys.Remove(capture)
		return fmt.Errorf("%s changed while it was looked at: %w", d.name(), ErrPending)
	}
	return nil
}
