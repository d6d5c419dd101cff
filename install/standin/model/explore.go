package model

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/harvester/harvester-ipam/install/standin"
)

// chooser makes the scheduler's choices: those of a prefix, then the first
// of each, recording how many there were, so that the next prefix is the
// next run of a depth-first search over all of them. With rng set it picks
// at random instead (sampling).
type chooser struct {
	prefix []int
	taken  []choice
	rng    *rand.Rand
}

type choice struct{ c, n int }

func (c *chooser) choose(n int) int {
	v := 0
	switch i := len(c.taken); {
	case i < len(c.prefix):
		v = c.prefix[i]
	case c.rng != nil && n > 1 && c.rng.Float64() < 0.2:
		// The first choice (the installer's next step, a probe that
		// answers) four times in five: a uniform pick would run cp and
		// the kills at the start of nearly every run, and their steps
		// must fall anywhere in the installer's.
		v = 1 + c.rng.IntN(n-1)
	}
	c.taken = append(c.taken, choice{v, n})
	return v
}

// next is the prefix of the next run, false when every run was made.
func (c *chooser) next() ([]int, bool) {
	for i := len(c.taken) - 1; i >= 0; i-- {
		if c.taken[i].c+1 < c.taken[i].n {
			p := make([]int, i+1)
			for j := range i {
				p[j] = c.taken[j].c
			}
			p[i] = c.taken[i].c + 1
			return p, true
		}
	}
	return nil, false
}

// Scenario is one starting bin dir, one thing the installer does, one
// thing whereabouts' install step does meanwhile, on one filesystem.
type Scenario struct {
	Start    string // a key of Starts
	Op       string // a key of Ops
	CP       string // "", "busybox", "gnu"
	Exchange bool   // the filesystem has RENAME_EXCHANGE
	Links    bool   // the filesystem has hard links
}

func (s Scenario) String() string {
	fs := map[[2]bool]string{{true, true}: "ext4-like", {false, true}: "no exchange", {false, false}: "no exchange, no links", {true, false}: "no links"}[[2]bool{s.Exchange, s.Links}]
	cp := s.CP
	if cp == "" {
		cp = "no cp"
	}
	return fmt.Sprintf("%s / %s / %s cp / %s", s.Start, s.Op, cp, fs)
}

// Starts are the bin dirs a node can be found in.
var Starts = map[string]func() (n, a []byte){
	"fresh node":              func() ([]byte, []byte) { return real(1), nil },
	"standing in":             func() ([]byte, []byte) { return self(), real(1) },
	"whereabouts rewrote it":  func() ([]byte, []byte) { return real(2), real(1) },
	"a part at the name":      func() ([]byte, []byte) { return half(real(2)), real(1) },
	"the name missing":        func() ([]byte, []byte) { return nil, real(1) },
	"another build stands in": func() ([]byte, []byte) { return anotherBuild(), real(1) },
	"no whereabouts":          func() ([]byte, []byte) { return nil, nil },
	"harvester-ipam aside":    func() ([]byte, []byte) { return self(), self() },
}

// An op is what the installer does, and what a new run does after a kill.
type op struct {
	desc, restart string
	run           func(ctx context.Context, d standin.Dir) error
	giveBack      bool // its quiet state is the name given back
	notUninstall  bool // a stop that must not give the name back
}

func take(claim bool) func(context.Context, standin.Dir) error {
	return func(ctx context.Context, d standin.Dir) error { _, err := d.Take(ctx, claim); return err }
}

func giveBack(ctx context.Context, d standin.Dir) error { return d.GiveBack(ctx) }

func stop(uninstall bool) func(context.Context, standin.Dir) error {
	return func(ctx context.Context, d standin.Dir) error {
		_, _, err := d.Stop(ctx, func(context.Context) (bool, string) { return uninstall, "" })
		return err
	}
}

