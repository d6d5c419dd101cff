package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Dir is one CNI bin dir in which harvester-ipam stands in for the plugin
// Name. Its methods change the dir only by atomic steps (a rename, an
// exchange, a link of a whole, fsynced, probed file), each of which the next
// run of Take or GiveBack finishes or undoes after a kill; SAFETY.md argues
// that they never lose, downgrade or give away the real binary. The caller
// serialises them (install holds a lock); whereabouts' own installer writes
// the name whenever it likes.
type Dir struct {
	// Path is the CNI bin dir; Name the plugin harvester-ipam stands in for.
	Path, Name string
	// Self is the harvester-ipam binary to put at the name.
	Self string
	// FS is the filesystem; nil is the operating system's.
	FS FS
	// Probe runs a binary as the runtime would (CNI_COMMAND=VERSION). It
	// returns nil when the binary answers; an error wrapping ErrBusy when a
	// writer still has the file open (ETXTBSY); one wrapping ErrBroken when
	// the file cannot run (not an executable, or it crashed); any other error
	// when it gave no answer (a timeout, a cancelled context, a kill), which
	// says nothing about the file.
	Probe func(ctx context.Context, path string) error
	// AtStep, when set, is called after each step (test builds crash there).
	AtStep func(step string)
}

// Steps of Take and GiveBack, for AtStep.
const (
	StepSelfReady = "self-ready" // harvester-ipam in a probed temporary file beside the name
	StepChecked   = "checked"    // the name still holds what was looked at
	StepCaptured  = "captured"   // without an exchange: the real binary linked or copied to a temporary name
	StepExchanged = "exchanged"  // harvester-ipam at the name; what was there at a temporary name
	StepAsideKept = "aside-kept" // the real binary renamed to the aside
	StepMarked    = "marked"     // giving back: the record of the binary given back written
	StepGivenBack = "given-back" // the aside back at the name
)

// tempPrefix names the temporary files, in the bin dir itself: only a rename
// within one filesystem is atomic.
const tempPrefix = ".harvester-ipam.standin-"

// captureName is the one temporary name a capture uses (without an
// exchange): under the installers' lock, after recovery, it is free.
const captureName = tempPrefix + "captured"

// givingBackName is the record a give-back writes before it exchanges the
// aside with the name: which file it gives back. It is what orders two real
// binaries that meet after a kill, without a clock (see settleGiveBack).
// Its own temporary file, before it is renamed into place, starts with it
// too.
const givingBackName = tempPrefix + "giving-back"

// confirmBroken is how long a file that crashed is left before it is run
// once more: a whole binary that failed for a passing reason (the node out of
// memory) must not be taken for a fragment.
const confirmBroken = 200 * time.Millisecond

var (
	// ErrNoReal: there is no real binary to stand in for or to give back.
	ErrNoReal = errors.New("no real binary at the name nor aside")
	// ErrPending: a file that may be the real binary is still being written,
	// or did not answer; nothing was decided about it. The watcher looks
	// again when its writer closes it, the interval pass in any case.
	ErrPending = errors.New("waiting for a writer")
	// ErrBusy: a writer still has the file open (a probe's ETXTBSY).
	ErrBusy = errors.New("a writer still has it open")
	// ErrBroken: the file does not run: not an executable, or it crashed.
	ErrBroken = errors.New("it does not run")
	// ErrAnotherBuild: another build of harvester-ipam stands in at the
	// name (another installer's); only a claiming Take replaces it.
	ErrAnotherBuild = errors.New("another build of harvester-ipam is at the name")
)

func (d Dir) fs() FS {
	if d.FS == nil {
		return OS{}
	}
	return d.FS
}

func (d Dir) name() string  { return filepath.Join(d.Path, d.Name) }
func (d Dir) aside() string { return Aside(d.name()) }

func (d Dir) at(step string) {
	if d.AtStep != nil {
		d.AtStep(step)
	}
}

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

