package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// poolNS is the simulated whereabouts namespace.
const poolNS = "kube-system"

// network is a NAD whose IPAM is harvester-ipam (or whereabouts itself):
// the ranges whereabouts allocates from, an address of each per
// attachment.
type network struct {
	name string // the CNI network's (and the NAD's) name
	// rng and exclude are the NAD's range and its exclude ("": it has
	// ipRanges alone); more are its ipRanges. whereabouts allocates from
	// rng first, then each of more (ranges), one pool each.
	rng     string
	exclude []string
	more    []ipRange
	netName string // whereabouts' network_name
	// noOverlap is enable_overlapping_ranges: false: whereabouts consults
	// and writes no reservation, and hands out from its own pool an
	// address another pool holds, by design.
	noOverlap bool
	// plain networks name whereabouts itself: racing writers beside harvester-ipam.
	plain   bool
	deleted bool
}

// ipRange is one range of a network: its CIDR and its exclude.
type ipRange struct {
	cidr    string
	exclude []string
}

// ranges are the network's ranges in the order whereabouts allocates from
// them (its loader puts range before ipRanges).
func (n *network) ranges() []ipRange {
	var out []ipRange
	if n.rng != "" {
		out = append(out, ipRange{n.rng, n.exclude})
	}
	return append(out, n.more...)
}

// pools are the IPPools of the network's ranges, in that order.
func (n *network) pools() []string {
	var out []string
	for _, r := range n.ranges() {
		out = append(out, names.Pool(r.cidr, n.netName))
	}
	return out
}

// hasPool says whether one of the network's ranges is kept in pool.
func (n *network) hasPool(pool string) bool {
	for _, p := range n.pools() {
		if p == pool {
			return true
		}
	}
	return false
}

