package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/shim/names"
	"github.com/harvester/harvester-ipam/shim/reconcile"
)

// Options shape the schedules.
type Options struct {
	// Whereabouts is the version the world runs: fake.V093, V080 or V070.
	Whereabouts string
	// Steps are the world's events in one schedule.
	Steps int
	// Crashes kill the plugin at its step boundaries (CrashRate each) and
	// between its requests (a twentieth of that).
	Crashes   bool
	CrashRate float64
	// Faults make the API server fail requests, or lose their responses, for
	// a while now and then.
	Faults bool
	// Grace is the reconciler's.
	Grace time.Duration
	// PodController runs whereabouts' pod controller (ip-control-loop) on
	// each pod deletion, as Harvester's whereabouts DaemonSet does.
	PodController bool
	// WBReconciler runs whereabouts' own reconciler now and then (see
	// wbReconcile): off by default.
	WBReconciler bool
	// Leftovers starts the world with entries an older whereabouts (v0.7.0,
	// no ifname) left in the storage pool: of the pods' earlier sandboxes, a
	// random number each, and of a pod that is gone, as after an upgrade from
	// a 2024 Harvester (see leftovers).
	Leftovers bool
	// Agents puts harvester-ipam's node agent on the first node, and on
	// the second in half the schedules (agent.go): the verbs of those nodes
	// go to it first, beside the exec path of the others on the same pools.
	Agents bool
	// AgentCrashRate kills an agent at each step boundary of its work (and
	// before each of its requests, a twentieth of that); its informers'
	// watches deliver late, break and list again (informer.go).
	AgentCrashRate float64
	// AgentGroups runs the agents as their main does: their requests share
	// whereabouts' Lease through one shim.Group under the scheduler, held
	// as the agent's start names itself; and the DaemonSet rolls them out,
	// a new agent beside the old one (agent.go). Off: each request takes
	// the Lease itself, and no rollout (the seeds found before play their
	// stories so).
	AgentGroups bool
	// Dir holds the nodes' checkpoints ("" is a temporary dir).
	Dir string
	// sabotage frees live entries behind everyone's back: the checker's test.
	sabotage bool
	// livenessOfPlain checks the liveness after ADD of the pod on
	// whereabouts alone too: the checker's test (whereabouts v0.7.0 alone
	// leaks a crash-looping pod's addresses).
	livenessOfPlain bool
	// podControllerFreesAll makes whereabouts' pod controller release every
	// entry of the deleted pod's pools, not just the pod's: the checker's test.
	podControllerFreesAll bool
	// leaseDeletedByHand deletes whereabouts' Lease now and then while a
	// holder is inside its turn, as an operator might: the next holder
	// takes it meanwhile. The checker's test.
	leaseDeletedByHand bool
}

// DefaultOptions are the schedules `make sim` and the tests run.
func DefaultOptions(whereabouts string) Options {
	return Options{Whereabouts: whereabouts, Steps: 16, Crashes: true, CrashRate: 0.05, Faults: true, Grace: 10 * time.Minute, PodController: true, Leftovers: true,
		Agents: true, AgentCrashRate: 0.02, AgentGroups: true}
}

// Result is one schedule's outcome.
type Result struct {
	Seed       uint64
	Steps      int
	Violations []string
	// Trace is the story of the schedule, step by step.
	Trace string
	// State is the pools, reservations and sandboxes when it stopped.
	State string
	Stats map[string]int
}

