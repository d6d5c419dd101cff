package sim

import (
	"fmt"
	"time"
)

// event is one thing happening in the world.
func (w *world) event(a *actor) {
	p := w.randomPod()
	// With AgentGroups, 4 in 104 events are a rollout of the agents (the
	// others as before, each a little rarer).
	span := 100
	if w.o.Agents && w.o.AgentGroups {
		span = 104
	}
	switch r := w.s.pick(span); {
	case r >= 100: // the agents' DaemonSet rolls out on a node
		n := w.nodes[w.s.pick(len(w.nodes))]
		if n.exists {
			w.rollout(n)
		}
	case r < 25: // the kubelet starts a sandbox (and kills the one it replaces)
		// Not while a sandbox of the pod is being stopped: the kubelet makes
		// no new sandbox until the old one's StopPodSandbox (its DELs)
		// succeeded.
		// One at a time: the pod worker is busy until the start it began ends.
		w.start(p, 0)
	case r < 35: // a sandbox dies without DEL: a crash loop, a failed creation
		if p.current != nil && p.current.state == sbLive {
			w.kill(p.current, "crashed", false)
		}
	case r < 45: // the kubelet stops a sandbox: DEL
		if sb := p.current; sb != nil && sb.state == sbLive {
			w.kill(sb, "stopped", true)
			w.spawnKubelet("stop "+p.name, func(k *actor) { w.teardown(k, sb) })
		}
	case r < 55: // the kubelet removes the sandboxes it stopped: the DELs it owes
		w.spawnKubelet("cleanup", func(k *actor) { w.cleanup(k) })
	case r < 59: // a node reboots; now and then it loses containerd's root too
		n := w.nodes[w.s.pick(len(w.nodes))]
		lost := w.s.chance(0.3)
		w.tr.add("node %s reboots (root lost: %v)", n.name, lost)
		// The node is back in a second or two: the kubelet starts the
		// agent's pod (host network, no CNI) and then every pod of the
		// node at once, a storm on its pools (the agent's group commit).
		var back time.Duration
		if w.o.Agents {
			back = time.Duration(1000+w.s.pick(1000)) * time.Millisecond
		}
		for _, ag := range w.agentsOn(n) {
			ag.kill("by the reboot", back)
		}
		if w.o.Agents {
			// The plugin's processes in flight die with the node too.
			for _, x := range w.s.actors {
				if x.inCall == n && !x.done && !x.killed {
					x.killed = true
					if x.at.After(w.s.now) {
						x.at = w.s.now
					}
					w.tr.add("the plugin's process of %s dies with the node", x.name)
				}
			}
		}
		for _, sb := range w.sbs {
			if sb.node == n.name && sb.state != sbDeleted {
				w.kill(sb, "reboot", false)
				if lost {
					sb.lostCache = true
				}
			}
		}
		if w.o.Agents {
			storm := back + time.Duration(500+w.s.pick(2000))*time.Millisecond
			for _, q := range w.pods_() {
				if q.node == n.name {
					w.start(q, storm+time.Duration(w.s.pick(20))*time.Millisecond)
				}
			}
		}
	case r < 63: // the pod is force-deleted: the kubelet stops its sandbox at once
		if p.exists {
			w.tr.add("pod %s force-deleted", p.ref())
			p.exists = false
			w.podDeleted(p)
			if sb := p.current; sb != nil && (sb.state == sbLive || sb.state == sbCreating) {
				w.kill(sb, "pod deleted", true)
				w.spawnKubelet("stop "+p.name, func(k *actor) { w.teardown(k, sb) })
			}
		}
	case r < 68: // a pod of that name is created again, on some node
		// Once the old pod's sandbox is gone: a pod name recreated while its
		// old sandbox still runs elsewhere is what Kubernetes (and
		// harvester-ipam) assume does not happen.
		if !p.exists && !w.stopping(p.name) {
			n := w.liveNode()
			if n != nil {
				np := w.newPod(p.name, n.name)
				w.tr.add("pod %s created again on %s", np.ref(), n.name)
			}
		}
	case r < 70: // a node is removed: its pods are force-deleted, no DEL ever comes
		n := w.nodes[w.s.pick(len(w.nodes))]
		if n.exists && w.liveNodes() > 1 {
			w.tr.add("node %s removed", n.name)
			n.exists = false
			for _, ag := range w.agentsOn(n) {
				ag.kill("with its node", 0)
			}
			for _, q := range w.pods_() {
				if q.node == n.name && q.exists {
					q.exists = false
					w.podDeleted(q)
				}
			}
			for _, sb := range w.sbs {
				if sb.node == n.name {
					w.kill(sb, "node removed", false)
				}
			}
		}
	case r < 72: // the storage network's setting changes: a new NAD, a new range
		w.replaceNetwork()
	case r < 75: // Multus' cache of a sandbox is lost
		if sb := w.randomSandbox(); sb != nil && !sb.lostCache {
			w.tr.add("Multus' cache of %s lost", sb.id)
			sb.lostCache = true
		}
	case r < 85: // a reconciler pass
		if w.o.WBReconciler && w.s.chance(0.5) {
			w.s.spawn("whereabouts reconciler", func(k *actor) { w.wbReconcile(k) })
			break
		}
		w.s.spawn("reconciler", func(k *actor) { w.reconcile(k) })
	case r < 88: // GC on a node (CRI-O calls it; containerd does not)
		n := w.nodes[w.s.pick(len(w.nodes))]
		if n.exists {
			net := w.gcNets[w.s.pick(len(w.gcNets))]
			w.s.spawn("gc", func(k *actor) { w.gc(k, n, net) })
		}
	case r < 90 && w.o.sabotage: // someone edits a pool by hand: not a step the product takes
		for _, att := range w.live() {
			p := w.api.Pool(poolNS, att.net.pools()[0])
			for off, e := range p.Spec.Allocations {
				if e.ContainerID == att.sb.id {
					delete(p.Spec.Allocations, off)
				}
			}
			_, _ = w.api.UpdatePool(poolNS, p)
			w.tr.add("SABOTAGE: %s removed from its pool", att)
			break
		}
	case r < 91 && w.o.Agents:
		n := w.nodes[w.s.pick(len(w.nodes))]
		if w.s.chance(0.5) { // a node's agent is killed (OOM, its pod deleted)
			if ag := w.agents[n.name]; ag != nil {
				ag.kill("by the world", 0)
			}
			break
		}
		if n = w.nodes[0]; n.exists { // the node that has an agent
			w.storm(n)
		}
	case r < 94: // the API server has a bad moment
		if w.o.Faults {
			d := time.Duration(500+w.s.pick(4500)) * time.Millisecond
			w.tr.add("the API server fails requests for %s", d)
			w.faultsUntil = w.s.now.Add(d)
		}
	default: // time passes: past the reconciler's grace
		w.tr.add("%s pass", w.o.Grace+time.Minute)
		// The kubelet keeps retrying the DELs it owes meanwhile (its pod
		// workers and sandbox GC come back to them within a minute or so):
		// a node that cannot reach the API server for longer than the grace
		// is an assumption the README states, not a world modelled here.
		for m := time.Duration(0); m < w.o.Grace+time.Minute; m += time.Minute {
			a.sleep(time.Minute)
			if w.owesDELs() {
				w.spawnKubelet("resync", func(k *actor) { w.cleanup(k) })
			}
		}
	}
}

