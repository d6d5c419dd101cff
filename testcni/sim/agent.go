package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/agent"
	"github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/agent/client"
	"github.com/harvester/harvester-ipam/agent/wire"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// Node agents. On a node that has one, harvester-ipam offers each verb to
// the agent first, as the plugin binary does (plugin.Plugin.Agent, here an
// agentClient in place of the socket's client.Client): the agent's own
// admission (agent.Server.Take: its health, its decline of what it does not
// serve, its slots) and, after the client's go-ahead, the verb as the agent
// runs it (agent.Server.Run: the plugin's verbs in-process, ADD allocating
// with agent/alloc's Allocator and Delegate, on a cache.Objects the agent's
// informers fill, see informer.go). The client falls back when the agent is
// down, declines or does not acknowledge in time, and after the go-ahead
// waits for the answer; an agent killed meanwhile makes the verb lost, and
// the plugin's lost-ADD path runs.
//
// An agent is a process of several actors: one per request it serves, the
// allocator's worker of each pool queue and reservation (alloc.Options.Go
// and Wait put them under the scheduler), its informers and its health
// check. A kill (at any step boundary of the plugin's verbs as the agent
// runs them, of the allocator, before any of its requests, or by the world)
// ends all of them at once: every member of a group commit in flight is
// lost, its client sees so. The DaemonSet starts it again after a while,
// with an empty cache its informers fill again.

// agentProc is one run of a node's agent, from its start to its kill.
type agentProc struct {
	w      *world
	node   *node
	serial int
	srv    *agent.Server
	objs   *cache.Objects
	// broken counts its informers whose watch broke and which have not
	// listed since: the agent declines meanwhile (Options.Following).
	broken int
	// serving: its socket takes requests (after its start's health check).
	serving bool
	dead    bool
	actors  []*actor
}

// agentOf is the agent serving on n now, nil when n has none or it is down.
func (w *world) agentOf(n *node) *agentProc {
	ag := w.agents[n.name]
	if ag == nil || ag.dead || !ag.serving {
		return nil
	}
	return ag
}