// Run plays the schedule of seed.
func Run(seed uint64, o Options) (res Result, err error) {
	dir := o.Dir
	if dir == "" {
		base := os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			base = "/dev/shm" // checkpoints are fsynced: keep it cheap
		}
		if dir, err = os.MkdirTemp(base, "harvester-ipam-sim-"); err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(dir)
	}
	tr := &trace{}
	s := newSched(seed, tr)
	tr.s = s
	w, err := newWorld(s, tr, o, dir)
	if err != nil {
		return Result{}, err
	}
	if err := w.setup(); err != nil {
		return Result{}, err
	}
	if o.Leftovers {
		// From a random source of their own: the schedule's draws, and so
		// its story, are the same with and without them up to the first
		// request they change.
		w.leftovers(rand.New(rand.NewPCG(seed, 0x1ef7)))
	}
	res = Result{Seed: seed, Steps: o.Steps, Stats: w.stats}
	s.check = w.checkLive
	if s.chance(0.5) {
		s.usePCT(1+s.pick(3), 2000)
	}
	if o.Agents && o.AgentGroups {
		// Half the schedules name every agent of a node alike, as the
		// agents named themselves before each start had a name of its own
		// (pid 1 in every container): shim's rule alone keeps them apart.
		w.sameNames = s.chance(0.5)
		if w.sameNames {
			tr.add("every agent of a node holds whereabouts' Lease under one name")
		}
	}
	defer func() { res.Trace, res.State = tr.String(), w.describe() }()

	defer s.abandon() // the agents' informers and checks run on
	w.startAgents()
	s.spawn("director", func(a *actor) { w.direct(a) })
	if !s.run(time.Time{}) {
		res.Violations = s.violations
		return res, nil
	}
	if !w.settle() {
		res.Violations = s.violations
		return res, nil
	}
	res.Violations = w.checkQuiet()
	return res, nil
}

// setup makes the world: two nodes, a storage network (and a second NAD on
// the same range, for pods attached twice), whereabouts alone on that range
// too, and a few Longhorn pods.
func (w *world) setup() error {
	storage := &network{name: "storagenetwork", rng: "10.0.0.0/27", exclude: []string{"10.0.0.1/32"}}
	second := &network{name: "storagenetwork-b", rng: "10.0.0.0/27", exclude: []string{"10.0.0.1/32"}}
	plain := &network{name: "plainnetwork", rng: "10.0.0.0/27", exclude: []string{"10.0.0.1/32"}, plain: true}
	w.nets = []*network{storage, second, plain}
	names := []string{"instance-manager-a", "instance-manager-b", "backing-image-manager-c", "plain-d"}
	// With node agents, a pod on a range that overlaps the storage
	// network's (whereabouts' overlapping ranges: another pool, the same
	// reservations), on the first node: its agent then gives up addresses
	// the other pool's pods reserved.
	overlap := &network{name: "rwxnetwork", rng: "10.0.0.0/28", exclude: []string{"10.0.0.1/32"}}
	if w.o.Agents {
		w.nets = append(w.nets, overlap)
		names = append(names, "share-manager-e")
	}
	for i := 1; i <= 2; i++ {
		n := &node{name: fmt.Sprintf("node-%d", i), exists: true, cpDir: filepath.Join(w.dir, fmt.Sprintf("node-%d", i))}
		if err := os.MkdirAll(n.cpDir, 0o700); err != nil {
			return err
		}
		w.nodes = append(w.nodes, n)
	}
	for i, name := range names {
		p := w.newPod(name, w.nodes[i%2].name)
		switch {
		case name == "plain-d":
			p.nets = map[string]*network{"eth1": plain}
		case name == "share-manager-e":
			p.nets = map[string]*network{"lhnet1": overlap}
		case i == 0 && w.s.chance(0.5):
			p.nets = map[string]*network{"lhnet1": storage, "lhnet2": second}
		default:
			p.nets = map[string]*network{"lhnet1": storage}
		}
	}
	return nil
}

// leftovers puts in the storage network's pool what whereabouts v0.7.0 left
// there before an upgrade (DESIGN: allocations written before v0.8 have no
// ifname): for each pod on harvester-ipam, 0 to 3 entries of earlier
// sandboxes that never got their DEL, and now and then one of a pod that is
// gone, each with its reservation. The pod's next ADD must release its own,
// whatever their number; the reconciler the gone pod's.
func (w *world) leftovers(rng *rand.Rand) {
	storage := w.nets[0]
	_, ipnet, _ := net.ParseCIDR(storage.rng)
	allocs := map[string]shim.IPAllocation{}
	var objs []any
	off := 30 // from the top of the /27 down: whereabouts allocates from the bottom up
	add := func(ref, id string) {
		ip, _ := shim.OffsetIP(ipnet.IP, fmt.Sprint(off))
		allocs[fmt.Sprint(off)] = shim.IPAllocation{ContainerID: id, PodRef: ref}
		objs = append(objs, fake.NewReservation(names.Reservation(ip, storage.netName), ref))
		off--
	}
	for _, p := range w.pods_() {
		if p.nets["lhnet1"] != storage {
			continue
		}
		for i := rng.IntN(4); i > 0; i-- {
			add(p.ref(), fmt.Sprintf("v070-%d-%s", i, p.name))
		}
	}
	if rng.IntN(2) == 0 {
		add("longhorn-system/instance-manager-gone", "v070-gone")
	}
	if len(allocs) == 0 {
		return
	}
	w.api.Put(append(objs, fake.NewPool(storage.pool(), storage.rng, allocs))...)
	w.tr.add("left by whereabouts v0.7.0: %d entries", len(allocs))
}

