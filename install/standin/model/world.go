// Package model explores the stand-in's bin dir: the product's own code
// (standin.Dir's Take, GiveBack, Stop and Ready) runs against a filesystem
// of the model's, one step at a time, interleaved with whereabouts' own
// install step (`cp -f`, as busybox and as GNU cp write), with kills of
// either anywhere, probes that answer, fail or do not answer, on
// filesystems with and without RENAME_EXCHANGE and hard links. Every
// interleaving within the bounds is run (a depth-first search over the
// scheduler's choices, each run replayed from the start), and SAFETY.md's
// invariants are checked after every step; once the world is quiet, the
// installer's next run must have brought the dir to its one right state.
package model

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/install/standin"
)

var (
	errKilled   = errors.New("the installer was killed")
	errNoAnswer = errors.New("no answer")
)

// World is one run: the bin dir, whereabouts' cp, the installer process,
// and what the invariants need to remember.
type World struct {
	exchange, links bool
	names           map[string]*inode // the bin dir's names
	self            *inode
	// clock is the installer's file times, which go forward; cpClock is
	// whereabouts' cp's, which go back: its every write looks older than
	// every file there, as after a clock stepped back (NTP) once the files
	// were written while it was ahead. No rule may order real binaries by
	// their times (invariant 7 of docs/invariants.md): the model's times say the
	// opposite of the truth.
	clock, cpClock int64
	nextIno        uint64
	temps          int
	maxVersion     int
	dirty          bool // the installer wrote since it last fsynced the dir
	// cpStepped: cp took a step since the installer's last; raced: it had
	// when the installer's current step began.
	cpStepped, raced bool
	// cpInOp: cp took a step during the installer's current run (without
	// hard links the real binary is copied aside: the copy's whole time is
	// the window).
	cpInOp bool

	ever        map[int]bool   // real versions that were whole at some instant
	lost        map[int]string // versions whose last copy went, and how
	nameMissing bool           // busybox cp unlinked the name and has not created it

	cp   writer
	inst *process

	ch        *chooser
	noAnswers int // probes that may still not answer, or crash once
	kills     int // installer kills still allowed
	cpKills   int
	steps     int
	// stopNotUninstall: the installer is stopping without an uninstall;
	// giving the name back now is a violation.
	stopNotUninstall bool
	// givingBack: the installer gives the name back; runsAlone: the name ran
	// on its own (a real binary, or harvester-ipam with a real one aside)
	// after the last step. A give-back's step must not undo that: an
	// uninstall has no run after it to repair what a kill leaves.
	givingBack, runsAlone bool

	trace     []string
	violation string
	windows   int // no-exchange windows taken (SAFETY.md), not violations
}

func (w *World) tick() int64 { w.clock++; return w.clock }

// cpTick is the time of a write by whereabouts' cp: earlier than every
// other file's.
func (w *World) cpTick() int64 { w.cpClock--; return w.cpClock }

func (w *World) newInode(data []byte) *inode {
	w.nextIno++
	return &inode{ino: w.nextIno, data: data, mtime: w.tick()}
}

func (w *World) log(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

func (w *World) fail(format string, args ...any) {
	if w.violation == "" {
		w.violation = fmt.Sprintf(format, args...)
		w.log("VIOLATION: %s", w.violation)
	}
}

func (w *World) choose(what string, n int) int {
	c := w.ch.choose(n)
	if n > 1 {
		w.log("  choice %q: %d of %d", what, c, n)
	}
	return c
}

// copies counts the names whose file holds real version v whole.
func (w *World) copies(v int) int {
	c := 0
	for _, n := range w.names {
		if w.version(n) == v {
			c++
		}
	}
	return c
}

func (w *World) named(n *inode) bool {
	for _, m := range w.names {
		if m == n {
			return true
		}
	}
	return false
}

// gone records that file n lost a name by another's hand (how); if that was
// the last copy of a real version, the version is lost: by whereabouts' own
// cp, in the documented no-exchange window, or by the installer (a
// violation).
func (w *World) gone(n *inode, how string) {
	v := w.version(n)
	if v < 0 || w.named(n) || w.copies(v) > 0 {
		return
	}
	if _, ok := w.lost[v]; ok {
		return // a copy of what cp or the window took already
	}
	top := -1
	for u := range w.ever {
		top = max(top, u)
	}
	switch {
	case how == "cp":
		w.lost[v] = "whereabouts' own cp"
	case v < top:
		w.lost[v] = "older than real " + fmt.Sprint(top)
	case w.window() && (w.raced || how == "renamed over by the installer" && n.wb):
		// cp stepped between the installer's last look and this step.
		w.lost[v] = "the no-exchange window"
		w.windows++
	default:
		w.fail("real %d, the newest, its last copy, %s", v, how)
	}
}

// displaced is gone, for the installer's own removals and renames over a name.
func (w *World) displaced(n *inode, how string) {
	n.displacedBy = how
	w.gone(n, how)
}

// window says whether the filesystem lacks what closes every window: the
// exchange, or hard links.
func (w *World) window() bool { return !w.exchange || !w.links }

// newest is the newest real version ever whole, which must be kept, or -1
// when there is none or whereabouts' own cp (or the no-exchange window)
// took it: an older version is not kept for it (invariant 7 of docs/invariants.md
// asks for the newest ever written).
func (w *World) newest() int {
	best := -1
	for v := range w.ever {
		best = max(best, v)
	}
	if how, ok := w.lost[best]; ok && !strings.HasPrefix(how, "older") {
		return -1
	}
	return best
}

// check is SAFETY.md's invariants at one instant.
func (w *World) check() {
	n := w.names[name]
	if n != nil {
		w.nameMissing = false
	}
	switch what := w.what(n); {
	case n == nil && !w.nameMissing && w.newest() >= 0:
		w.fail("the name is missing")
	case n != nil && strings.HasPrefix(what, "part") && !n.wb:
		w.fail("the name holds %s, not a whole binary", what)
	}
	// harvester-ipam is never aside, but for the moment after a give-back's
	// exchange put it there (its record in place) while the name holds no
	// harvester-ipam: no sandbox reaches it as a delegate.
	if a := w.names[name+standin.RealSuffix]; a != nil && !a.legacy && strings.Contains(string(a.data), standin.Mark) {
		if w.names[marker] == nil || n != nil && strings.Contains(string(n.data), standin.Mark) {
			w.fail("harvester-ipam (%s) is aside", w.what(a))
		}
	}
	if v := w.newest(); v >= 0 && w.copies(v) == 0 {
		w.fail("real %d, the newest, is at no name (%s)", v, w.state())
	}
	if w.what(n) == "self" || w.what(n) == "another build" {
		if w.newest() >= 0 && !w.anyRealBut(n) {
			w.fail("harvester-ipam is the only binary left")
		}
	}
	alone := w.runsOnItsOwn()
	if w.givingBack && w.runsAlone && !alone && !w.cpStepped {
		w.fail("the give-back left the name without a real binary to run (%s): a kill here, with no run after it, leaves every ADD failing", w.state())
	}
	w.runsAlone = alone
}

// runsOnItsOwn: the name holds a real binary, or harvester-ipam with a real
// binary aside (its delegate).
func (w *World) runsOnItsOwn() bool {
	n := w.names[name]
	if w.version(n) >= 0 {
		return true
	}
	what := w.what(n)
	return (what == "self" || what == "another build") && w.version(w.names[name+standin.RealSuffix]) >= 0
}

func (w *World) anyRealBut(x *inode) bool {
	for _, n := range w.names {
		if n != x && w.version(n) >= 0 {
			return true
		}
	}
	return false
}

// The names as the trace prints them.
func (w *World) state() string {
	var ks []string
	for k := range w.names {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		n := w.names[k]
		fmt.Fprintf(&b, "%s=%s#%d", short(filepath.Join(binDir, k)), w.what(n), n.ino)
		if n.writers > 0 {
			b.WriteString("(open)")
		}
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

// writer is whereabouts' install step writing version v at the name: busybox
// cp -f (unlink, then a new file) or GNU cp -f (into the file at the name).
type writer struct {
	kind    string // "", "busybox", "gnu"
	version int
	pc      int
	file    *inode
	done    bool
}

func (c *writer) steps() []string {
	switch c.kind {
	case "busybox":
		return []string{"unlink the name", "create the name", "write half", "write the rest", "close"}
	case "gnu":
		return []string{"open the name, truncated", "write half", "write the rest", "close"}
	}
	return nil
}

func (c *writer) hasNext() bool { return !c.done && c.pc < len(c.steps()) }

// running: started and not closed, so a kill leaves a part behind.
func (c *writer) running() bool { return c.hasNext() && c.pc > 0 }

func (w *World) cpStep() {
	c := &w.cp
	step := c.steps()[c.pc]
	c.pc++
	w.cpStepped, w.cpInOp = true, true
	w.log("cp (%s): %s", c.kind, step)
	whole := real(c.version)
	switch step {
	case "unlink the name":
		if n := w.names[name]; n != nil {
			delete(w.names, name)
			w.nameMissing = true
			w.gone(n, "cp")
		}
	case "create the name":
		if w.names[name] != nil { // O_CREAT|O_EXCL: someone was first
			w.log("cp (busybox): cannot create the name: it exists; cp fails")
			c.done = true
			return
		}
		c.file = w.newInode(nil)
		c.file.mtime = w.cpTick()
		c.file.writers, c.file.wb = 1, true
		w.names[name] = c.file
		w.nameMissing = false
	case "open the name, truncated":
		n := w.names[name]
		if n == nil {
			n = w.newInode(nil)
			n.mtime = w.cpTick()
			w.names[name] = n
			w.nameMissing = false
		}
		v := w.version(n)
		n.data, n.mtime, n.wb = nil, w.cpTick(), true
		n.writers++
		c.file = n
		if v >= 0 && w.copies(v) == 0 {
			w.lost[v] = "whereabouts' own cp"
		}
	case "write half":
		c.file.data, c.file.mtime = half(whole), w.cpTick()
	case "write the rest":
		c.file.data, c.file.mtime = whole, w.cpTick()
		w.ever[c.version] = true
		if !w.named(c.file) {
			if c.file.displacedBy == "renamed over by the installer" && w.window() {
				w.lost[c.version] = "the no-exchange window"
				w.windows++
			} else {
				w.fail("real %d was written into a file that has no name (%s)", c.version, c.file.displacedBy)
			}
		}
	case "close":
		c.file.writers--
		c.done = true
	}
}

func (w *World) killCP() {
	w.log("cp (%s): killed", w.cp.kind)
	if w.cp.file != nil {
		w.cp.file.writers--
	}
	w.cp.done = true
}

// process is one run of the installer (a pod's container): its code runs in
// a goroutine of its own, which hands control back at each step.
type process struct {
	desc   string
	resume chan bool
	at     chan point
	next   point
	cancel context.CancelFunc
	killed bool
	quiet  bool // runs through, choosing nothing
	err    error
}

type point struct {
	op    string
	sleep bool
	done  bool
	err   error
}

// step is called by the installer's code before each of its steps: a step
// that may see or change what cp does, or that writes, is a point where the
// scheduler may run cp, or kill the installer, first.
func (w *World) step(op string, dependent, write bool) error {
	p := w.inst
	if p == nil {
		return nil
	}
	if p.killed {
		return errKilled
	}
	if (dependent || write) && !p.quiet {
		p.at <- point{op: op, sleep: op == "sleep"}
		if !<-p.resume {
			p.killed = true
			return errKilled
		}
	}
	w.raced, w.cpStepped = w.cpStepped || !w.links && w.cpInOp, false
	if w.stopNotUninstall && write {
		w.fail("the installer wrote (%s) on a stop that is not an uninstall", op)
	}
	w.log("installer (%s): %s", p.desc, op)
	return nil
}

// run starts op as the installer process.
func (w *World) run(desc string, quiet bool, op func(ctx context.Context, d standin.Dir) error) *process {
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{desc: desc, resume: make(chan bool), at: make(chan point), cancel: cancel, quiet: quiet}
	w.inst = p
	w.dirty = false // a success vouches for its own writes
	w.cpInOp = false
	d := standin.Dir{Path: binDir, Name: name, Self: selfPath, FS: fsys{w}, Probe: w.probe}
	go func() {
		err := op(ctx, d)
		p.at <- point{done: true, err: err}
	}()
	p.next = <-p.at
	return p
}

// resume lets the installer take its step and run to its next point.
func (w *World) resume() {
	p := w.inst
	p.resume <- true
	p.next = <-p.at
}

// kill kills the installer at its point: it takes no step more.
func (w *World) kill() {
	p := w.inst
	w.log("installer (%s): killed before %s", p.desc, p.next.op)
	p.cancel()
	p.resume <- false
	for !p.next.done {
		p.next = <-p.at
		if !p.next.done {
			p.resume <- false
		}
	}
}

// finished records an installer run that ended: a success must be durable.
func (w *World) finished() error {
	p := w.inst
	err := p.next.err
	w.log("installer (%s): returned %v", p.desc, err)
	if err == nil && w.dirty {
		w.fail("%s succeeded without making its writes durable (no fsync of the dir after them)", p.desc)
	}
	w.inst = nil
	return err
}