// startAgent starts the agent of n in actor a (the DaemonSet's pod
// starting): its server and allocator, a health check (whose failure makes
// it decline until the next one), then its informers.
func (w *world) startAgent(a *actor, n *node) {
	w.agentRuns++
	ag := &agentProc{w: w, node: n, serial: w.agentRuns, objs: cache.New()}
	w.agents[n.name] = ag
	a.proc = ag
	ag.actors = append(ag.actors, a)
	wb := &fake.Whereabouts{API: w.api, Version: w.o.Whereabouts, Namespace: poolNS, Options: w.options(""), Pick: w.s.pick}
	wait := func(done <-chan struct{}) {
		w.s.cur.waitFor(func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
	}
	al := alloc.New(alloc.Options{
		Reserved: ag.objs.Reservation,
		Pools:    ag.objs.Pools,
		// As the agent's main: up to its wait for the informer to deliver
		// the allocation's own patch, in simulated time.
		Follows: func(namespace, rv string) bool {
			w.s.cur.waitUntil(func() bool { return ag.objs.Follows(namespace, rv) }, w.s.now.Add(agent.FollowWait))
			return ag.objs.Follows(namespace, rv)
		},
		AtStep: ag.atStep,
		Go: func(f func()) {
			ag.spawn("alloc", false, func(*actor) { f() })
		},
		Wait: wait,
	})
	srv, err := agent.New(agent.Options{
		API:            agentAPI{API: cache.API{API: w.api, Objects: ag.objs}, w: w},
		Namespaces:     []string{poolNS},
		Node:           n.name,
		Allocator:      alloc.Delegate{Allocator: al, Load: conf.Loader{Quiet: true}.Whereabouts},
		Log:            io.Discard,
		MaxInFlight:    agentSlots,
		VerbTimeout:    time.Hour,
		Env:            []string{},
		StoreOptions:   w.options(""),
		CheckpointDirs: []string{n.cpDir},
		Exec:           &fake.Delegate{WB: wb},
		AtStep:         ag.atStep,
		Wait:           wait,
		Following: func() error {
			if ag.broken > 0 {
				return fmt.Errorf("%d watches broken, not listed again", ag.broken)
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	ag.srv = srv
	w.tr.add("agent %d starts on %s", ag.serial, n.name)
	healthy := true
	if err := srv.Check(context.Background()); err != nil {
		w.tr.add("agent %d: the pools do not answer, it declines until its next check: %v", ag.serial, err)
		healthy = false
	}
	ag.serving = true
	for _, res := range []string{fake.Pools, fake.Reservations} {
		inf := &informer{ag: ag, resource: res, known: map[string]any{}}
		ag.spawn("informer of "+res, true, inf.run)
	}
	ag.spawn("health check", true, func(h *actor) {
		for {
			h.sleep(30 * time.Second)
			// A check that would find what the last one found (the API
			// server answers, and answered) changes nothing: not made, to
			// keep schedules cheap.
			if healthy && !w.s.now.Before(w.faultsUntil) {
				continue
			}
			healthy = srv.Check(context.Background()) == nil
		}
	})
}

// agentSlots is the agents' --max-in-flight: small, so that a node's storm
// meets it.
const agentSlots = 4

// spawn starts an actor of the agent; it dies with it.
func (ag *agentProc) spawn(what string, daemon bool, f func(a *actor)) *actor {
	x := ag.w.s.spawn(fmt.Sprintf("agent %d %s", ag.serial, what), f)
	x.proc, x.daemon = ag, daemon
	if ag.dead {
		x.killed = true
	}
	ag.actors = append(ag.actors, x)
	return x
}

// atStep is a step boundary of the agent's work: it may be killed there.
func (ag *agentProc) atStep(step string) {
	w := ag.w
	w.stats["agent steps: "+step]++
	if !w.quiet && w.o.Agents && w.s.chance(w.o.AgentCrashRate) {
		w.stats["agent kills at "+step]++
		ag.kill("at "+step, 0)
	}
}

// kill ends the agent at once (SIGKILL, a node's OOM killer, its pod
// deleted): every actor of it, and every verb it was doing; the DaemonSet
// starts another after restart (0: a while, 0.5 to 10 s). Called from one
// of its own actors, it unwinds that one too.
func (ag *agentProc) kill(why string, restart time.Duration) {
	w := ag.w
	if ag.dead {
		return
	}
	ag.dead, ag.serving = true, false
	w.stats["agent kills"]++
	w.tr.add("AGENT %d on %s KILLED %s", ag.serial, ag.node.name, why)
	for _, x := range ag.actors {
		if !x.done {
			x.killed = true
			if x.at.After(w.s.now) {
				x.at = w.s.now
			}
		}
	}
	ag.actors = nil
	n := ag.node
	if restart == 0 {
		restart = time.Duration(500+w.s.pick(9500)) * time.Millisecond
	}
	w.s.spawn("daemonset "+n.name, func(a *actor) {
		a.sleep(restart)
		if n.exists && w.agents[n.name] == ag {
			w.startAgent(a, n)
		}
	})
	if cur := w.s.cur; cur != nil && cur.proc == ag {
		panic(goExit{})
	}
}

// agentAPI is the agent's API (cache.API on the simulated server) telling
// the liveness check when a read from the agent's copy was behind the pool
// as it is: an ADD's reclaim then releases only what the copy shows, by
// design, as it does on the API server's watch cache.
type agentAPI struct {
	cache.API
	w *world
}

func (a agentAPI) GetPool(ctx context.Context, ns, name string, from shim.Source) (*shim.Pool, error) {
	p, err := a.API.GetPool(ctx, ns, name, from)
	if from == shim.Cache && err == nil && p != nil && p.ResourceVersion != a.w.api.ResourceVersion(fake.Pools, ns, name) {
		if cur := a.w.s.cur; cur != nil && cur.add != nil {
			cur.add.stale[name] = true
		}
	}
	return p, err
}

// agentClient hands a verb to the node's agent as client.Client does over
// the socket, and says what became of it.
type agentClient struct {
	w *world
	n *node
	a *actor // the plugin's process: the runtime's actor
	// outcome is what became of the last verb.
	outcome *client.Outcome
}

// invocation is a verb the agent took: its answer once done.
type invocation struct {
	done bool
	ans  wire.Answer
}

func (c agentClient) Do(ctx context.Context, req wire.Request) client.Result {
	w := c.w
	res := c.do(req)
	*c.outcome = res.Outcome
	what := req.Command + " " + res.Outcome.String()
	if res.Outcome == client.Fallback {
		reason := res.Reason
		if i := strings.Index(reason, ": "); strings.HasPrefix(reason, "node agent declined") && i > 0 {
			reason = "declined: " + reason[i+2:]
		}
		what += " (" + reason + ")"
	}
	w.stats["agent: "+what]++
	switch res.Outcome {
	case client.Served:
		w.tr.add("the agent on %s served %s %s/%s", c.n.name, req.Command, req.Env[wire.EnvContainerID], req.Env[wire.EnvIfName])
	default:
		w.tr.add("the agent on %s: %s %s/%s %s: %s", c.n.name, req.Command, req.Env[wire.EnvContainerID], req.Env[wire.EnvIfName], res.Outcome, res.Reason)
	}
	return res
}

func (c agentClient) do(req wire.Request) client.Result {
	w := c.w
	ag := w.agentOf(c.n)
	if ag == nil {
		return client.Result{Outcome: client.Fallback, Reason: "node agent at " + wire.DefaultSocket + ": connection refused"}
	}
	if !w.quiet && w.s.chance(0.02) {
		return client.Result{Outcome: client.Fallback, Reason: "node agent: no acknowledgement within 100ms"}
	}
	j, free, reason, detail := ag.srv.Take(req)
	if reason != "" {
		return client.Result{Outcome: client.Fallback, Reason: "node agent declined: " + detail}
	}
	// Go: the verb is the agent's now.
	vctx, cancel := context.WithCancel(context.Background())
	inv := &invocation{}
	run := c.a.add
	if run != nil {
		run.users++
	}
	ag.spawn(fmt.Sprintf("%s %s/%s", req.Command, req.Env[wire.EnvContainerID], req.Env[wire.EnvIfName]), false, func(x *actor) {
		defer free()
		if run != nil {
			x.add = run
			defer w.endAdd(x, run)
		}
		ans := ag.srv.Run(vctx, j)
		if x.killed {
			panic(goExit{}) // Run recovers what a kill unwinds with: it is still a kill
		}
		if ans.Error != nil && strings.Contains(ans.Error.Msg, context.Canceled.Error()) {
			w.stats["agent: verbs ended by their client's departure"]++
		}
		ag.atStep("agent-before-answer")
		if run != nil && ans.Error == nil {
			ip, err := result(x, req.Command, ans.Stdout, nil)
			if err != nil {
				w.s.violations = append(w.s.violations, fmt.Sprintf("the agent's ADD of %s answered no address: %v", run.att.name(), err))
			} else {
				w.stats["liveness: ADDs served by the agent"]++
				w.checkAdd(run, ip)
			}
		}
		inv.ans, inv.done = ans, true
	})
	ready := func() bool { return inv.done || ag.dead }
	if !w.quiet && w.o.Crashes && w.s.chance(w.o.CrashRate) {
		// The plugin's process dies while it waits (the runtime's timeout,
		// a node's OOM killer): the agent sees its client gone and cancels
		// what it has not written yet.
		c.a.waitUntil(ready, w.s.now.Add(time.Duration(w.s.pick(40))*time.Millisecond))
		if !ready() {
			w.tr.add("CRASH of the plugin waiting for the agent's answer")
			w.stats["crashes"]++
			w.stats["agent: clients gone while it served"]++
			cancel()
			c.a.killed = true
			panic(goExit{})
		}
	}
	c.a.waitFor(ready)
	cancel()
	if !inv.done {
		return client.Result{Outcome: client.Lost, Reason: "node agent: read its answer: EOF"}
	}
	return client.Result{Outcome: client.Served, Answer: inv.ans}
}