// storm is new pods created on n at once (a Longhorn upgrade replacing its
// instance managers, a volume attached to many workloads): their sandboxes'
// ADDs meet in the node's agent with no earlier sandbox to release first,
// so that its allocator commits them together. They are deleted again, each
// stopped with its DELs, a while later.
func (w *world) storm(n *node) {
	w.stormOf(n, 2+w.s.pick(2), 3*time.Millisecond)
}

// stormOf is a storm of k pods on n, their sandboxes started within spread.
func (w *world) stormOf(n *node, k int, spread time.Duration) {
	w.tr.add("%d new pods on %s at once", k, n.name)
	var ps []*pod
	for i := 0; i < k; i++ {
		w.storms++
		p := w.newPod(fmt.Sprintf("share-manager-s%d", w.storms), n.name)
		p.nets = map[string]*network{"lhnet1": w.successor(w.nets[0])}
		w.start(p, time.Duration(w.s.pick(int(spread/time.Millisecond)))*time.Millisecond)
		ps = append(ps, p)
	}
	w.s.spawn("storm", func(a *actor) {
		a.sleep(time.Duration(5+w.s.pick(25)) * time.Second)
		for _, p := range ps {
			if !p.exists {
				continue
			}
			w.tr.add("pod %s deleted", p.ref())
			p.exists, p.deletedGracefully = false, true
			w.podDeleted(p)
			if sb := p.current; sb != nil && (sb.state == sbLive || sb.state == sbCreating) {
				w.kill(sb, "pod deleted", true)
				w.spawnKubelet("stop "+p.name, func(k *actor) { w.teardown(k, sb) })
			}
		}
	})
}
