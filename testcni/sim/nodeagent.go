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
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
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
//
// With Options.AgentGroups, an agent's requests share whereabouts' Lease as
// the agent's main has them share it: one shim.Group (its goroutines the
// agent's actors, through Group.Go and Await), held as the agent's start
// names itself (agent.Identity: the pod's UID, kept when its container
// restarts, and a random part; in half the schedules one name for every
// agent of the node, as before each start had one, so that shim's own rule
// keeps them apart). And the DaemonSet rolls out: a new pod starts beside
// the old one (maxSurge 1) and takes the socket once it serves; the old one
// finishes what it took, hands the Lease back and exits.

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
	// pod is the DaemonSet's pod it runs in (its UID): a container
	// restarted after a kill keeps it, a rollout's new pod has another.
	pod string
	// prev is the agent a rollout's new pod started beside, while it runs:
	// it serves until this one does, and finishes what it took.
	prev *agentProc
	// stopping: it was told to stop (SIGTERM): it takes nothing more.
	stopping bool
	// verbs are the verbs it took and has not answered.
	verbs int
	// group is its requests' holder of whereabouts' Lease (AgentGroups).
	group *shim.Group
}

// agentOf is the agent serving on n now, nil when n has none or it is down:
// the newest, or during a rollout the old one until the new one serves.
func (w *world) agentOf(n *node) *agentProc {
	for ag := w.agents[n.name]; ag != nil; ag = ag.prev {
		if !ag.dead && ag.serving && !ag.stopping {
			return ag
		}
	}
	return nil
}

// agentsOn are the node's agents that run: the current one, and the one a
// rollout started it beside.
func (w *world) agentsOn(n *node) []*agentProc {
	var out []*agentProc
	for ag := w.agents[n.name]; ag != nil; ag = ag.prev {
		if !ag.dead {
			out = append(out, ag)
		}
	}
	return out
}

// startAgent starts the agent of n in actor a (the DaemonSet's pod
// starting, pod its UID, beside prev in a rollout): its server and
// allocator, a health check (whose failure makes it decline until the next
// one), then its informers.
func (w *world) startAgent(a *actor, n *node, pod string, prev *agentProc) {
	w.agentRuns++
	if prev != nil && prev.dead {
		prev = nil
	}
	ag := &agentProc{w: w, node: n, serial: w.agentRuns, objs: cache.New(), pod: pod, prev: prev}
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
	storeOptions := w.options("")
	identity := ""
	if w.o.AgentGroups {
		// As the agent's main names itself (agent.Identity: the node, the
		// pod's UID, 8 random hex digits; drawn from the schedule here, so
		// that it replays), or, in the schedules that play the agents
		// before that, one name for every start on the node.
		identity = fmt.Sprintf("harvester-ipam-agent/%s/%s/%08x", n.name, pod, w.s.rng.Uint32())
		if w.sameNames {
			identity = "harvester-ipam-agent/" + n.name + "/1"
		}
		ag.group = &shim.Group{Identity: identity,
			Go:    func(f func()) { ag.spawn("lease", false, func(*actor) { f() }) },
			Await: wait,
		}
		storeOptions.Group = ag.group
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
		Allocator:      alloc.Delegate{Batcher: al, Load: conf.Loader{Quiet: true}.Whereabouts},
		Log:            io.Discard,
		MaxInFlight:    agentSlots,
		VerbTimeout:    time.Hour,
		Env:            []string{},
		Identity:       identity,
		StoreOptions:   storeOptions,
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
	if prev != nil {
		w.tr.add("agent %d starts on %s beside agent %d (a rollout)", ag.serial, n.name, prev.serial)
	} else {
		w.tr.add("agent %d starts on %s", ag.serial, n.name)
	}
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
			// Its container restarted in the same pod.
			w.startAgent(a, n, ag.pod, ag.prev)
		}
	})
	if cur := w.s.cur; cur != nil && cur.proc == ag {
		panic(goExit{})
	}
}

