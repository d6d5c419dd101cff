package standin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Dir is one CNI bin dir in which harvester-ipam stands in for the plugin
// Name. Its methods change the dir only by renames of whole, fsynced,
// probed files, so that at every instant the name holds one whole runnable
// binary (the real one or harvester-ipam), and the real binary is at the name
// or aside (invariant 7). The caller serialises them (install holds a lock).
type Dir struct {
	// Path is the CNI bin dir; Name the plugin harvester-ipam stands in for.
	Path, Name string
	// Self is the harvester-ipam binary to put at the name.
	Self string
	// Probe runs a binary as the runtime would (CNI_COMMAND=VERSION) and
	// fails when it does not answer: no file that does not run is put at
	// the name or aside.
	Probe func(ctx context.Context, path string) error
	// AtStep, when set, is called after each step (test builds crash there).
	AtStep func(step string)
}

// Steps of Take and GiveBack, in order, for AtStep.
const (
	StepAsideKept = "aside-kept" // the real binary copied aside
	StepSelfReady = "self-ready" // harvester-ipam in a temporary file beside the name
	StepExchanged = "exchanged"  // harvester-ipam at the name; the name's old file at the temporary
	StepNewerKept = "newer-kept" // a real binary written meanwhile kept aside
	StepGivenBack = "given-back" // the real binary at the name again
	StepAsideGone = "aside-gone" // the aside removed
)

// tempPrefix names the temporary files, in the bin dir itself: only a rename
// within one filesystem is atomic.
const tempPrefix = ".harvester-ipam.standin-"

// ErrNoReal is returned when there is no real binary to stand in for or to
// give back: none at the name and none aside.
var ErrNoReal = errors.New("no real binary at the name nor aside")

func (d Dir) name() string  { return filepath.Join(d.Path, d.Name) }
func (d Dir) aside() string { return Aside(d.name()) }

func (d Dir) at(step string) {
	if d.AtStep != nil {
		d.AtStep(step)
	}
}

// Take puts harvester-ipam at the name and keeps the real binary aside. It is
// idempotent, and it is what runs again whenever the plugin's own installer
// (whereabouts' install-cni.sh: `cp -f`) has written the name: the binary it
// finds there then becomes the one aside. changed says whether it wrote.
func (d Dir) Take(ctx context.Context) (changed bool, err error) {
	if err := d.recover(ctx); err != nil {
		return false, err
	}
	self, err := os.ReadFile(d.Self)
	if err != nil {
		return false, fmt.Errorf("read harvester-ipam at %s: %w", d.Self, err)
	}
	cur, err := os.ReadFile(d.name())
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !exists(d.aside()) {
			return false, fmt.Errorf("%s: %w; harvester-ipam stands in once %s is installed", d.name(), ErrNoReal, d.Name)
		}
	case err != nil:
		return false, fmt.Errorf("read %s: %w", d.name(), err)
	case bytes.Equal(cur, self):
		if !exists(d.aside()) {
			return false, fmt.Errorf("harvester-ipam is at %s but the real %s is missing at %s: restart %s's DaemonSet pod on this node, which writes it again", d.name(), d.Name, d.aside(), d.Name)
		}
		return false, nil
	case !IsHarvesterIPAM(d.name()):
		// The real binary, perhaps a new version: it becomes the one aside.
		if err := d.keepAside(ctx, d.name()); err != nil {
			return false, err
		}
		d.at(StepAsideKept)
	}
	// Otherwise another harvester-ipam (an older release) is at the name and
	// the real binary already aside: only the name changes.

	tmp, err := d.writeTemp(self)
	if err != nil {
		return false, err
	}
	if err := d.Probe(ctx, tmp); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("harvester-ipam from %s does not run: %w; %s left as it was", d.Self, err, d.name())
	}
	d.at(StepSelfReady)
	if err := exchange(tmp, d.name()); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("put harvester-ipam at %s: %w; left as it was", d.name(), err)
	}
	d.at(StepExchanged)
	// tmp now holds what was at the name at the instant of the exchange: the
	// file read above, or one the plugin's installer wrote since.
	if err := d.settleTemp(ctx, tmp); err != nil {
		return true, err
	}
	return true, syncDir(d.Path)
}

