// Command harvester-ipam-install puts harvester-ipam into the host's CNI bin
// dir, beside whereabouts, and with --stand-in=whereabouts in whereabouts'
// place (the real binary kept aside). The chart's DaemonSet runs it on every
// node: once at start, then again whenever the stand-in's name is written
// (inotify; every --interval when it cannot watch) and every --interval, so
// that a binary removed or replaced on the host comes back. Stopped, it
// gives the stand-in's name back only when the chart no longer stands in on
// the node (its DaemonSet, --daemonset, gone or being deleted, its namespace
// being deleted, its newest revision not standing in at that name and dir,
// or not running on this node). A restart, a rollout, a node's shutdown or
// a force-deleted pod keeps harvester-ipam standing in. Started with its
// stand-in turned off, or moved to another name, it gives back what an
// earlier pod of its release took (the bin dir's record of the stand-in
// says which). Of two releases on one node, the one whose installer took
// the name first keeps it; the other says so and is ready. With --verify it
// only checks (the readiness probe); --give-back gives the name back and
// exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/install"
	"github.com/harvester/harvester-ipam/install/standin"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

const usage = `harvester-ipam-install %s: puts harvester-ipam into a node's CNI bin dir and,
with --stand-in=whereabouts, stands it in for whereabouts (harvester-ipam at
the name, the real binary kept at <name>.real). The chart's DaemonSet runs it
on every node; a person runs --verify or --give-back.

Modes:
  (default)    install (and stand in), then with --interval keep it so: again
               whenever the stand-in's name is written and every interval.
               Stopped (SIGTERM), it gives the name back only when its
               --daemonset is gone or being deleted (helm uninstall).
  --verify     check only: harvester-ipam installed and runs, and with
               --stand-in it stands in (or there is nothing to stand in for);
               with --not-stand-in (the stand-in turned off) the real binary
               is back at the name and nothing is aside; prints what it
               found. The chart's probes run this.
  --give-back  with --stand-in: put the real binary back at the name, remove
               <name>.real, and exit (a node that missed an uninstall).
  --version    print the version.

Exit status: 0 done (--verify: in order); 1 failed, the reason on stderr
(--verify: not in order, and what is wrong); 2 bad flags.

In the chart's pod the host's CNI bin dir is /host/opt/cni/bin (the
defaults below); on a node's own shell give --cni-bin-dir /opt/cni/bin.

Flags:
`

