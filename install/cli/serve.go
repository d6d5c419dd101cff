package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/harvester/harvester-ipam/install"
	"github.com/harvester/harvester-ipam/install/standin"
)

// serve installs (and stands in), then with an interval keeps it so: again
// whenever the stand-in's name is written and every interval. Stopped (ctx
// done), it gives the name back only when its DaemonSet is gone or being
// deleted (helm uninstall).
func (r *runner) serve(ctx context.Context) error {
	c := r.cfg
	t := &taker{opt: r.opt, name: c.StandIn, me: r.me, hostDir: c.HostCNIBinDir, logf: r.logf}
	if c.StandIn == "" || c.Interval <= 0 {
		return r.loop(ctx, t)
	}
	if c.DaemonSet != "" {
		var err error
		if t.ds, err = install.NewOwner(c.Kubeconfig, c.Namespace, c.DaemonSet, install.Place{Name: c.StandIn, HostDir: c.HostCNIBinDir, Node: c.NodeName}); err != nil {
			return err
		}
		// The watches outlive the stop (onStop runs first): a stop whose
		// reads are refused goes by what they last saw.
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		r.watchOwner(ctx, wctx, t.ds)
	}
	// A shared lock that says a pod of this release runs on the node, held
	// until the process ends: another release does not take the name over
	// from it.
	if _, err := install.HoldAlive(r.opt.BinDir, r.me.Release()); err != nil {
		r.logf("warning: %v", err)
	}
	go install.KeepWatching(ctx, c.Interval, func(ctx context.Context) error {
		return standin.Watch(ctx, r.opt.BinDir, c.StandIn, func() { t.take(ctx, false) })
	}, func(err error) {
		r.logf("warning: cannot watch %s (%v): harvester-ipam takes %s again every --interval (%s) instead of at once, until it can (raise fs.inotify.max_user_instances on the node)", r.opt.BinDir, err, c.StandIn, c.Interval)
	})
	if err := r.loop(ctx, t); err != nil {
		return err
	}
	r.onStop(ctx, t.ds)
	return nil
}