// config is the network config a runtime hands the IPAM plugin, as Multus
// caches it at ADD.
func (n *network) config(w *world) []byte {
	typ := "harvester-ipam"
	if n.plain {
		typ = "whereabouts"
	}
	ipam := map[string]any{"type": typ, "configuration_path": w.flat,
		"harvester_ipam": map[string]any{"checkpoint_dir": "%CHECKPOINTS%"}}
	if n.rng != "" {
		ipam["range"] = n.rng
	}
	if len(n.exclude) > 0 {
		ipam["exclude"] = n.exclude
	}
	if len(n.more) > 0 {
		var rs []map[string]any
		for _, r := range n.more {
			m := map[string]any{"range": r.cidr}
			if len(r.exclude) > 0 {
				m["exclude"] = r.exclude
			}
			rs = append(rs, m)
		}
		ipam["ipRanges"] = rs
	}
	if n.netName != "" {
		ipam["network_name"] = n.netName
	}
	if n.noOverlap {
		ipam["enable_overlapping_ranges"] = false
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": "0.3.1", "name": n.name, "type": "bridge", "bridge": "mgmt-br", "ipam": ipam})
	return b
}

type node struct {
	name   string
	exists bool // the Node object
	cpDir  string
}

type podState int

const (
	podPending podState = iota
	podRunning
)

// pod is one incarnation of a pod: a force-deleted pod recreated under the
// same name is another pod object (another UID).
type pod struct {
	ns, name string
	uid      int
	node     string
	exists   bool
	phase    podState
	// nets are the pod's networks, by interface: what Multus attaches.
	nets map[string]*network
	// current is the pod's newest sandbox.
	current *sandbox
	// starting: the kubelet's pod worker is making a sandbox of the pod. It
	// makes one at a time: never two sandboxes of one pod at once.
	starting bool
	// status are the addresses of Multus' network-status, by interface;
	// statusOf is the sandbox whose ADD wrote it (its networks are the
	// status' NADs).
	status   map[string][]string
	statusOf *sandbox
	// created is when the pod object was made; deletedGracefully: it was
	// deleted (not force-deleted), and the API shows it being deleted, a
	// deletionTimestamp on it, while its sandbox is stopped (the audit's
	// snapshot; see auditPods).
	created           time.Time
	deletedGracefully bool
}

func (p *pod) ref() string { return p.ns + "/" + p.name }

type sbState int

const (
	sbCreating sbState = iota
	sbLive
	sbDead    // stopped or crashed; its attachments may still hold entries
	sbDeleted // every DEL the runtime meant to send succeeded
)

func (s sbState) String() string {
	return [...]string{"creating", "live", "dead", "deleted"}[s]
}

type sandbox struct {
	id    string
	pod   *pod
	node  string
	state sbState
	atts  []*attachment
	// lostCache: Multus' cache of this sandbox is gone: no DEL reaches IPAM.
	lostCache bool
	// delPending: the runtime still owes this sandbox a DEL.
	delPending bool
	// netns: its network namespace still exists (a sandbox being stopped
	// keeps it until its DELs; a crash or a reboot does not).
	netns bool
	// tearing: how many runs of its DELs are under way.
	tearing int
}

// plain says whether the sandbox's networks are whereabouts' alone.
func (sb *sandbox) plain() bool { return len(sb.atts) > 0 && sb.atts[0].net.plain }

type attachment struct {
	sb     *sandbox
	ifname string
	net    *network
	config []byte // the config Multus cached at ADD
	// ips are what ADD returned, an address of each of the network's
	// ranges in their order; nil until then.
	ips []net.IP
	// delStarted: its own DEL was sent; the address is its DEL's to free.
	delStarted bool
	// podControllerFreed: whereabouts' pod controller released its entry
	// after its pod object was deleted, while the runtime was still stopping
	// its sandbox (see podDeleted): no longer the product's to keep.
	podControllerFreed bool
	// freedByWhereabouts: whereabouts' own DEL (its binary, or its pod
	// controller) deleted the reservation of this attachment's address
	// (see whereaboutsDeletes): whereabouts' own hazard, no longer the
	// product's to keep.
	freedByWhereabouts bool
	// lostReservationRace: whereabouts' ADD of this attachment (alone)
	// failed after writing its entry, the address's reservation made under
	// it by a writer without whereabouts' Lease.
	lostReservationRace bool
	// unreserved are the addresses (by text) whereabouts' ADD of this
	// attachment left without their reservation: an earlier range's
	// address had the pod's own (fake.Whereabouts.Unreserved), whereabouts'
	// own bug, which the product passes on; the audit must report it.
	unreserved map[string]bool
}

func (a *attachment) String() string {
	return fmt.Sprintf("%s/%s %s (%s %s)", a.sb.pod.ref(), a.ifname, a.sb.id, a.net.name, ipList(a.ips))
}

// address is one address of an attachment: what its ADD got in one range
// of its network.
type address struct {
	att  *attachment
	ip   net.IP
	pool string
}

// addresses are the attachment's addresses, one per range (none before
// its ADD returned).
func (a *attachment) addresses() []address {
	var out []address
	pools := a.net.pools()
	for i, ip := range a.ips {
		out = append(out, address{att: a, ip: ip, pool: pools[i]})
	}
	return out
}

// domain is where two attachments on one address are two on one address:
// whereabouts reserves every address of a network_name across its
// overlapping pools, unless the NAD turns reservations off
// (enable_overlapping_ranges: false): then its pool alone is consulted,
// and another pool may hold the same address by design.
func (x address) domain() string {
	if x.att.net.noOverlap {
		return "pool/" + x.pool
	}
	return "network/" + x.att.net.netName
}

// reserved says whether whereabouts keeps a reservation of the address.
func (x address) reserved() bool { return !x.att.net.noOverlap }

// mustBeReserved says whether the address's reservation is the product's
// to keep: it is reserved, and whereabouts' ADD made the reservation.
func (x address) mustBeReserved() bool { return x.reserved() && !x.att.unreserved[x.ip.String()] }

// reservation is the name of the address's reservation.
func (x address) reservation() string { return names.Reservation(x.ip, x.att.net.netName) }

// world is everything the simulation models: the API server, whereabouts,
// the nodes and their runtime, the pods.
type world struct {
	s    *sched
	tr   *trace
	o    Options
	api  *fake.API
	dir  string
	flat string

	nets []*network
	// gcNets are the networks CNI GC runs on now and then (events.go).
	gcNets []*network
	nodes  []*node
	pods   map[string]*pod // current incarnation by ref
	all    []*pod          // every incarnation
	sbs    []*sandbox
	uids   int
	ids    int

	faultsUntil time.Time
	// quiet stops faults and crashes: the world settles.
	quiet bool
	// stats count what happened, for the summary.
	stats map[string]int
	// holder is who held whereabouts' Lease at the last step, for the trace.
	holder string
	// adds are harvester-ipam's ADDs under way (checkAdd).
	adds []*addRun
	// addsBegun counts the ADDs begun; takerBegun is the count when the
	// last ADD of each takerKey began.
	addsBegun  int
	takerBegun map[string]int
	// bin is the CNI bin dir the runtime names (CNI_PATH).
	bin string

	// agents are the node agents, by node: the current run of each node's
	// (see agent.go); a node without an agent has none.
	agents    map[string]*agentProc
	agentRuns int
	// agentPods counts the agents' pods (a container restarted after a
	// kill keeps its pod); sameNames: every agent of a node holds
	// whereabouts' Lease under one name (AgentGroups).
	agentPods int
	sameNames bool
	// turns are the turns under whereabouts' Lease under way (checkTurns).
	turns []*leaseTurn
	// storms counts the pods storms made.
	storms int
	// feed is every change of the pools and reservations, by resource, in
	// order, for the agents' informers (informer.go); rev is the latest
	// resourceVersion.
	feed map[string][]fake.Change
	rev  int
	// agentWrote are the entries the agents' allocators wrote, by pool and
	// offset, as written (an old CRD may prune their ifname): checkDel.
	agentWrote map[string]shim.IPAllocation
}

func newWorld(s *sched, tr *trace, o Options, dir string) (*world, error) {
	w := &world{s: s, tr: tr, o: o, api: fake.New(), dir: dir, pods: map[string]*pod{}, stats: map[string]int{},
		agents: map[string]*agentProc{}, feed: map[string][]fake.Change{}, agentWrote: map[string]shim.IPAllocation{}}
	kc := filepath.Join(dir, "whereabouts.kubeconfig")
	// whereabouts' kubeconfig: the plugin in the simulation never reaches
	// its server (its store is the simulated one); a node agent reads its
	// namespace, as on a node.
	if err := os.WriteFile(kc, []byte(simKubeconfig), 0o600); err != nil {
		return nil, err
	}
	// CNI_PATH: the agent looks for the delegate of GC and STATUS there
	// before it takes them (the simulation runs its model).
	w.bin = filepath.Join(dir, "bin")
	if err := os.MkdirAll(w.bin, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(w.bin, "whereabouts"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		return nil, err
	}
	w.api.OnChange = w.change
	// whereabouts v0.7.0's CRDs know no ifname: the API server prunes it.
	w.api.PruneIfName = o.Whereabouts == fake.V070
	w.flat = filepath.Join(dir, "whereabouts.conf")
	if err := os.WriteFile(w.flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"`+kc+`"}}`), 0o600); err != nil {
		return nil, err
	}
	w.api.Hook = w.request
	w.api.StaleRead = func(c fake.Call) {
		if a := s.cur; a != nil && a.add != nil {
			a.add.stale[c.Name] = true
		}
	}
	w.api.CacheLag = func() int {
		if w.quiet || !s.chance(0.3) {
			return 0
		}
		return 1 + s.pick(4)
	}
	return w, nil
}

// simKubeconfig names the pool namespace; its server is never reached.
const simKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: sim
  context:
    cluster: sim
    user: sim
    namespace: ` + poolNS + `
current-context: sim
users:
- name: sim
  user:
    token: sim
`

var debugRequests = os.Getenv("SIM_DEBUG") != ""

// patchText is a patch's operations, for SIM_DEBUG's trace.
func patchText(c *fake.Call) string {
	if c.Verb != "patch" {
		return ""
	}
	var b strings.Builder
	for _, op := range c.Patch.Ops() {
		fmt.Fprintf(&b, " %s %s", op.Op, strings.TrimPrefix(op.Path, "/spec/allocations/"))
		if e, ok := op.Value.(shim.IPAllocation); ok {
			fmt.Fprintf(&b, "=%s/%s", e.ContainerID, e.IfName)
		}
	}
	return ":" + b.String()
}

// errKilled fails what a crashed process still tries: nothing of it happens.
var errKilled = errors.New("the process was killed")

// request is every request to the API server: a point where the scheduler
// chooses who runs next, where time passes, and where the world fails.
func (w *world) request(c *fake.Call) error {
	a := w.s.cur
	if a == nil {
		return nil // the checker, outside any actor
	}
	if a.killed {
		return errKilled
	}
	if cancelled(c.Ctx) {
		// A client's request after its context ended is never sent.
		return c.Ctx.Err()
	}
	a.at = w.s.now.Add(time.Duration(1+w.s.pick(5)) * time.Millisecond)
	a.yield()
	if a.killed {
		panic(goExit{})
	}
	w.stats["requests"]++
	if a.wbAdd != nil && c.Resource == fake.Reservations && c.Verb == "get" {
		// The request runs as soon as this hook returns: what it finds.
		a.wbAdd[c.Name] = w.api.ResourceVersion(fake.Reservations, poolNS, c.Name) != ""
	}
	if debugRequests {
		w.tr.add("  %s %s %s (ctx %v)%s", c.Verb, c.Resource, c.Name, c.Ctx != nil && c.Ctx.Err() != nil, patchText(c))
	}
	if a.proc != nil && c.Verb == "patch" && c.Resource == fake.Pools {
		adds := 0
		for _, op := range c.Patch.Ops() {
			if op.Op == "add" || op.Op == "replace" {
				adds++
			}
		}
		if adds > 0 {
			w.stats[fmt.Sprintf("agent: allocation patches of %d", adds)]++
		}
		for _, op := range c.Patch.Ops() {
			if op.Op == "replace" {
				w.stats["agent: entries handed over to a new sandbox"]++
			}
		}
		// What it adds, as written: recorded once the server applied it
		// (change).
		a.adding = map[string]shim.IPAllocation{}
		for _, op := range c.Patch.Ops() {
			if e, ok := op.Value.(shim.IPAllocation); ok && op.Op == "add" {
				a.adding[strings.TrimPrefix(op.Path, "/spec/allocations/")] = e
			}
		}
	}
	if a.proc != nil && c.Verb == "create" && c.Resource == fake.Reservations {
		if l := w.api.Lease(poolNS, names.Lease); l != nil && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, "harvester-ipam-agent/") {
			w.stats["agent: reservations created under whereabouts' Lease"]++
		} else {
			w.stats["agent: reservations created without whereabouts' Lease"]++
		}
	}
	if c.Verb != "get" && c.Verb != "list" {
		w.s.dirty = true
	}
	if cancelled(c.Ctx) {
		// Cancelled while under way: it reached the server or not.
		if w.s.chance(0.5) {
			return c.Ctx.Err()
		}
		c.LoseResponse = true
	}
	if c.Resource == fake.Leases && c.Verb == "get" {
		if l := w.api.Lease(poolNS, names.Lease); l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			w.stats["lease: looked at while another holds it"]++
		}
	}
	if w.o.leaseDeletedByHand && w.inTurn(a) && w.s.chance(0.5) {
		w.tr.add("SABOTAGE: whereabouts' Lease deleted by hand")
		w.api.Remove(fake.Leases, poolNS, names.Lease)
	}
	if a.whereabouts != nil && c.Verb == "delete" && c.Resource == fake.Reservations {
		w.whereaboutsDeletes(a.whereabouts, c.Name)
	}
	if w.quiet || !isProcess(a) {
		return nil
	}
	if a.proc != nil && w.o.Agents && w.s.chance(w.o.AgentCrashRate/20) {
		w.stats["agent kills before a request"]++
		a.proc.kill(fmt.Sprintf("before %s %s %s", c.Verb, c.Resource, c.Name), 0)
	}
	if a.proc == nil && w.o.Crashes && w.s.chance(w.o.CrashRate/20) {
		w.tr.add("CRASH before %s %s %s", c.Verb, c.Resource, c.Name)
		w.stats["crashes"]++
		a.killed = true
		panic(goExit{})
	}
	if w.s.now.Before(w.faultsUntil) {
		switch r := w.s.rng.Float64(); {
		case r < 0.2:
			w.tr.add("FAULT %s %s %s: unavailable", c.Verb, c.Resource, c.Name)
			w.stats["faults"]++
			return apierrors.NewServiceUnavailable("etcdserver: request timed out")
		case r < 0.3:
			w.tr.add("FAULT %s %s %s: the response is lost", c.Verb, c.Resource, c.Name)
			w.stats["faults"]++
			c.LoseResponse = true
		}
	}
	return nil
}