// still fails with ErrPending unless the file at path is n's, unwritten.
func (d Dir) still(n look, path string) error {
	now, err := d.fs().Stat(path)
	if err != nil || !n.file.Unchanged(now) {
		return fmt.Errorf("%s changed while it was looked at: %w", path, ErrPending)
	}
	return nil
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

// GiveBack puts the real binary back at the name, byte for byte: the aside
// is exchanged with (or renamed over) the name. With the real binary at the
// name already (the plugin's installer wrote it) it only removes the aside.
// A file still being written is waited for until ctx ends. A file that does
// not run never replaces a runnable aside, and harvester-ipam stays at the
// name when there is no real binary to give it to. At every instant the
// name runs on its own: harvester-ipam with the real binary aside, or the
// real binary; a kill with no run after it (an uninstall) leaves that.
func (d Dir) GiveBack(ctx context.Context) error {
	for {
		done, err := d.giveBackOnce(ctx)
		if done || err != nil && !errors.Is(err, ErrPending) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("give %s back: %w (%w)", d.name(), ctx.Err(), err)
		}
		if err != nil {
			d.fs().Sleep(100 * time.Millisecond)
		}
	}
}

func (d Dir) giveBackOnce(ctx context.Context) (done bool, err error) {
	fsys := d.fs()
	if _, err := d.recover(ctx); err != nil {
		return false, err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return false, err
	}
	n, err := d.look(ctx, d.name())
	if err != nil {
		return false, err
	}
	switch {
	case a.kind == busy || a.kind == unknown:
		return false, pending(d.aside(), a)
	case n.kind == busy || n.kind == unknown:
		return false, pending(d.name(), n)
	case n.kind == runs:
		// The real binary is at the name: given back already, or written
		// since. A real binary at the name is never older than the aside
		// (see keepAside), which goes once the name is seen to hold it
		// still: a writer may have replaced it meanwhile.
		if a.kind != missing {
			if err := d.still(n, d.name()); err != nil {
				return false, err
			}
			if err := fsys.Remove(d.aside()); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return false, err
			}
			return true, fsys.SyncDir(d.Path)
		}
		return true, nil
	case a.kind != runs:
		if a.kind == ours {
			_ = fsys.Remove(d.aside())
		}
		what := map[kind]string{missing: "is missing", ours: "was harvester-ipam", broken: "does not run"}[a.kind]
		return false, fmt.Errorf("give %s back: %w (the real %s %s at %s); %s stays as it is: restart %s's DaemonSet pod on this node, which writes it again",
			d.name(), ErrNoReal, d.Name, what, d.aside(), d.name(), d.Name)
	case n.kind == missing:
		// A move that fails rather than replace a file a writer created
		// meanwhile: the real binary is never in two names, one of which
		// is then removed while a writer unlinks the other.
		err := fsys.RenameNoReplace(d.aside(), d.name())
		if errors.Is(err, ErrNoExchange) {
			err = fsys.Link(d.aside(), d.name())
			if errors.Is(err, ErrNoLink) {
				err = fsys.Rename(d.aside(), d.name())
			} else if err == nil {
				err = fsys.Remove(d.aside())
			}
		}
		if errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("%s was written meanwhile: %w", d.name(), ErrPending)
		}
		if err != nil {
			return false, fmt.Errorf("give %s back: %w", d.name(), err)
		}
		d.at(StepGivenBack)
		return true, fsys.SyncDir(d.Path)
	}
	// harvester-ipam, or a fragment, at the name; the real binary aside. One
	// exchange of the two: the name holds harvester-ipam (the aside its
	// delegate) until it holds the real binary, and a kill at any instant
	// leaves a name that runs with no run after it. The real binary is only
	// ever moved, never in two names one of which is then removed while a
	// writer unlinks the other. What a writer put at the name meanwhile
	// comes out at the aside's name, and the record written first says which
	// of two real binaries whereabouts' installer wrote last.
	if err := d.writeMarker(a.file); err != nil {
		return false, err
	}
	d.at(StepMarked)
	if err := d.still(n, d.name()); err != nil {
		return false, err // the record says nothing was exchanged: recovery removes it
	}
	err = fsys.Exchange(d.aside(), d.name())
	if errors.Is(err, ErrNoExchange) {
		// The window SAFETY.md leaves: what a writer puts at the name
		// between the look just above and this rename is replaced unseen.
		if err := fsys.Rename(d.aside(), d.name()); err != nil {
			return false, fmt.Errorf("give %s back: %w; left as it was", d.name(), err)
		}
		d.at(StepGivenBack)
		if err := fsys.Remove(d.marker()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return true, err
		}
		return true, fsys.SyncDir(d.Path)
	}
	if err != nil {
		return false, fmt.Errorf("give %s back: %w; left as it was", d.name(), err)
	}
	d.at(StepGivenBack)
	if _, err := d.settleGiveBack(ctx); err != nil {
		return false, err
	}
	return false, nil // the next round sees it given back
}

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