// startAgents starts the node agents: on the first node, and on the
// second in half the schedules.
func (w *world) startAgents() {
	if !w.o.Agents {
		return
	}
	for i, n := range w.nodes {
		if i > 0 && !w.s.chance(0.5) {
			continue
		}
		w.agents[n.name] = nil
		w.agentPods++
		pod := fmt.Sprintf("pod-%d", w.agentPods)
		w.s.spawn("daemonset "+n.name, func(a *actor) { w.startAgent(a, n, pod, nil) })
	}
}

func (w *world) newPod(name, node string) *pod {
	w.uids++
	p := &pod{ns: "longhorn-system", name: name, uid: w.uids, node: node, exists: true}
	if old, ok := w.pods[p.ref()]; ok {
		p.nets = map[string]*network{}
		for ifn, n := range old.nets {
			p.nets[ifn] = w.successor(n)
		}
	}
	w.pods[p.ref()] = p
	w.all = append(w.all, p)
	return p
}

// successor is the network that replaced n, if its NAD was replaced.
func (w *world) successor(n *network) *network {
	for n.deleted {
		found := false
		for _, m := range w.nets {
			if m.name == n.name+"-v2" {
				n, found = m, true
				break
			}
		}
		if !found {
			break
		}
	}
	return n
}

// direct plays the world's events, at random, concurrently with what they
// start.
func (w *world) direct(a *actor) {
	for step := 0; step < w.o.Steps; step++ {
		a.sleep(time.Duration(w.s.pick(3000)) * time.Millisecond)
		w.event(a)
	}
}

func (w *world) pods_() []*pod {
	var out []*pod
	for _, ref := range sortedKeys(w.pods) {
		out = append(out, w.pods[ref])
	}
	return out
}

func (w *world) randomPod() *pod {
	ps := w.pods_()
	return ps[w.s.pick(len(ps))]
}

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
			net := w.nets[w.s.pick(2)]
			w.s.spawn("gc", func(k *actor) { w.gc(k, n, net) })
		}
	case r < 90 && w.o.sabotage: // someone edits a pool by hand: not a step the product takes
		for _, att := range w.live() {
			p := w.api.Pool(poolNS, att.net.pool())
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
			p.exists = false
			w.podDeleted(p)
			if sb := p.current; sb != nil && (sb.state == sbLive || sb.state == sbCreating) {
				w.kill(sb, "pod deleted", true)
				w.spawnKubelet("stop "+p.name, func(k *actor) { w.teardown(k, sb) })
			}
		}
	})
}

// start has the kubelet start a sandbox of p after d (and kill the one it
// replaces), if it would: not while a sandbox of the pod is being made, nor
// while one is being stopped (the kubelet makes no new sandbox until the old
// one's StopPodSandbox, its DELs, succeeded).
func (w *world) start(p *pod, d time.Duration) {
	if p.exists && !p.starting && (p.current == nil || p.current.state != sbCreating) && !w.stopping(p.name) && !w.plainTearing(p.name) {
		p.starting = true
		w.spawnKubelet("start "+p.name, func(k *actor) {
			defer func() { p.starting = false }()
			if d > 0 {
				k.sleep(d)
			}
			w.startSandbox(k, p)
		})
	}
}

// owesDELs says whether a sandbox on an existing node waits for its DELs.
func (w *world) owesDELs() bool {
	for _, sb := range w.sbs {
		if sb.state == sbDead && sb.delPending && sb.tearing == 0 {
			if n := w.node(sb.node); n != nil && n.exists {
				return true
			}
		}
	}
	return false
}

