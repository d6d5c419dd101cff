package install

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/harvester/harvester-ipam/install/standin"
)

// StandInDir is the stand-in for name in opt's bin dir. The probe asks a
// binary what the runtime asks it (CNI_COMMAND=VERSION) and no more:
// harvester-ipam was probed fully by Install already, and the real binary
// supports what it supports.
func StandInDir(opt Options, name string) (standin.Dir, error) {
	if err := opt.defaults(); err != nil {
		return standin.Dir{}, err
	}
	if name == "" || name != filepath.Base(name) || name == opt.Name {
		return standin.Dir{}, fmt.Errorf("stand-in name %q: want the plain file name of another plugin (whereabouts)", name)
	}
	return standin.Dir{
		Path: opt.BinDir, Name: name, Self: opt.Source,
		Probe: func(ctx context.Context, path string) error {
			o := opt
			o.Require = []string{}
			_, err := versions(ctx, path, o)
			return err
		},
	}, nil
}

// StandIn puts harvester-ipam at BinDir/name and keeps the real binary at
// standin.Aside, under the installers' lock; see standin.Dir.Take (claim:
// replace another build of harvester-ipam at the name). With no real binary
// anywhere yet it writes nothing and returns standin.ErrNoReal: its own
// installer has not run; Watch sees it when it does.
func StandIn(ctx context.Context, opt Options, name string, claim bool) (changed bool, err error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return false, err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, err
	}
	defer unlock()
	return d.Take(ctx, claim)
}

// GiveBack puts the real binary back at BinDir/name, byte for byte, and
// removes the aside and the stand-in's record, under the installers' lock:
// the operator's give-back, whichever release took the name.
func GiveBack(ctx context.Context, opt Options, name string) error {
	d, err := StandInDir(opt, name)
	if err != nil {
		return err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := d.GiveBack(ctx); err != nil {
		return err
	}
	// By hand, whoever took the name: the record goes, and the lock files
	// no installer holds.
	removeDeadAlive(opt.BinDir)
	return removeRecord(opt.BinDir, name)
}

// Stop is what the installer does when told to stop (standin.Dir.Stop):
// it gives BinDir/name back, under the installers' lock, only when removing
// says this is an uninstall.
func Stop(ctx context.Context, opt Options, name string, removing func(context.Context) (bool, string)) (gaveBack bool, why string, err error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return false, "", err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, "", err
	}
	defer unlock()
	return d.Stop(ctx, removing)
}

// VerifyStandIn checks what a readiness probe asks of the stand-in
// (standin.Dir.Ready): harvester-ipam under its own name is the image's and
// runs, and either it stands in or there is nothing to stand in for. It says
// which, and writes nothing.
func VerifyStandIn(ctx context.Context, opt Options, name string) (string, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return "", err
	}
	return d.Ready(ctx)
}

// VerifyGivenBack checks, after the stand-in was turned off, that name is
// the real binary's again (Dir.GivenBack); while harvester-ipam is still
// there, the error says which release's record holds it.
func VerifyGivenBack(ctx context.Context, opt Options, name string) (string, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return "", err
	}
	state, err := d.GivenBack(ctx)
	if err != nil {
		if rec, ok, rerr := ReadRecord(opt.BinDir, name); rerr == nil && ok {
			err = fmt.Errorf("%w; release %s holds it (pod %s)", err, rec.Release, rec.Pod)
		}
	}
	return state, err
}

// IsGivenBack says whether VerifyGivenBack finds name given back.
func IsGivenBack(ctx context.Context, opt Options, name string) bool {
	_, err := VerifyGivenBack(ctx, opt, name)
	return err == nil
}

// Role is what the stand-in's record makes of an installer.
type Role int

const (
	// Holder: it stands in (it takes the name, replacing any other build
	// of harvester-ipam there).
	Holder Role = iota
	// Superseded: a pod of its release that started later holds the name.
	Superseded
	// Lost: another release holds the name and runs on the node.
	Lost
)