// watchOwner starts the watches of the DaemonSet, its namespace and the
// node (for as long as wctx), says once they have seen it, and reads the
// DaemonSet once now.
func (r *runner) watchOwner(ctx, wctx context.Context, ds *install.Owner) {
	c := r.cfg
	ds.Watch(wctx)
	go func() {
		for ctx.Err() == nil {
			if _, ok := ds.Seen(); ok {
				r.logf("watching DaemonSet %s/%s, its namespace and node %q: a stop whose reads are refused goes by what they last showed", c.Namespace, c.DaemonSet, c.NodeName)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// Said now, not only when it matters: a stop must read it.
	if _, err := ds.Get(ctx); err != nil {
		r.logf("warning: cannot read DaemonSet %s/%s (%v): when stopped, harvester-ipam keeps standing in unless it can tell the chart no longer does", c.Namespace, c.DaemonSet, err)
	}
}

// loop installs, then every interval again until ctx is done; with no
// interval, once. Its error is an install that failed: the pod restarts
// with back-off and the failure shows in its status, rather than in a log
// nobody reads.
func (r *runner) loop(ctx context.Context, t *taker) error {
	for first := true; ; first = false {
		res, err := r.pass(ctx, t, first)
		if err != nil {
			if ctx.Err() != nil {
				return nil // terminated while waiting: nothing was changed
			}
			return err
		}
		if r.cfg.Interval <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			// The binary stays under its own name: pods attached through a
			// NAD naming it need it for their DEL.
			r.logf("terminating; %s stays installed", res.Path)
			return nil
		case <-time.After(r.cfg.Interval):
		}
	}
}

// pass is one pass of the loop: install, give back what this release no
// longer stands in for, stand in, write the node's settings, warn.
func (r *runner) pass(ctx context.Context, t *taker, first bool) (install.Result, error) {
	c := r.cfg
	res, why, err := install.InstallAs(ctx, r.opt, c.StandIn, r.me)
	if why != r.leaves {
		if why != "" {
			r.logf("%s", why)
		}
		r.leaves = why
	}
	if err != nil {
		return res, err
	}
	if res.Changed {
		r.logf("installed %s (%s; CNI %s)", res.Path, res.About, strings.Join(res.Supported, ", "))
	} else if first && why == "" {
		r.logf("%s is up to date (%s)", res.Path, res.About)
	}
	if c.DaemonSet != "" {
		// The stand-in turned off, or moved to another name, by the
		// revision this pod runs: what an earlier pod of this release took
		// is given back.
		given, err := install.GiveBackReleased(ctx, r.opt, r.me, c.StandIn, c.NotStandIn)
		for _, name := range given {
			r.logf("gave %s back to the real binary: this release (%s) no longer stands in for it", filepath.Join(r.opt.BinDir, name), r.me.Release())
		}
		if err != nil && ctx.Err() == nil {
			r.logf("error: %v", err)
		}
	}
	if c.StandIn != "" {
		t.take(ctx, first)
	}
	if c.NodeConfig != "" {
		if changed, err := install.WriteNodeConfig(c.NodeConfig, c.Node); err != nil {
			r.logf("error: the node's settings %s: %v", c.NodeConfig, err)
		} else if changed {
			r.logf("the node's settings %s now say log level %q, log file %q (empty: whereabouts')", c.NodeConfig, c.Node.LogLevel, c.Node.LogFile)
		}
	}
	// Warnings only when they change: the loop runs every interval.
	if w := strings.Join(install.Preflight(r.opt.BinDir, c.Delegate, c.FlatFile), "\n"); w != r.warned {
		if w != "" {
			r.logf("warning: %s", strings.ReplaceAll(w, "\n", "\nwarning: "))
		} else if r.warned != "" {
			r.logf("whereabouts and its flat file are in place now")
		}
		r.warned = w
	}
	return res, nil
}

// taker stands in (again) for the main loop and the watcher.
type taker struct {
	opt           install.Options
	name, hostDir string
	me            install.Identity
	ds            *install.Owner // nil: no DaemonSet to watch
	logf          func(format string, args ...any)
	mu            sync.Mutex
	said          string // the last state logged that is not an event
	started       bool   // the first take (the main loop's) has run
}

// note logs a state once, not at every pass.
func (t *taker) note(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if msg != t.said {
		t.said = msg
		if msg != "" {
			t.logf("%s", msg)
		}
	}
}

// take stands in (again); a failure is logged, not fatal: the name is
// whole either way, and the next event or interval tries again. The first
// run of a pod takes the name over from the pod of its release before it
// (a restart, a rollout); a later pod's takes it over from this one. Of two
// releases, the one that took the name first keeps it while it runs here.
// While the chart's newest revision no longer stands in here (this pod is
// about to be replaced, or stopped), it takes nothing.
func (t *taker) take(ctx context.Context, first bool) {
	t.mu.Lock()
	started := t.started || first
	t.started = started
	t.mu.Unlock()
	if !first && !started {
		return // the watcher, before the main loop's first take: that one looks
	}
	at := filepath.Join(t.opt.BinDir, t.name)
	if t.ds != nil {
		if ok, why := t.ds.StillStandsIn(); !ok {
			t.note(fmt.Sprintf("not taking %s: %s (it is given back when this pod stops)", at, why))
			return
		}
	}
	st, err := install.StandInAs(ctx, t.opt, t.name, t.me, t.hostDir, first)
	switch {
	case st.Role == install.Superseded:
		t.note(fmt.Sprintf("leaves %s to the pod that replaces this one: %s", at, st.Why))
		return
	case st.Role == install.Lost:
		t.note(fmt.Sprintf("does not stand in at %s: %s", at, st.Why))
		return
	case st.Why != "":
		t.logf("%s", st.Why)
	}
	switch {
	case errors.Is(err, standin.ErrNoReal):
		t.note(fmt.Sprintf("nothing to stand in for yet: %v", err))
	case errors.Is(err, standin.ErrPending), errors.Is(err, standin.ErrAnotherBuild):
		t.logf("%v", err)
	case err != nil && ctx.Err() == nil:
		t.logf("error: stand in for %s: %v", t.name, err)
	case err == nil && st.Changed:
		t.note("")
		t.logf("harvester-ipam stands in at %s; the real binary is at %s", at, standin.Aside(at))
	case err == nil:
		t.note("")
	}
}

// stopReadLimit bounds a stop's reads of the chart (Owner.Removing: three
// reads of the DaemonSet, a second apart, then of the namespace and the
// node; or a refused read, then up to 5 s on the watches): the pod's grace
// period is 30 s, and giving back needs the rest.
const stopReadLimit = 15 * time.Second

// onStop runs when the installer is told to stop. Only a chart that no
// longer stands in on this node (uninstalled, turned off, moved, not
// running here) gets the name back: a rollout, a restart, a node's shutdown
// or a force-deleted pod would otherwise hand the node to whereabouts alone
// exactly when Longhorn's pods get new sandboxes. When it cannot tell, it
// keeps the name: harvester-ipam runs whereabouts for every ADD.
func (r *runner) onStop(ctx context.Context, ds *install.Owner) {
	if ctx.Err() == nil {
		return // exits after one install (--interval 0): the stand-in stays
	}
	name := r.cfg.StandIn
	at := filepath.Join(r.opt.BinDir, name)
	if ds == nil {
		r.logf("terminating; harvester-ipam keeps standing in at %s (no --daemonset to tell an uninstall from a restart; --give-back gives it back)", at)
		return
	}
	removing := func(context.Context) (bool, string) {
		rctx, cancel := context.WithTimeout(context.Background(), stopReadLimit)
		defer cancel()
		rm := ds.Removing(rctx, time.Sleep)
		if rm.GiveBack {
			r.logf("terminating; %s: the chart no longer stands in here, so %s goes back to the real binary", rm.Why, at)
		}
		return rm.GiveBack, rm.Why
	}
	gctx, cancel := context.WithTimeout(context.Background(), 27*time.Second)
	defer cancel()
	gaveBack, why, err := install.StopAs(gctx, r.opt, name, r.me, removing)
	switch {
	case err != nil:
		r.logf("error: give %s back: %v", name, err)
	case gaveBack:
		r.logf("gave %s back to the real binary", at)
	default:
		r.logf("terminating; %s: harvester-ipam keeps standing in at %s", why, at)
	}
}