// whereaboutsDeletes is whereabouts' own DEL of the entry of "of" deleting
// the reservation name (pkg/storage/kubernetes
// UpdateOverlappingRangeAllocation, every version: a delete by name): that
// of the entry's address, whoever holds it. In overlapping ranges it may be
// another pool's live attachment's, when of's ADD failed after writing its
// entry, before its reservation: whereabouts alone does that after a lost
// response (its hazard: the live attachment is no longer the product's to
// keep, and the trace says so); but when of's ADD found the reservation
// made under its Lease, a writer without the Lease raced it (a node agent),
// and the live attachment's reservation is freed by the product's doing.
func (w *world) whereaboutsDeletes(of *attachment, name string) {
	for _, x := range w.liveAddresses() {
		att := x.att
		if att == of || !x.reserved() || x.reservation() != name {
			continue
		}
		for _, r := range w.api.AllReservations(poolNS) {
			if r.Name != name || r.Spec.PodRef != att.sb.pod.ref() {
				continue
			}
			if of != nil && of.lostReservationRace {
				w.s.violations = append(w.s.violations, fmt.Sprintf("whereabouts' DEL of %s deletes the reservation of live attachment %s: its ADD had lost the reservation to a writer without whereabouts' Lease", of, att))
				continue
			}
			att.freedByWhereabouts = true
			w.tr.add("whereabouts' DEL deletes reservation %s, %s's: whereabouts' own hazard across overlapping ranges", name, att)
			w.stats["whereabouts' DEL frees a live attachment of another pool"]++
		}
	}
}