// Standing is what StandInAs did.
type Standing struct {
	Role    Role
	Changed bool   // it wrote the name or the aside
	Why     string // for Superseded and Lost, and a take-over
}

// StandInAs is StandIn for an installer of a release, under the installers'
// lock: it reads the stand-in's record first. The name is its release's when
// no record is there, when the record names its release (a pod that starts
// takes over from the one before: a restart, a rollout), or when the record
// names another release none of whose installers runs on the node any more
// (it left without giving the name back). Another release that runs on the
// node keeps it: two releases never undo each other, and the one that did
// not take it says so. A later pod of its own release keeps it too (start is
// false after an installer's first call). When the name is its release's,
// the record names this pod, and Take replaces any other build at the name.
func StandInAs(ctx context.Context, opt Options, name string, me Identity, hostDir string, start bool) (Standing, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return Standing{}, err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return Standing{}, err
	}
	defer unlock()
	rec, ok, err := ReadRecord(opt.BinDir, name)
	if err != nil {
		return Standing{}, err
	}
	st := Standing{Role: Holder}
	switch {
	case !ok:
	case rec.Release == me.Release():
		if rec.Pod != me.Pod && !start {
			return Standing{Role: Superseded, Why: fmt.Sprintf("pod %s of this release (%s) holds %s now", rec.Pod, rec.Release, d.Name)}, nil
		}
	default:
		alive, err := IsAlive(opt.BinDir, rec.Release)
		if err != nil || alive {
			return Standing{Role: Lost, Why: fmt.Sprintf("release %s (pod %s) stands in for %s in %s; this release (%s) does not fight it, and takes the name if that one gives it back", rec.Release, rec.Pod, name, opt.BinDir, me.Release())}, nil
		}
		st.Why = fmt.Sprintf("release %s, which stood in for %s, has no installer on this node any more: %s takes the name over", rec.Release, name, me.Release())
	}
	if !ok || rec.Release != me.Release() || rec.Pod != me.Pod {
		if err := writeRecord(opt.BinDir, Record{Name: name, Release: me.Release(), Pod: me.Pod, HostDir: hostDir}); err != nil {
			return st, err
		}
	}
	st.Changed, err = d.Take(ctx, true)
	return st, err
}

// GiveBackReleased gives back, in opt's bin dir, every name that me's
// release stands in for there but keep (the name it stands in for now, ""
// none): its stand-in was turned off, or moved to another name, by a later
// revision of its chart, and this pod runs that revision. It removes their
// records. unrecorded ("" none) is a name this revision does not stand in
// for where harvester-ipam found with no record at all is given back too:
// it was put there by a release from before the records (an upgrade from it
// that turns the stand-in off: its pods keep the name as they stop). An
// installer run by hand gives back nothing this way.
func GiveBackReleased(ctx context.Context, opt Options, me Identity, keep, unrecorded string) (given []string, err error) {
	if me.DaemonSet == "" {
		return nil, nil
	}
	if err := opt.defaults(); err != nil {
		return nil, err
	}
	recs, err := Records(opt.BinDir)
	if err != nil {
		return nil, err
	}
	if unrecorded != "" && unrecorded != keep && standin.IsHarvesterIPAM(filepath.Join(opt.BinDir, unrecorded)) {
		if _, ok, err := ReadRecord(opt.BinDir, unrecorded); err == nil && !ok {
			recs = append(recs, Record{Name: unrecorded, Release: me.Release()})
		}
	}
	for _, rec := range recs {
		if rec.Release != me.Release() || rec.Name == keep {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a writer still writing: the next pass
		err := giveBackAndForget(gctx, opt, rec.Name, func(r Record) bool { return r.Release == me.Release() })
		cancel()
		if err != nil {
			return given, fmt.Errorf("give %s back (this release stands in for it no more): %w", rec.Name, err)
		}
		given = append(given, rec.Name)
	}
	if keep == "" && len(given) > 0 {
		_ = removeAlive(opt.BinDir, me.Release())
	}
	return given, nil
}

// giveBackAndForget gives name back and removes its record, under the
// installers' lock, when mine says the record (if any) is the caller's to
// give back. A give-back that finds no real binary forgets the record when
// no harvester-ipam is at the name either (nothing was stood in for).
func giveBackAndForget(ctx context.Context, opt Options, name string, mine func(Record) bool) error {
	d, err := StandInDir(opt, name)
	if err != nil {
		return err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return err
	}
	defer unlock()
	if rec, ok, err := ReadRecord(opt.BinDir, name); err != nil {
		return err
	} else if ok && !mine(rec) {
		return nil
	}
	err = d.GiveBack(ctx)
	if errors.Is(err, standin.ErrNoReal) && !standin.IsHarvesterIPAM(filepath.Join(opt.BinDir, name)) {
		err = nil
	}
	if err != nil {
		return err
	}
	return removeRecord(opt.BinDir, name)
}

// StopAs is Stop for an installer of a release: it gives the name back only
// when its release holds it (the record names it, or there is none) and
// removing says the chart no longer stands in here; then it removes the
// record and the release's lock file. Another release's name is never given
// back.
func StopAs(ctx context.Context, opt Options, name string, me Identity, removing func(context.Context) (bool, string)) (gaveBack bool, why string, err error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return false, "", err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, "", err
	}
	defer unlock()
	rec, ok, err := ReadRecord(opt.BinDir, name)
	if err != nil {
		return false, "", err
	}
	if ok && rec.Release != me.Release() {
		// Another release's name: never given back. When this release
		// leaves the node, its lock file goes with it.
		if leaves, why := removing(ctx); leaves {
			return false, fmt.Sprintf("%s; release %s holds %s, not this one", why, rec.Release, name), removeAlive(opt.BinDir, me.Release())
		}
		return false, fmt.Sprintf("release %s holds %s, not this one", rec.Release, name), nil
	}
	gaveBack, why, err = d.Stop(ctx, removing)
	if gaveBack && errors.Is(err, standin.ErrNoReal) && !standin.IsHarvesterIPAM(filepath.Join(d.Path, name)) {
		err = nil // nothing was stood in for
	}
	if !gaveBack || err != nil {
		return gaveBack, why, err
	}
	if err := removeRecord(opt.BinDir, name); err != nil {
		return true, why, err
	}
	return true, why, removeAlive(opt.BinDir, me.Release())
}

// VerifyStandInAs is VerifyStandIn for an installer of a release: while
// another release stands in at the name and runs on the node, this one is
// ready too (it does not fight, and a rollout or helm --wait must not wait
// on it), and says so.
func VerifyStandInAs(ctx context.Context, opt Options, name string, me Identity) (string, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return "", err
	}
	rec, ok, err := ReadRecord(opt.BinDir, name)
	if err == nil && ok && rec.Release != me.Release() && me.Release() != ByHand {
		if alive, err := IsAlive(opt.BinDir, rec.Release); err == nil && alive {
			return fmt.Sprintf("release %s (pod %s) stands in for %s at %s; this release (%s) does not fight it, and stands in once that one gives the name back",
				rec.Release, rec.Pod, name, filepath.Join(opt.BinDir, name), me.Release()), nil
		}
	}
	state, err := d.Ready(ctx)
	if err == nil && ok && me.Release() == ByHand {
		// An operator's check: the stand-in as it is, and whose it is.
		state = fmt.Sprintf("%s; release %s holds it (pod %s)", state, rec.Release, rec.Pod)
	}
	return state, err
}

// KeepWatching runs watch (the stand-in's inotify watch) until ctx ends.
// When it cannot start, as when inotify_init1 answers EMFILE because
// fs.inotify.max_user_instances (shared by every process of the user on the
// node) is used up, it says so once through warn and tries again every
// interval; meanwhile the installer's interval pass takes the name again,
// later but as surely, and the installer stays ready.
func KeepWatching(ctx context.Context, interval time.Duration, watch func(context.Context) error, warn func(error)) {
	warned := false
	for {
		err := watch(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if !warned {
			warn(err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
