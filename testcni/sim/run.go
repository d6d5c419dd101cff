package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
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
	// NADKinds adds, in some schedules, the NADs whereabouts users make
	// beside the storage network (kinds.go): range and ipRanges on one
	// network, dual stack, two overlapping NADs with reservations off.
	// Off: the stories of the seeds found before they were modelled.
	NADKinds bool
	// Audit runs the audit (package audit) beside the world and holds its
	// verdicts to the model's ground truth at every look (auditcheck.go):
	// no finding opened that the world does not bear out, none missed past
	// its grace.
	Audit bool
	// Dir holds the nodes' checkpoints ("" is a temporary dir).
	Dir string
	// auditJudge replaces audit.Judge: the audit's checker's test.
	auditJudge func(audit.Snapshot, audit.Options) audit.Result
	// auditJudgesBehind has the audit judge while an informer is behind
	// after an API server restart: the audit's checker's test.
	auditJudgesBehind bool
	// auditTolerates leaves checkLive's breaks of live attachments (a
	// freed entry or reservation, an address held twice) to the audit: no
	// violation that stops the schedule, a fact it must report. The
	// audit's checker's test.
	auditTolerates bool
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
		Agents: true, AgentCrashRate: 0.02, AgentGroups: true, NADKinds: true, Audit: true}
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
	if o.NADKinds {
		// From a random source of their own, as the leftovers' below.
		w.addKinds(rand.New(rand.NewPCG(seed, 0x4ad5)))
	}
	if o.Leftovers {
		// From a random source of their own: the schedule's draws, and so
		// its story, are the same with and without them up to the first
		// request they change.
		w.leftovers(rand.New(rand.NewPCG(seed, 0x1ef7)))
	}
	res = Result{Seed: seed, Steps: o.Steps, Stats: w.stats}
	s.check = w.checkLive
	if o.auditTolerates {
		s.check = func() []string { return tolerated(w.checkLive()) }
	}
	if o.Audit {
		au := newAuditor(w)
		// The order each of its lists comes in, from a source of its own
		// (the schedule's story is the same with the audit and without).
		au.order = rand.New(rand.NewPCG(seed, 0xa0d1))
		// The API server's restarts, from another (the same story again).
		au.restarts = rand.New(rand.NewPCG(seed, 0x5e57))
		au.judgeBehind = o.auditJudgesBehind
		s.look, s.lookAt = au.look, au.nextLook
	}
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
	w.gcNets = []*network{storage, second}
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
	w.api.Put(append(objs, fake.NewPool(storage.pools()[0], storage.rng, allocs))...)
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
	p := &pod{ns: "longhorn-system", name: name, uid: w.uids, node: node, exists: true, created: w.s.now}
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
