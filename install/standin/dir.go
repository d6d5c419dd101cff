package standin

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
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

// Pending lists the temporary files a Take left waiting for their writer.
func (d Dir) Pending() []string {
	temps, _ := d.fs().Glob(filepath.Join(d.Path, tempPrefix+"*"))
	return temps
}

// IsTemp says whether a file name in the bin dir is one of Dir's temporary files.
func IsTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }
