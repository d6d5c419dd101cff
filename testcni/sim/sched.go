// Package sim is harvester-ipam's deterministic simulation: the product's
// own plugin verbs and reconciler, through the store's interface, in a
// simulated world — an API server with the semantics the code relies on
// (shim/fake), whereabouts as each version behaves, and a runtime that plays
// the kubelet and Multus — under a seeded scheduler that decides, at every
// request and every wait, which actor runs next. Invariants are checked after
// every step; a violation comes with its seed and a readable trace, and the
// same seed replays it exactly.
package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/shim"
)

// sched runs actors one at a time. An actor is a goroutine that hands the
// baton back at every yield; the scheduler chooses, with its seeded random
// source, which runnable actor gets it next. Time is simulated: it moves on
// by the latency of each request, and jumps to the next wake-up when every
// actor sleeps.
type sched struct {
	rng    *rand.Rand
	now    time.Time
	actors []*actor
	cur    *actor
	back   chan struct{} // an actor hands the baton back
	seq    int
	trace  *trace
	// check runs after every step; it returns what is wrong.
	check func() []string
	// violations are the first invariant breaks seen.
	violations []string
	// pct chooses by priority (probabilistic concurrency testing: the
	// runnable actor of highest priority runs; at a few random steps the
	// running one drops to the lowest), which finds the interleavings that
	// need one actor to run many steps while another waits; otherwise the
	// choice is uniform.
	pct     bool
	steps   int
	changes map[int]bool
	lowest  int
	// envOf is the actor whose environment the process has.
	envOf *actor
	// dirty says that something the invariants read changed since the last
	// check: a write to the API server, or a sandbox changing state.
	dirty bool
	// look, when set, runs after every step and whenever the clock passes
	// lookAt (zero: never): the audit's checker. It returns what is wrong.
	look   func() []string
	lookAt func() time.Time
}

type actor struct {
	name     string
	priority int
	wake     chan struct{}
	at       time.Time // sleeping until
	done     bool
	// killed: the process the actor runs crashed; its further requests fail
	// and change nothing, and it unwinds to the runtime.
	killed bool
	// abandoned: the schedule is over; the actor unwinds whole.
	abandoned bool
	// env is the CNI environment of the plugin call the actor makes: the
	// process's environment is one, so it is set again at every turn.
	env map[string]string
	// add is the harvester-ipam ADD the actor runs, if any (checkAdd).
	add *addRun
	// until, while set, blocks the actor until it says so (waitFor), or
	// until deadline when that is set (waitUntil).
	until    func() bool
	deadline time.Time
	// whereabouts is set while the actor runs whereabouts' own DEL (its
	// binary alone, its pod controller): of the entry of that attachment.
	whereabouts *attachment
	// wbAdd, while the actor runs whereabouts' own ADD, is what that ADD
	// read of the reservations: by name, whether its last read found one.
	wbAdd map[string]bool
	// adding are the entries the pool patch it makes adds (an agent's).
	adding map[string]shim.IPAllocation
	// inCall is the node whose plugin process the actor runs now (call).
	inCall *node
	// daemon: the actor runs beside the world for as long as it lasts (a
	// node agent's informers); a run does not wait for it to end.
	daemon bool
	// proc is the node agent the actor is part of: a crash of the actor is
	// the agent's (see killAgent).
	proc *agentProc
	s    *sched
}

func newSched(seed uint64, t *trace) *sched {
	return &sched{
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		now:   time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC),
		back:  make(chan struct{}),
		trace: t,
	}
}

// goExit ends an actor's goroutine; the scheduler takes the baton back.
type goExit struct{}

// spawn starts an actor running f; it waits for its first turn.
func (s *sched) spawn(name string, f func(a *actor)) *actor {
	s.seq++
	a := &actor{name: fmt.Sprintf("%s#%d", name, s.seq), wake: make(chan struct{}), at: s.now, s: s, priority: s.rng.IntN(1 << 20)}
	s.actors = append(s.actors, a)
	go func() {
		<-a.wake
		if a.killed {
			// Killed before its first turn (its process died first): it
			// never ran.
			a.done = true
			s.back <- struct{}{}
			return
		}
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(goExit); !ok {
					s.violations = append(s.violations, fmt.Sprintf("%s panicked: %v\n%s", a.name, r, stack()))
				}
			}
			a.done = true
			s.back <- struct{}{}
		}()
		f(a)
	}()
	return a
}

func stack() string {
	b := make([]byte, 8192)
	return string(b[:runtime.Stack(b, false)])
}

// cniVars are the environment variables a delegating plugin passes on.
var cniVars = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS", "CNI_NETNS", "CNI_PATH"}

// baseEnv is the process's environment without the CNI variables.
var baseEnv = func() [][2]string {
	var out [][2]string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if !slices.Contains(cniVars, k) {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}()

// setEnv makes the process's environment the actor's. A variable to drop is
// dropped by clearing the environment, not by Unsetenv: that leaves a hole
// in the runtime's copy which a later Setenv does not reuse, so unsetting and
// setting at every turn grew what every os.Environ copies without bound (a
// third of the time went there).
func (a *actor) setEnv() {
	a.s.envOf = a
	for _, k := range cniVars {
		_, want := a.env[k]
		if _, set := os.LookupEnv(k); set && !want {
			os.Clearenv()
			for _, kv := range baseEnv {
				_ = os.Setenv(kv[0], kv[1])
			}
			break
		}
	}
	for _, k := range cniVars {
		if v, ok := a.env[k]; ok {
			_ = os.Setenv(k, v)
		}
	}
}

// yield hands the baton back and waits for the next turn. Called from the
// running actor only.
func (a *actor) yield() {
	a.s.back <- struct{}{}
	<-a.wake
}

// waitFor blocks until ready says so, as a goroutine blocked on a channel:
// the scheduler asks ready between turns (so it must only read), and the
// actor is runnable once it is true. A killed actor unwinds.
func (a *actor) waitFor(ready func() bool) {
	if !ready() {
		a.until = ready
		a.at = a.s.now
		a.yield()
		a.until = nil
	}
	if a.killed {
		panic(goExit{})
	}
}

// waitUntil is waitFor, for at most until deadline.
func (a *actor) waitUntil(ready func() bool, deadline time.Time) {
	if !ready() && a.s.now.Before(deadline) {
		a.until, a.deadline = ready, deadline
		a.at = a.s.now
		a.yield()
		a.until, a.deadline = nil, time.Time{}
	}
	if a.killed {
		panic(goExit{})
	}
}

// sleep waits d of simulated time.
func (a *actor) sleep(d time.Duration) {
	if d < 0 {
		d = 0
	}
	a.at = a.s.now.Add(d)
	a.yield()
	if a.abandoned {
		panic(goExit{})
	}
}

// run gives turns until every actor is done, or until the deadline of
// simulated time passes with actors left (they are left parked: the caller
// decides). It returns false when the run was stopped by a violation.
func (s *sched) run(until time.Time) bool {
	for {
		var runnable []*actor
		next := time.Time{}
		alive := 0
		var blocked []string
		for _, a := range s.actors {
			if a.done {
				continue
			}
			if !a.daemon {
				alive++
			}
			waiting := a.until != nil && !a.killed && !a.until()
			switch {
			case waiting && a.deadline.IsZero():
				if !a.daemon {
					blocked = append(blocked, a.name)
				}
			case waiting && a.deadline.After(s.now):
				if next.IsZero() || a.deadline.Before(next) {
					next = a.deadline
				}
			case !a.at.After(s.now):
				runnable = append(runnable, a)
			case next.IsZero() || a.at.Before(next):
				next = a.at
			}
		}
		if alive == 0 {
			s.prune()
			return true
		}
		if len(runnable) == 0 {
			if due := s.lookDue(next, until); !due.IsZero() {
				// A look is due before anyone wakes: the clock stops there.
				s.now = due
				if !s.looks() {
					return false
				}
				continue
			}
			if next.IsZero() {
				s.violations = append(s.violations, fmt.Sprintf("deadlock: %s wait for what no one will do", strings.Join(blocked, ", ")))
				return false
			}
			if !until.IsZero() && next.After(until) {
				s.now = until
				return true
			}
			s.now = next
			continue
		}
		a := s.choose(runnable)
		s.cur = a
		// Only a plugin's process reads the CNI environment (its delegate
		// inherits it): an actor making no CNI call leaves it as it is.
		if s.envOf != a && a.env != nil {
			a.setEnv()
		}
		a.wake <- struct{}{}
		<-s.back
		s.cur = nil
		if s.check != nil && s.dirty {
			s.dirty = false
			if bad := s.check(); len(bad) > 0 {
				s.violations = append(s.violations, bad...)
				return false
			}
		}
		if !s.looks() || len(s.violations) > 0 {
			return false
		}
	}
}

// looks runs look, if set; false when it found something wrong.
func (s *sched) looks() bool {
	if s.look == nil {
		return true
	}
	if bad := s.look(); len(bad) > 0 {
		s.violations = append(s.violations, bad...)
		return false
	}
	return true
}

// lookDue is when a look is due, if before next (and until): zero if none.
func (s *sched) lookDue(next, until time.Time) time.Time {
	if s.lookAt == nil {
		return time.Time{}
	}
	due := s.lookAt()
	if due.IsZero() || next.IsZero() || !due.After(s.now) || !due.Before(next) || !until.IsZero() && due.After(until) {
		return time.Time{}
	}
	return due
}

// choose is the next actor to run.
func (s *sched) choose(runnable []*actor) *actor {
	if !s.pct {
		return runnable[s.rng.IntN(len(runnable))]
	}
	s.steps++
	best := runnable[0]
	for _, a := range runnable[1:] {
		if a.priority > best.priority {
			best = a
		}
	}
	if s.changes[s.steps] {
		s.lowest--
		best.priority = s.lowest
	}
	return best
}

// usePCT makes the schedule choose by priority, with depth priority
// changes among the first within steps.
func (s *sched) usePCT(depth, within int) {
	s.pct = true
	s.changes = map[int]bool{}
	for i := 0; i < depth; i++ {
		s.changes[1+s.rng.IntN(within)] = true
	}
}

// prune forgets finished actors.
func (s *sched) prune() {
	live := s.actors[:0]
	for _, a := range s.actors {
		if !a.done {
			live = append(live, a)
		}
	}
	s.actors = live
}

// abandon ends every actor left (a run stopped early): each is woken into a
// goExit so that no goroutine outlives the schedule.
func (s *sched) abandon() {
	for _, a := range s.actors {
		if !a.done {
			a.killed, a.abandoned = true, true
			a.at = s.now
		}
	}
	for {
		var left *actor
		for _, a := range s.actors {
			if !a.done {
				left = a
				break
			}
		}
		if left == nil {
			break
		}
		s.cur = left
		left.wake <- struct{}{}
		<-s.back
	}
	s.actors = nil
}

// clock is the simulated time, as shim.Clock; a wait is a yield.
type clock struct{ s *sched }

func (c clock) Now() time.Time { return c.s.now }

func (c clock) Sleep(ctx context.Context, d time.Duration) error {
	a := c.s.cur
	if a == nil {
		panic("sim: a sleep outside any actor")
	}
	if a.killed {
		return errKilled
	}
	a.sleep(d)
	if a.killed {
		panic(goExit{})
	}
	return ctx.Err()
}

// trace is the readable story of a schedule.
type trace struct {
	lines []string
	s     *sched
}

func (t *trace) add(format string, args ...any) {
	at := ""
	if t.s != nil {
		at = fmt.Sprintf("%8.3fs ", t.s.now.Sub(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)).Seconds())
		if t.s.cur != nil {
			at += t.s.cur.name + ": "
		}
	}
	t.lines = append(t.lines, at+fmt.Sprintf(format, args...))
}

func (t *trace) String() string { return strings.Join(t.lines, "\n") }

// pick chooses one of n with the schedule's random source.
func (s *sched) pick(n int) int { return s.rng.IntN(n) }

// chance is true with probability p.
func (s *sched) chance(p float64) bool { return s.rng.Float64() < p }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