// Ops are what the installer does while cp writes: its first Take (a new
// pod's), a Take on an event, giving the name back by hand, and stopping
// on a restart or on an uninstall.
var Ops = map[string]op{
	"take":            {desc: "first take", restart: "first take", run: take(true)},
	"take again":      {desc: "take on an event", restart: "first take", run: take(false)},
	"give back":       {desc: "give back", restart: "give back", run: giveBack, giveBack: true},
	"stop, restart":   {desc: "stop (a restart)", restart: "first take", run: stop(false), notUninstall: true},
	"stop, uninstall": {desc: "stop (an uninstall)", restart: "give back", run: stop(true), giveBack: true},
}

var restarts = map[string]func(context.Context, standin.Dir) error{"first take": take(true), "give back": giveBack}

// Bounds of the search: each run kills the installer at most once, cp at
// most once, and has at most one probe that does not answer.
const (
	maxKills     = 1
	maxCPKills   = 1
	maxNoAnswers = 1
	maxSteps     = 400
)

// Result is what exploring a scenario found.
type Result struct {
	Scenario   Scenario
	Runs       int
	Windows    int // runs that took the documented no-exchange window
	Violations int
	First      []string // the trace of the first violation
	FirstPath  []int    // its choices, to replay it
}

// StopAtFirst ends Explore at the first violation (to look at it).
var StopAtFirst bool

// Explore runs every interleaving of s within the bounds (or, with limit,
// at most limit runs; with seed, random ones).
func Explore(s Scenario, limit int, seed uint64) Result {
	r := Result{Scenario: s}
	var prefix []int
	for {
		ch := &chooser{prefix: prefix}
		if seed != 0 {
			ch.rng = rand.New(rand.NewPCG(seed, uint64(r.Runs)))
		}
		w := Run(s, ch)
		r.Runs++
		if w.windows > 0 {
			r.Windows++
		}
		if w.violation != "" {
			r.Violations++
			if r.First == nil {
				r.First = append([]string{s.String()}, w.trace...)
				for _, c := range ch.taken {
					r.FirstPath = append(r.FirstPath, c.c)
				}
			}
		}
		if limit > 0 && r.Runs >= limit || StopAtFirst && r.Violations > 0 {
			return r
		}
		if seed != 0 {
			continue
		}
		var more bool
		if prefix, more = ch.next(); !more {
			return r
		}
	}
}

// Run makes one run of s with ch's choices.
func Run(s Scenario, ch *chooser) *World {
	o := Ops[s.Op]
	w := &World{exchange: s.Exchange, links: s.Links, names: map[string]*inode{}, maxVersion: 3,
		ever: map[int]bool{}, lost: map[int]string{}, ch: ch,
		noAnswers: maxNoAnswers, kills: maxKills, cpKills: maxCPKills}
	w.clock = 100 // later than every file the run starts with
	w.self = w.newInode(self())
	n, a := Starts[s.Start]()
	for base, b := range map[string][]byte{name: n, name + standin.RealSuffix: a} {
		if b == nil {
			continue
		}
		f := w.newInode(b)
		f.mtime = 50 - int64(w.version(f))                          // the later written, the earlier its time: see World.clock
		f.wb = base == name && strings.HasPrefix(w.what(f), "part") // a cp killed before
		f.legacy = base != name && strings.Contains(string(b), standin.Mark)
		w.names[base] = f
		if v := w.version(f); v >= 0 {
			w.ever[v] = true
		}
	}
	w.nameMissing = w.names[name] == nil // the node's own state: nothing, or a cp of before
	w.cp = writer{kind: s.CP, version: w.maxVersion}
	w.log("start: %s", w.state())

	w.stopNotUninstall = o.notUninstall
	w.givingBack = o.giveBack
	w.runsAlone = w.runsOnItsOwn()
	w.run(o.desc, false, o.run)
	for w.violation == "" {
		w.check()
		if w.inst != nil && w.inst.next.done {
			if err := w.finished(); o.notUninstall && err == nil {
				w.stopNotUninstall = false
			}
			continue
		}
		w.steps++
		if w.steps > maxSteps {
			w.fail("no end after %d steps", maxSteps)
			break
		}
		var opts []string
		waiting := w.inst != nil && !w.inst.next.done
		if waiting && !(w.inst.next.sleep && w.cp.hasNext()) {
			opts = append(opts, "installer")
		}
		if w.cp.hasNext() {
			opts = append(opts, "cp")
		}
		if waiting && w.kills > 0 {
			opts = append(opts, "kill the installer")
		}
		if w.cp.running() && w.cpKills > 0 {
			opts = append(opts, "kill cp")
		}
		if len(opts) == 0 {
			break
		}
		switch opts[w.choose("next", len(opts))] {
		case "installer":
			w.resume()
		case "cp":
			w.cpStep()
		case "kill the installer":
			w.kills--
			w.kill()
			w.inst = nil
			w.stopNotUninstall = false
			w.run(o.restart+" (after a kill)", false, restarts[o.restart])
		case "kill cp":
			w.cpKills--
			w.killCP()
		}
	}
	if w.violation == "" {
		w.check()
	}
	if w.violation == "" {
		w.quiet(o)
	}
	return w
}

