package standin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

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

// giveBackOnce is one round of GiveBack: recover, look at the aside and the
// name, and take the one step they call for. done says the name is the real
// binary's; ErrPending, that a file it needs is being written or did not
// answer.
func (d Dir) giveBackOnce(ctx context.Context) (done bool, err error) {
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
		return d.givenBackAlready(n, a)
	case a.kind != runs:
		return false, d.noRealToGiveBack(a)
	case n.kind == missing:
		return d.giveBackToMissingName()
	}
	return d.exchangeBack(ctx, n, a)
}

// givenBackAlready finishes a give-back that finds the real binary at the
// name (n): given back already, or written since. A real binary at the name
// is never older than the aside (see keepAside), which goes once the name is
// seen to hold it still: a writer may have replaced it meanwhile.
func (d Dir) givenBackAlready(n, a look) (done bool, err error) {
	fsys := d.fs()
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
}

// noRealToGiveBack is the error of a give-back with no runnable aside and no
// real binary at the name: harvester-ipam stays at the name. harvester-ipam
// found aside is removed first (never aside).
func (d Dir) noRealToGiveBack(a look) error {
	if a.kind == ours {
		_ = d.fs().Remove(d.aside())
	}
	what := map[kind]string{missing: "is missing", ours: "was harvester-ipam", broken: "does not run"}[a.kind]
	return fmt.Errorf("give %s back: %w (the real %s %s at %s); %s stays as it is: restart %s's DaemonSet pod on this node, which writes it again",
		d.name(), ErrNoReal, d.Name, what, d.aside(), d.name(), d.Name)
}

// giveBackToMissingName moves the aside to the missing name: a move that
// fails rather than replace a file a writer created meanwhile. The real
// binary is never in two names, one of which is then removed while a writer
// unlinks the other.
func (d Dir) giveBackToMissingName() (done bool, err error) {
	fsys := d.fs()
	err = fsys.RenameNoReplace(d.aside(), d.name())
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

// exchangeBack gives back over harvester-ipam, or a fragment, at the name
// (n), the real binary aside (a). One exchange of the two: the name holds
// harvester-ipam (the aside its delegate) until it holds the real binary,
// and a kill at any instant leaves a name that runs with no run after it.
// The real binary is only ever moved, never in two names one of which is
// then removed while a writer unlinks the other. What a writer put at the
// name meanwhile comes out at the aside's name, and the record written
// first says which of two real binaries whereabouts' installer wrote last.
func (d Dir) exchangeBack(ctx context.Context, n, a look) (done bool, err error) {
	fsys := d.fs()
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
