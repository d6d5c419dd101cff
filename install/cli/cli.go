// Package cli is harvester-ipam-install's command, its flags aside: it puts
// harvester-ipam into the host's CNI bin dir, beside whereabouts, and with a
// stand-in name in whereabouts' place (the real binary kept aside). The
// chart's DaemonSet runs it on every node: once at start, then again
// whenever the stand-in's name is written (inotify; every interval when it
// cannot watch) and every interval, so that a binary removed or replaced on
// the host comes back. Stopped, it gives the stand-in's name back only when
// the chart no longer stands in on the node (its DaemonSet gone or being
// deleted, its namespace being deleted, its newest revision not standing in
// at that name and dir, or not running on this node). A restart, a rollout,
// a node's shutdown or a force-deleted pod keeps harvester-ipam standing in.
// Started with its stand-in turned off, or moved to another name, it gives
// back what an earlier pod of its release took (the bin dir's record of the
// stand-in says which). Of two releases on one node, the one whose
// installer took the name first keeps it; the other says so and is ready.
// Verify only checks (the readiness probe); GiveBack gives the name back
// and returns.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/install"
	"github.com/harvester/harvester-ipam/install/standin"
)

// Name is the command's name, in its log lines and errors.
const Name = "harvester-ipam-install"

// Config is the command line, each field a flag (cmd/harvester-ipam-install
// says which and what it defaults to).
type Config struct {
	Args          []string // arguments left after the flags: none is right
	Install       install.Options
	Require       string        // --require-cni-versions, comma-separated (Install.Require is set from it)
	Interval      time.Duration // 0: install once and return
	Verify        bool
	Delegate      string
	FlatFile      string
	StandIn       string
	GiveBack      bool
	DaemonSet     string
	Namespace     string
	Kubeconfig    string
	NodeConfig    string
	Node          conf.NodeConfig
	HostCNIBinDir string
	NodeName      string
	Pod           string // "": this process
	NotStandIn    string

	Stdout, Stderr io.Writer // nil: os.Stdout, os.Stderr
}

// UsageError is a command line that cannot run: exit 2, as the flag package
// exits for an unknown flag.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Main runs the command and returns its exit status: 0 done (Verify: in
// order); 1 failed, the reason logged (Verify: not in order, and what is
// wrong); 2 a command line that cannot run.
func Main(ctx context.Context, cfg Config) int {
	r := newRunner(cfg)
	err := r.run(ctx)
	var ue UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(r.stderr, "%s: %v (see --help)\n", Name, err)
		return 2
	default:
		r.logf("error: %v", err)
		return 1
	}
}

// Validate says whether the command line can run; its error is a
// UsageError.
func (c *Config) Validate() error {
	if len(c.Args) > 0 {
		return UsageError{fmt.Errorf("unexpected arguments %q", c.Args)}
	}
	if err := c.Node.Validate(); err != nil {
		return UsageError{err}
	}
	if c.StandIn != "" && c.StandIn == c.NotStandIn {
		return UsageError{fmt.Errorf("--stand-in and --not-stand-in both name %s", c.StandIn)}
	}
	if c.GiveBack && c.StandIn == "" {
		return UsageError{errors.New("--give-back needs --stand-in, the name to give back")}
	}
	return nil
}

// runner is one run of the command.
type runner struct {
	cfg            Config
	opt            install.Options
	me             install.Identity
	stdout, stderr io.Writer
	warned, leaves string // the main loop's last warnings and why it leaves the name
}

func newRunner(cfg Config) *runner {
	r := &runner{cfg: cfg, opt: cfg.Install, stdout: cfg.Stdout, stderr: cfg.Stderr}
	if r.stdout == nil {
		r.stdout = os.Stdout
	}
	if r.stderr == nil {
		r.stderr = os.Stderr
	}
	if cfg.Require != "" {
		r.opt.Require = strings.Split(cfg.Require, ",")
	} else {
		r.opt.Require = []string{}
	}
	pod := cfg.Pod
	if pod == "" {
		host, _ := os.Hostname()
		pod = fmt.Sprintf("pid %d on %s", os.Getpid(), host)
	}
	r.me = install.Identity{Namespace: cfg.Namespace, DaemonSet: cfg.DaemonSet, Pod: pod}
	return r
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.stderr, "%s %s: %s\n", time.Now().UTC().Format(time.RFC3339), Name, fmt.Sprintf(format, args...))
}

func (r *runner) run(ctx context.Context) error {
	if err := r.cfg.Validate(); err != nil {
		return err
	}
	switch {
	case r.cfg.GiveBack:
		gctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := install.GiveBack(gctx, r.opt, r.cfg.StandIn); err != nil {
			return err
		}
		r.logf("gave %s back to the real binary", r.cfg.StandIn)
		return nil
	case r.cfg.Verify:
		return r.verify(ctx)
	}
	return r.serve(ctx)
}

// verify checks only: harvester-ipam installed and runs, and with a
// stand-in it stands in (or there is nothing to stand in for); with
// NotStandIn (the stand-in turned off) the real binary is back at the name
// and nothing is aside. It prints what it found.
func (r *runner) verify(ctx context.Context) error {
	res, err := install.VerifyAs(ctx, r.opt, r.cfg.StandIn, r.me)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "%s is installed and runs: %s\n", res.Path, res.About)
	switch standIn, notFor := r.cfg.StandIn, r.cfg.NotStandIn; {
	case standIn != "":
		state, err := install.VerifyStandInAs(ctx, r.opt, standIn, r.me)
		if err != nil {
			if r.cfg.DaemonSet == "" && install.IsGivenBack(ctx, r.opt, standIn) {
				// An operator's check after the stand-in was turned off.
				err = fmt.Errorf("%w (the stand-in turned off? check its give-back with --verify --not-stand-in=%s)", err, standIn)
			}
			return err
		}
		fmt.Fprintln(r.stdout, state)
		return r.describe(ctx, standIn)
	case notFor != "":
		// The stand-in turned off: the real binary back at the name.
		state, err := install.VerifyGivenBack(ctx, r.opt, notFor)
		if err != nil {
			return err
		}
		fmt.Fprintln(r.stdout, state)
		return r.describe(ctx, notFor)
	}
	return nil
}

// describe prints both binaries, at the name and aside, by what they say
// and their bytes: which harvester-ipam, which whereabouts.
func (r *runner) describe(ctx context.Context, name string) error {
	at := filepath.Join(r.opt.BinDir, name)
	for _, p := range []string{at, standin.Aside(at)} {
		if _, err := os.Stat(p); err != nil {
			continue // nothing there: said above
		}
		d, err := install.Describe(ctx, p, r.opt)
		if err != nil {
			return err
		}
		fmt.Fprintln(r.stdout, d)
	}
	return nil
}