// GiveBack puts the real binary back at the name, byte for byte, and removes
// the aside. With the real binary at the name already (the plugin's installer
// wrote it) it only removes the aside.
func (d Dir) GiveBack(ctx context.Context) error {
	if err := d.recover(ctx); err != nil {
		return err
	}
	real, err := os.ReadFile(d.aside())
	if errors.Is(err, os.ErrNotExist) {
		if exists(d.name()) && !IsHarvesterIPAM(d.name()) {
			return nil // given back already
		}
		return fmt.Errorf("give %s back: %w (%s is missing): restart %s's DaemonSet pod on this node, which writes it again", d.name(), ErrNoReal, d.aside(), d.Name)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", d.aside(), err)
	}
	if exists(d.name()) && !IsHarvesterIPAM(d.name()) {
		// Written by the plugin's installer since: newer than the aside.
		if err := os.Remove(d.aside()); err != nil {
			return err
		}
		d.at(StepAsideGone)
		return syncDir(d.Path)
	}
	tmp, err := d.writeTemp(real)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, d.name()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("give %s back: %w; left as it was", d.name(), err)
	}
	d.at(StepGivenBack)
	if err := syncDir(d.Path); err != nil {
		return err
	}
	if err := os.Remove(d.aside()); err != nil {
		return fmt.Errorf("gave %s back; remove %s: %w", d.name(), d.aside(), err)
	}
	d.at(StepAsideGone)
	return syncDir(d.Path)
}

// keepAside copies the real binary at src to the aside, through a probed,
// fsynced temporary file renamed over it.
func (d Dir) keepAside(ctx context.Context, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	tmp, err := d.writeTemp(b)
	if err != nil {
		return err
	}
	if err := d.Probe(ctx, tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s does not run (still being written?): %w; nothing changed", src, err)
	}
	if err := os.Rename(tmp, d.aside()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("keep %s aside at %s: %w", src, d.aside(), err)
	}
	return syncDir(d.Path)
}

// settleTemp deals with the file an exchange moved out of the name: a real
// binary other than the aside's (written meanwhile) becomes the aside; what
// is left is removed.
func (d Dir) settleTemp(ctx context.Context, tmp string) error {
	out, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	aside, _ := os.ReadFile(d.aside())
	if !IsHarvesterIPAM(tmp) && !bytes.Equal(out, aside) && d.Probe(ctx, tmp) == nil {
		if err := os.Rename(tmp, d.aside()); err != nil {
			return fmt.Errorf("keep the newer %s aside: %w", d.Name, err)
		}
		d.at(StepNewerKept)
		return nil
	}
	return os.Remove(tmp)
}

// recover finishes what a killed Take or GiveBack left: a temporary file is a
// whole binary only if it runs; one that is the real binary becomes the aside
// when there is none (it may be the only copy: moved out of the name by an
// exchange); every other is removed.
func (d Dir) recover(ctx context.Context) error {
	temps, err := filepath.Glob(filepath.Join(d.Path, tempPrefix+"*"))
	if err != nil {
		return err
	}
	for _, t := range temps {
		if !exists(d.aside()) && !IsHarvesterIPAM(t) && d.Probe(ctx, t) == nil {
			if err := os.Rename(t, d.aside()); err != nil {
				return fmt.Errorf("recover the real %s from %s: %w", d.Name, t, err)
			}
			continue
		}
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove a killed run's leftover: %w", err)
		}
	}
	return syncDir(d.Path)
}

// writeTemp writes b to a new executable, fsynced file beside the name.
func (d Dir) writeTemp(b []byte) (string, error) {
	f, err := os.CreateTemp(d.Path, tempPrefix+"*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o755)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write a temporary file in %s: %w", d.Path, err)
	}
	return tmp, nil
}

// exchange swaps two names atomically: no instant sees either missing. The
// old file at to is then at from, so that a write to it since it was read is
// never lost.
func exchange(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		// Nothing at the name to exchange with (only the aside is left), or
		// a filesystem without exchange: a rename is atomic all the same.
		return os.Rename(from, to)
	}
	return err
}

func exists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