// attachmentOf is the attachment of a container and interface with an
// address in pool.
func (w *world) attachmentOf(containerID, ifname, pool string) *attachment {
	for _, sb := range w.sbs {
		if sb.id != containerID {
			continue
		}
		for _, att := range sb.atts {
			if att.ifname == ifname && att.net.hasPool(pool) {
				return att
			}
		}
	}
	return nil
}

// cancelled says whether a request's context was cancelled: its caller
// gave up. Deadlines are the wall clock's, which the simulation does not
// follow (its own are far longer than a schedule takes).
func cancelled(ctx context.Context) bool {
	return ctx != nil && errors.Is(ctx.Err(), context.Canceled)
}

// isProcess says whether an actor stands for a process that can crash or
// see faults (the plugin, whereabouts, the reconciler), not for the world.
func isProcess(a *actor) bool {
	return !strings.HasPrefix(a.name, "director") && !strings.HasPrefix(a.name, "check")
}

// options are a simulated process's store options: the simulated clock and
// random source, and no real-time timeout that could fire.
func (w *world) options(identity string) shim.Options {
	return shim.Options{CallTimeout: time.Hour, Clock: clock{w.s}, Random: w.s.rng.Float64, Identity: identity, Turn: w.turn}
}

// leaseTurn is a turn under whereabouts' Lease: of which holder, run by
// which actor (a Group's by its hold's).
type leaseTurn struct {
	holder string
	a      *actor
}

// inTurn says whether a runs a turn under whereabouts' Lease.
func (w *world) inTurn(a *actor) bool {
	for _, t := range w.turns {
		if t.a == a {
			return true
		}
	}
	return false
}

// turn is shim.Options.Turn for every process of the world: whereabouts'
// binary (shim/fake, under its own identity), the plugin's exec path, the
// reconciler and each agent (its Group's turns). A turn ends when it
// returns, or when the process running it is killed.
func (w *world) turn(holder string) func() {
	t := &leaseTurn{holder: holder, a: w.s.cur}
	w.turns = append(w.turns, t)
	w.s.dirty = true
	w.stats["lease turns"]++
	if w.s.cur != nil && w.s.cur.proc != nil {
		w.stats["lease turns of agents"]++
	}
	return func() {
		for i, u := range w.turns {
			if u == t {
				w.turns = append(w.turns[:i], w.turns[i+1:]...)
				return
			}
		}
	}
}

// store is the store a simulated process uses.
func (w *world) store(identity string) *shim.Store {
	return shim.New(w.api, poolNS, w.options(identity))
}