func main() {
	var (
		opt      install.Options
		interval time.Duration
		verify   bool
		delegate string
		flatFile string
		require  string
		standIn  string
		giveBack bool
		owner    string
		ns       string
		kubecfg  string
		nodeConf string
		node     conf.NodeConfig
		hostDir  string
		nodeName string
		pod      string
		notFor   string
	)
	flag.StringVar(&opt.Source, "source", "/usr/bin/harvester-ipam", "the binary to install")
	flag.StringVar(&opt.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin dir, as mounted")
	flag.StringVar(&opt.Name, "name", "harvester-ipam", "the file name in the CNI bin dir (the type NADs name)")
	flag.StringVar(&require, "require-cni-versions", "0.3.1", "comma-separated CNI versions the binary must support")
	flag.DurationVar(&opt.Timeout, "timeout", 10*time.Second, "limit of each run of the binary")
	flag.DurationVar(&interval, "interval", 0, "check and reinstall every interval; 0 installs once and exits")
	flag.BoolVar(&verify, "verify", false, "only check that the installed binary is the source and runs (exit 1 if not)")
	flag.StringVar(&delegate, "delegate", "whereabouts", "the delegate to look for beside it (a warning when missing; \"\" skips)")
	flag.StringVar(&flatFile, "flat-file", "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf", "whereabouts' flat file, as mounted (a warning when missing; \"\" skips)")
	flag.StringVar(&standIn, "stand-in", "", "also stand in for this plugin (whereabouts): harvester-ipam at its name, the real binary at <name>"+standin.RealSuffix+"; \"\" does not")
	flag.BoolVar(&giveBack, "give-back", false, "give the --stand-in name back to the real binary and exit")
	flag.StringVar(&owner, "daemonset", "", "this installer's DaemonSet: stopped, the --stand-in name is given back only when it no longer stands in on this node (gone, being deleted, its namespace being deleted, turned off, or not running here); started, what an earlier pod of it stood in for and it no longer does is given back; \"\" never gives it back when stopped")
	flag.StringVar(&ns, "namespace", os.Getenv("POD_NAMESPACE"), "the --daemonset's namespace")
	flag.StringVar(&kubecfg, "kubeconfig", "", "a kubeconfig to read the --daemonset with; \"\" is the pod's service account")
	flag.StringVar(&nodeConf, "node-config", "", "the node's settings file for harvester-ipam, as mounted (the host's "+conf.DefaultNodeConfig+"); kept as --log-level and --log-file say, removed when both are empty; \"\" leaves it alone")
	flag.StringVar(&node.LogLevel, "log-level", "", "with --node-config: harvester-ipam's log level on this node (debug, verbose, error), over whereabouts' log_level; \"\" is whereabouts'")
	flag.StringVar(&node.LogFile, "log-file", "", "with --node-config: harvester-ipam's log file on this node (a host path), over whereabouts' log_file; \"\" is whereabouts'")
	flag.StringVar(&hostDir, "host-cni-bin-dir", "", "the --cni-bin-dir's path on the host (the chart's hostPaths.cniBinDir): a DaemonSet that stands in in another dir now gives this one back; \"\" does not check")
	flag.StringVar(&nodeName, "node", os.Getenv("NODE_NAME"), "the node this runs on: a DaemonSet that no longer runs on it gives the name back; \"\" does not check")
	flag.StringVar(&pod, "pod", os.Getenv("POD_NAME"), "this pod's name, in the stand-in's record; \"\" is this process")
	flag.StringVar(&notFor, "not-stand-in", "", "a name this DaemonSet does not stand in for (the chart's standIn.name, turned off): harvester-ipam found there with no record of who put it there (a release from before the records) is given back")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), usage, Version)
		flag.PrintDefaults()
	}
	flag.Parse()
	if *version {
		fmt.Println("harvester-ipam-install", Version)
		return
	}
	if flag.NArg() > 0 {
		badUsage(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if err := node.Validate(); err != nil {
		badUsage(err)
	}
	if standIn != "" && standIn == notFor {
		badUsage(fmt.Errorf("--stand-in and --not-stand-in both name %s", standIn))
	}
	if require != "" {
		opt.Require = strings.Split(require, ",")
	} else {
		opt.Require = []string{}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if pod == "" {
		host, _ := os.Hostname()
		pod = fmt.Sprintf("pid %d on %s", os.Getpid(), host)
	}
	me := install.Identity{Namespace: ns, DaemonSet: owner, Pod: pod}

	if giveBack {
		if standIn == "" {
			badUsage(fmt.Errorf("--give-back needs --stand-in, the name to give back"))
		}
		gctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := install.GiveBack(gctx, opt, standIn); err != nil {
			fail(err)
		}
		logf("gave %s back to the real binary", standIn)
		return
	}
	if verify {
		res, err := install.VerifyAs(ctx, opt, standIn, me)
		if err != nil {
			fail(err)
		}
		fmt.Printf("%s is installed and runs: %s\n", res.Path, res.About)
		// Both binaries by what they say and their bytes: which
		// harvester-ipam, which whereabouts.
		describe := func(name string) {
			at := filepath.Join(opt.BinDir, name)
			for _, p := range []string{at, standin.Aside(at)} {
				if _, err := os.Stat(p); err != nil {
					continue // nothing there: said above
				}
				d, err := install.Describe(ctx, p, opt)
				if err != nil {
					fail(err)
				}
				fmt.Println(d)
			}
		}
		if standIn != "" {
			state, err := install.VerifyStandInAs(ctx, opt, standIn, me)
			if err != nil {
				if owner == "" && install.IsGivenBack(ctx, opt, standIn) {
					// An operator's check after the stand-in was turned off.
					err = fmt.Errorf("%w (the stand-in turned off? check its give-back with --verify --not-stand-in=%s)", err, standIn)
				}
				fail(err)
			}
			fmt.Println(state)
			describe(standIn)
		} else if notFor != "" {
			// The stand-in turned off: the real binary back at the name.
			state, err := install.VerifyGivenBack(ctx, opt, notFor)
			if err != nil {
				fail(err)
			}
			fmt.Println(state)
			describe(notFor)
		}
		return
	}
	t := &taker{opt: opt, name: standIn, me: me, hostDir: hostDir}
	if standIn != "" && interval > 0 {
		if owner != "" {
			var err error
			if t.ds, err = install.NewOwner(kubecfg, ns, owner, install.Place{Name: standIn, HostDir: hostDir, Node: nodeName}); err != nil {
				fail(err)
			}
			// The watches outlive the stop (onStop runs first): a stop
			// whose reads are refused goes by what they last saw.
			wctx, wcancel := context.WithCancel(context.Background())
			defer wcancel()
			t.ds.Watch(wctx)
			go func() {
				for ctx.Err() == nil {
					if _, ok := t.ds.Seen(); ok {
						logf("watching DaemonSet %s/%s, its namespace and node %q: a stop whose reads are refused goes by what they last showed", ns, owner, nodeName)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
			// Said now, not only when it matters: a stop must read it.
			if _, err := t.ds.Get(ctx); err != nil {
				logf("warning: cannot read DaemonSet %s/%s (%v): when stopped, harvester-ipam keeps standing in unless it can tell the chart no longer does", ns, owner, err)
			}
		}
		// A shared lock that says a pod of this release runs on the node,
		// held until the process ends: another release does not take the
		// name over from it.
		if _, err := install.HoldAlive(opt.BinDir, me.Release()); err != nil {
			logf("warning: %v", err)
		}
		defer onStop(ctx, opt, standIn, me, t.ds)
		go install.KeepWatching(ctx, interval, func(ctx context.Context) error {
			return standin.Watch(ctx, opt.BinDir, standIn, func() { t.take(ctx, false) })
		}, func(err error) {
			logf("warning: cannot watch %s (%v): harvester-ipam takes %s again every --interval (%s) instead of at once, until it can (raise fs.inotify.max_user_instances on the node)", opt.BinDir, err, standIn, interval)
		})
	}

	var warned, leaves string
	for first := true; ; first = false {
		res, why, err := install.InstallAs(ctx, opt, standIn, me)
		if why != leaves {
			if why != "" {
				logf("%s", why)
			}
			leaves = why
		}
		if err != nil {
			if ctx.Err() != nil {
				return // terminated while waiting: nothing was changed
			}
			// Exit: the pod restarts with back-off and the failure shows in
			// its status, rather than in a log nobody reads.
			fail(err)
		}
		if res.Changed {
			logf("installed %s (%s; CNI %s)", res.Path, res.About, strings.Join(res.Supported, ", "))
		} else if first && why == "" {
			logf("%s is up to date (%s)", res.Path, res.About)
		}
		if owner != "" {
			// The stand-in turned off, or moved to another name, by the
			// revision this pod runs: what an earlier pod of this release
			// took is given back.
			given, err := install.GiveBackReleased(ctx, opt, me, standIn, notFor)
			for _, name := range given {
				logf("gave %s back to the real binary: this release (%s) no longer stands in for it", filepath.Join(opt.BinDir, name), me.Release())
			}
			if err != nil && ctx.Err() == nil {
				logf("error: %v", err)
			}
		}
		if standIn != "" {
			t.take(ctx, first)
		}
		if nodeConf != "" {
			if changed, err := install.WriteNodeConfig(nodeConf, node); err != nil {
				logf("error: the node's settings %s: %v", nodeConf, err)
			} else if changed {
				logf("the node's settings %s now say log level %q, log file %q (empty: whereabouts')", nodeConf, node.LogLevel, node.LogFile)
			}
		}
		// Warnings only when they change: the loop runs every interval.
		if w := strings.Join(install.Preflight(opt.BinDir, delegate, flatFile), "\n"); w != warned {
			if w != "" {
				logf("warning: %s", strings.ReplaceAll(w, "\n", "\nwarning: "))
			} else if warned != "" {
				logf("whereabouts and its flat file are in place now")
			}
			warned = w
		}
		if interval <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			// The binary stays under its own name: pods attached through a
			// NAD naming it need it for their DEL.
			logf("terminating; %s stays installed", res.Path)
			return
		case <-time.After(interval):
		}
	}
}

// taker stands in (again) for the main loop and the watcher.
type taker struct {
	opt           install.Options
	name, hostDir string
	me            install.Identity
	ds            *install.Owner // nil: no DaemonSet to watch
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
			logf("%s", msg)
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
		logf("%s", st.Why)
	}
	switch {
	case errors.Is(err, standin.ErrNoReal):
		t.note(fmt.Sprintf("nothing to stand in for yet: %v", err))
	case errors.Is(err, standin.ErrPending), errors.Is(err, standin.ErrAnotherBuild):
		logf("%v", err)
	case err != nil && ctx.Err() == nil:
		logf("error: stand in for %s: %v", t.name, err)
	case err == nil && st.Changed:
		t.note("")
		logf("harvester-ipam stands in at %s; the real binary is at %s", at, standin.Aside(at))
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
func onStop(ctx context.Context, opt install.Options, name string, me install.Identity, ds *install.Owner) {
	if ctx.Err() == nil {
		return // exits after one install (--interval 0): the stand-in stays
	}
	at := filepath.Join(opt.BinDir, name)
	if ds == nil {
		logf("terminating; harvester-ipam keeps standing in at %s (no --daemonset to tell an uninstall from a restart; --give-back gives it back)", at)
		return
	}
	removing := func(context.Context) (bool, string) {
		rctx, cancel := context.WithTimeout(context.Background(), stopReadLimit)
		defer cancel()
		r := ds.Removing(rctx, time.Sleep)
		if r.GiveBack {
			logf("terminating; %s: the chart no longer stands in here, so %s goes back to the real binary", r.Why, at)
		}
		return r.GiveBack, r.Why
	}
	gctx, cancel := context.WithTimeout(context.Background(), 27*time.Second)
	defer cancel()
	gaveBack, why, err := install.StopAs(gctx, opt, name, me, removing)
	switch {
	case err != nil:
		logf("error: give %s back: %v", name, err)
	case gaveBack:
		logf("gave %s back to the real binary", at)
	default:
		logf("terminating; %s: harvester-ipam keeps standing in at %s", why, at)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s harvester-ipam-install: %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}

// badUsage is a command line that cannot run: exit 2, as the flag package
// does for an unknown flag.
func badUsage(err error) {
	fmt.Fprintf(os.Stderr, "harvester-ipam-install: %v (see --help)\n", err)
	os.Exit(2)
}

func fail(err error) {
	logf("error: %v", err)
	os.Exit(1)
}