// rollout is the DaemonSet's rolling update on n (maxSurge 1): a new pod
// starts beside the running agent and takes the socket once it serves; once
// it is ready (its probe passed, a few seconds on) the old pod is deleted:
// its agent takes nothing more, finishes what it took, hands whereabouts'
// Lease back and exits. A kill of either meanwhile is as any kill: the new
// pod's container restarts, the old one is gone.
func (w *world) rollout(n *node) {
	old := w.agents[n.name]
	if old == nil || old.dead || old.prev != nil && !old.prev.dead {
		return // one pod at a time (maxSurge 1)
	}
	w.agentPods++
	pod := fmt.Sprintf("pod-%d", w.agentPods)
	w.stats["agent rollouts"]++
	w.tr.add("the agent's DaemonSet rolls out on %s: a new pod beside agent %d", n.name, old.serial)
	// An upgrade on a busy day: in half the rollouts, pods start on the
	// node as the new agent does, so that the old one is still serving
	// what it took when the new one serves.
	var after time.Duration
	if w.s.chance(0.5) {
		w.stats["agent rollouts in a storm"]++
		// Pods of the node get new sandboxes (their ADDs release the
		// earlier ones', in turns under the Lease) as new pods start.
		for _, q := range w.pods_() {
			if q.node == n.name && q.exists && w.s.chance(0.5) {
				w.start(q, time.Duration(w.s.pick(80))*time.Millisecond)
			}
		}
		w.stormOf(n, 4+w.s.pick(5), 80*time.Millisecond)
		after = time.Duration(w.s.pick(40)) * time.Millisecond
	}
	w.s.spawn("daemonset rollout "+n.name, func(a *actor) {
		a.sleep(after)
		if old.dead && w.agents[n.name] != old {
			return // the node went meanwhile, or a reboot replaced it
		}
		w.startAgent(a, n, pod, old)
	})
	w.s.spawn("daemonset rollout of "+n.name+" deletes the old pod", func(a *actor) {
		// Ready: the current agent of the new pod serves, then a while.
		a.waitFor(func() bool {
			cur := w.agents[n.name]
			return old.dead || cur == nil || cur != old && cur.serving && !cur.dead
		})
		a.sleep(time.Duration(w.s.pick(3000)) * time.Millisecond)
		if !old.dead {
			old.stop()
		}
	})
}

// stop is the agent's SIGTERM (its pod deleted): it declines from now on,
// waits for the verbs it took, and for its Group to hand whereabouts' Lease
// back (agent.Server.Stop), then exits; the DaemonSet does not start it
// again.
func (ag *agentProc) stop() {
	w := ag.w
	ag.stopping = true
	w.tr.add("agent %d on %s stops (its pod deleted)", ag.serial, ag.node.name)
	ag.spawn("stop", false, func(a *actor) {
		a.waitFor(func() bool { return ag.verbs == 0 })
		if err := ag.srv.Stop(context.Background()); err != nil {
			w.tr.add("agent %d: stop: %v", ag.serial, err)
		}
		w.tr.add("agent %d on %s exits", ag.serial, ag.node.name)
		w.stats["agent exits after a rollout"]++
		ag.exit()
		panic(goExit{})
	})
}

// exit ends the agent's process as it exits: every actor of it ends, and
// nothing starts it again.
func (ag *agentProc) exit() {
	w := ag.w
	ag.dead, ag.serving = true, false
	for _, x := range ag.actors {
		if !x.done {
			x.killed = true
			if x.at.After(w.s.now) {
				x.at = w.s.now
			}
		}
	}
	ag.actors = nil
	for _, cur := range w.agentsOn(ag.node) {
		if cur.prev == ag {
			cur.prev = nil
		}
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
	// The plugin falls back only when the agent is absent (above: none, or
	// its process dead), declines (Take), or is wedged: its process idle
	// while the request waits unread (client.DefaultSilence), drawn here as
	// the 100 ms bound on the receipt once was, which a busy node no longer
	// trips. The agent never read the request: nothing is written for it.
	if !w.quiet && w.s.chance(0.02) {
		return client.Result{Outcome: client.Fallback, Reason: fmt.Sprintf("node agent: silent for %s in which its process was idle (wedged)", client.DefaultSilence)}
	}
	j, free, reason, detail := ag.srv.Take(req)
	if reason != "" {
		return client.Result{Outcome: client.Fallback, Reason: "node agent declined: " + detail}
	}
	if ag.prev != nil || ag.stopping || w.agents[c.n.name] != ag {
		w.stats["agent: verbs taken during a rollout"]++
	}
	// Go: the verb is the agent's now.
	vctx, cancel := context.WithCancel(context.Background())
	inv := &invocation{}
	run := c.a.add
	if run != nil {
		run.users++
	}
	ag.verbs++
	ag.spawn(fmt.Sprintf("%s %s/%s", req.Command, req.Env[wire.EnvContainerID], req.Env[wire.EnvIfName]), false, func(x *actor) {
		defer func() { ag.verbs-- }()
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
			ips, err := result(x, req.Command, ans.Stdout, nil)
			if err != nil {
				w.s.violations = append(w.s.violations, fmt.Sprintf("the agent's ADD of %s answered no address: %v", run.att.name(), err))
			} else {
				w.stats["liveness: ADDs served by the agent"]++
				w.checkAdd(run, ips)
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