// plainTearing says whether DELs of a sandbox of the pod on whereabouts
// alone are being sent (see teardown).
func (w *world) plainTearing(name string) bool {
	for _, sb := range w.sbs {
		if sb.pod.name == name && sb.tearing > 0 && sb.plain() {
			return true
		}
	}
	return false
}

// stopping says whether a sandbox of a pod of that name is being stopped:
// its network namespace still holds interfaces.
func (w *world) stopping(name string) bool {
	for _, sb := range w.sbs {
		if sb.pod.name == name && sb.state == sbDead && sb.netns {
			return true
		}
	}
	return false
}

func (w *world) spawnKubelet(what string, f func(a *actor)) {
	w.s.spawn("kubelet "+what, f)
}

func (w *world) cleanup(a *actor) {
	for _, sb := range w.sbs {
		if sb.state == sbDead && sb.delPending {
			w.teardown(a, sb)
		}
	}
}

func (w *world) liveNode() *node {
	var ns []*node
	for _, n := range w.nodes {
		if n.exists {
			ns = append(ns, n)
		}
	}
	if len(ns) == 0 {
		return nil
	}
	return ns[w.s.pick(len(ns))]
}

func (w *world) liveNodes() int {
	c := 0
	for _, n := range w.nodes {
		if n.exists {
			c++
		}
	}
	return c
}

func (w *world) randomSandbox() *sandbox {
	var sbs []*sandbox
	for _, sb := range w.sbs {
		if sb.state != sbDeleted {
			sbs = append(sbs, sb)
		}
	}
	if len(sbs) == 0 {
		return nil
	}
	return sbs[w.s.pick(len(sbs))]
}

// replaceNetwork deletes the storage NAD and makes another with a new range,
// as Harvester does when the storage-network setting changes; pods attach it
// from their next sandbox on.
func (w *world) replaceNetwork() {
	old := w.nets[0]
	if old.deleted {
		return
	}
	nn := &network{name: old.name + "-v2", rng: "10.0.1.0/27", exclude: []string{"10.0.1.1/32"}}
	if w.s.chance(0.5) {
		nn.netName = "storage"
	}
	old.deleted = true
	w.nets = append(w.nets, nn)
	for _, p := range w.pods_() {
		for ifn, n := range p.nets {
			if n == old {
				p.nets[ifn] = nn
			}
		}
	}
	w.tr.add("the storage network's NAD replaced: %s (network_name %q)", nn.rng, nn.netName)
}

func (w *world) reconcile(a *actor) {
	r := &reconcile.Reconciler{Store: w.store("reconciler"), Cluster: cluster{w}, Grace: w.o.Grace}
	rep, err := r.Pass(context.Background())
	if a.killed {
		return
	}
	if err != nil {
		w.tr.add("reconciler pass failed: %v", err)
		return
	}
	w.tr.add("reconciler pass: %d stale, %d released, %d reservations deleted, %d errors", rep.Candidates(), len(rep.Released), len(rep.DeletedORIPs), len(rep.Errors))
	w.stats["reconciler releases"] += len(rep.Released)
}

// settle brings the world to rest: no more faults or crashes; every DEL the
// runtime owes is sent; every pod gets a sandbox; the reconciler runs past
// its grace. It returns false when an invariant broke meanwhile.
func (w *world) settle() bool {
	w.quiet = true
	w.faultsUntil = time.Time{}
	w.tr.add("--- the world settles")
	w.s.spawn("kubelet settle", func(a *actor) {
		w.cleanup(a)
		for _, p := range w.pods_() {
			if p.exists && !p.starting && w.node(p.node).exists && (p.current == nil || p.current.state != sbLive) && !w.stopping(p.name) {
				w.startSandbox(a, p)
			}
		}
	})
	if !w.s.run(time.Time{}) {
		return false
	}
	for i := 0; i < 3; i++ {
		w.s.spawn("reconciler", func(a *actor) {
			w.reconcile(a)
			a.sleep(w.o.Grace + time.Second)
		})
		if !w.s.run(time.Time{}) {
			return false
		}
	}
	return true
}