// Pending lists the temporary files a Take left waiting for their writer.
func (d Dir) Pending() []string {
	temps, _ := d.fs().Glob(filepath.Join(d.Path, tempPrefix+"*"))
	return temps
}

// IsTemp says whether a file name in the bin dir is one of Dir's temporary files.
func IsTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

// Stop is what an installer does when it is told to stop: it gives the name
// back only when removing says the chart no longer stands in here
// (uninstalled, turned off, the node no longer selected). A restart, a
// rollout, a node's shutdown or a force-deleted pod keeps harvester-ipam
// standing in: giving back then would leave the node to the real binary
// alone exactly while pods get new sandboxes.
func (d Dir) Stop(ctx context.Context, removing func(context.Context) (uninstall bool, why string)) (gaveBack bool, why string, err error) {
	uninstall, why := removing(ctx)
	if !uninstall {
		return false, why, nil
	}
	return true, why, d.GiveBack(ctx)
}

// Ready says what a readiness probe asks of the stand-in: harvester-ipam
// from Self at the name and a real binary aside that runs (it stands in),
// or no real binary on the node at all (nothing to stand in for: the
// plugin's own installer has not run here). It writes nothing.
func (d Dir) Ready(ctx context.Context) (string, error) {
	n, err := d.look(ctx, d.name())
	if err != nil {
		return "", err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return "", err
	}
	switch {
	case n.kind == missing && a.kind == missing:
		return fmt.Sprintf("nothing to stand in for: no %s at %s (its DaemonSet has not installed it on this node)", d.Name, d.name()), nil
	case n.kind != ours:
		return "", fmt.Errorf("not standing in for %s: %s is %s", d.Name, d.name(), n.kind)
	case a.kind == ours:
		return "", fmt.Errorf("%s is harvester-ipam, not the real %s", d.aside(), d.Name)
	case a.kind == missing:
		return "", fmt.Errorf("the real %s is missing at %s", d.Name, d.aside())
	case a.kind != runs:
		return "", fmt.Errorf("the real %s at %s does not run: %s (%v)", d.Name, d.aside(), a.kind, a.why)
	}
	same, err := sameContent(d.fs(), d.name(), d.Self)
	if err != nil {
		return "", err
	}
	if !same {
		return "", fmt.Errorf("not standing in for %s: %s is another build of harvester-ipam than %s", d.Name, d.name(), d.Self)
	}
	return fmt.Sprintf("harvester-ipam stands in at %s; the real %s is at %s", d.name(), d.Name, d.aside()), nil
}

// GivenBack says whether the name is the real binary's again, as a stand-in
// turned off leaves it: no harvester-ipam at the name, nothing aside. An
// error says what is not (harvester-ipam still at the name, a binary still
// aside).
func (d Dir) GivenBack(ctx context.Context) (string, error) {
	n, err := d.look(ctx, d.name())
	if err != nil {
		return "", err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return "", err
	}
	switch {
	case n.kind == ours:
		return "", fmt.Errorf("harvester-ipam still stands in at %s (the real %s at %s is %s)", d.name(), d.Name, d.aside(), a.kind)
	case a.kind != missing:
		return "", fmt.Errorf("%s is still there (%s), beside %s at %s: a give-back not finished", d.aside(), a.kind, n.kind, d.name())
	case n.kind == missing:
		return fmt.Sprintf("nothing to give back: no %s at %s, nothing at %s", d.Name, d.name(), d.aside()), nil
	case n.kind != runs:
		return "", fmt.Errorf("%s at %s is %s (%v)", d.Name, d.name(), n.kind, n.why)
	}
	return fmt.Sprintf("harvester-ipam does not stand in for %s: the real %s is at %s; nothing at %s", d.Name, d.Name, d.name(), d.aside()), nil
}