// quiet runs the installer until it has nothing left to do, as its next
// events and intervals would, and checks the one right state for what it did.
func (w *World) quiet(o op) {
	w.log("quiet: %s", w.state())
	w.noAnswers, w.stopNotUninstall = 0, false
	// The newest real binary the dir holds now: what the one right state
	// keeps (the newest ever written, unless cp or the window took it).
	v := -1
	for _, n := range w.names {
		v = max(v, w.version(n))
	}
	again := take(true)
	if o.giveBack {
		again = giveBack
	}
	var err error
	for i := 0; i < 3; i++ {
		w.run("quiet", true, again)
		err = w.finished()
		w.check()
		if w.violation != "" {
			return
		}
		if err == nil || errors.Is(err, standin.ErrNoReal) {
			break
		}
	}
	w.log("quiet: %s after %v", w.state(), err)
	n, a := w.names[name], w.names[name+standin.RealSuffix]
	temps := 0
	for base := range w.names {
		if standin.IsTemp(base) {
			temps++
		}
	}
	switch {
	case v < 0 && !errors.Is(err, standin.ErrNoReal):
		w.fail("no real binary survives, but the installer said %v", err)
	case v < 0:
	case err != nil:
		w.fail("the installer does not settle: %v", err)
	case temps > 0:
		w.fail("%d temporary files left", temps)
	case o.giveBack && (w.version(n) != v || a != nil):
		w.fail("given back: the name holds %s (want real %d), the aside %s", w.what(n), v, w.what(a))
	case !o.giveBack && (w.what(n) != "self" || w.version(a) != v):
		w.fail("standing in: the name holds %s (want self), the aside %s (want real %d)", w.what(n), w.what(a), v)
	}
	if w.violation != "" || o.giveBack {
		return
	}
	// Ready: standing in, or nothing to stand in for.
	var said string
	w.run("readiness probe", true, func(ctx context.Context, d standin.Dir) error {
		var err error
		said, err = d.Ready(ctx)
		return err
	})
	if err := w.finished(); err != nil && (v >= 0 || (n == nil && a == nil)) {
		w.fail("not ready: %v", err)
	} else if err == nil {
		w.log("ready: %s", said)
	}
}

// Scenarios is every scenario.
func Scenarios() []Scenario {
	var out []Scenario
	for _, start := range sortedKeys(Starts) {
		for _, op := range sortedKeys(Ops) {
			for _, cp := range []string{"", "busybox", "gnu"} {
				for _, fs := range [][2]bool{{true, true}, {false, true}, {false, false}, {true, false}} {
					out = append(out, Scenario{Start: start, Op: op, CP: cp, Exchange: fs[0], Links: fs[1]})
				}
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

// Trace is a run's trace, for a failing test to print.
func (r Result) Trace() string { return strings.Join(r.First, "\n") }
