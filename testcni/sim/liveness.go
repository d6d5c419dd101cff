package sim

import (
	"fmt"
	"net"
	"sort"

	"github.com/harvester/harvester-ipam/shim"
)

// Liveness: what harvester-ipam must get done, beside what it must never do
// (check.go). Two properties:
//
//   - after every ADD of harvester-ipam that succeeds (checkAdd), the pod
//     holds in that attachment's pool exactly the entries of its new
//     sandbox, one per interface whose ADD has returned: every entry of its
//     earlier sandboxes (whatever their number, of any earlier pod of that
//     name too) is gone;
//   - at rest, once the reconciler's grace has passed (checkQuiet), no entry
//     or reservation is left but the running sandboxes': none of a dead
//     sandbox, none of a pod that is gone.
//
// The first is checked right as ADD returns, with no other actor run in
// between. It need not hold, and is not checked, when:
//
//   - the sandbox was killed while its ADD ran (the pod deleted, a reboot,
//     its node removed): the sandbox is not the pod's any more, and
//     whereabouts' pod controller may free what its ADD wrote;
//   - an ADD of another sandbox of a pod of that name ran at the same time
//     (a force-deleted pod's sandbox still being made when the pod is
//     created again: two pod workers, one per UID): its entry may land after
//     this ADD's reclaim, and it is the next ADD's or the reconciler's;
//   - ADD's look at the API server's watch cache served the pool at an older
//     revision than the latest: ADD releases only when the cache shows an
//     earlier sandbox (plugin.reclaim), and an entry the cache has not seen
//     yet is, by design, the next ADD's or the reconciler's.
//
// An ADD that fails (a crash, an API fault that failed the reclaim, the range
// full) promises nothing: the runtime gives the sandbox up and makes another.
// Reservations are left to the second property: a reservation without an
// entry (whereabouts' pod controller killed between its two deletes) is no
// entry ADD plans on.

// addRun is one harvester-ipam ADD under way.
type addRun struct {
	att *attachment
	// overlapped: an ADD of another sandbox of a pod of that name ran
	// beside it.
	overlapped bool
	// stale are the pools its watch-cache reads saw behind the latest.
	stale map[string]bool
	// earlier: the pool held entries of the pod's earlier sandboxes when
	// it began.
	earlier bool
	// users are the actors doing it: the plugin's, and the node agent's
	// that took it (which may go on after the plugin is gone). It is under
	// way until both are done.
	users int
}

func (w *world) beginAdd(a *actor, att *attachment) *addRun {
	run := &addRun{att: att, stale: map[string]bool{}, users: 1}
	for _, o := range w.adds {
		if o.att.sb != att.sb && o.att.sb.pod.ref() == att.sb.pod.ref() {
			o.overlapped, run.overlapped = true, true
		}
	}
	for _, pool := range att.net.pools() {
		if p := w.api.Pool(poolNS, pool); p != nil {
			for _, e := range p.Spec.Allocations {
				if e.PodRef == att.sb.pod.ref() && e.ContainerID != att.sb.id {
					run.earlier = true
				}
			}
		}
	}
	w.adds = append(w.adds, run)
	w.addsBegun++
	if w.takerBegun == nil {
		w.takerBegun = map[string]int{}
	}
	w.takerBegun[takerKey(att)] = w.addsBegun
	a.add = run
	return run
}

// takerKey names the ADDs that may take over an earlier sandbox's entry on
// an interface: those of the pod's sandboxes on the node, on that interface
// and network (deleting.leaveToTaker in the plugin).
func takerKey(att *attachment) string {
	return att.sb.pod.ref() + "|" + att.sb.node + "|" + att.ifname + "|" + att.net.name
}

// takerUnderWay says whether an ADD of another sandbox of att's pod, on the
// same node, interface and network, is under way: the ADD a DEL of att
// leaves its entry to, to take over.
func (w *world) takerUnderWay(att *attachment) bool {
	for _, run := range w.adds {
		if run.att.sb != att.sb && takerKey(run.att) == takerKey(att) {
			return true
		}
	}
	return false
}

func (w *world) endAdd(a *actor, run *addRun) {
	a.add = nil
	if run.users--; run.users > 0 {
		return
	}
	for i, o := range w.adds {
		if o == run {
			w.adds = append(w.adds[:i], w.adds[i+1:]...)
			break
		}
	}
}

// checkAdd checks the first property for an ADD that returned ips, an
// address of each range of the attachment's network.
func (w *world) checkAdd(run *addRun, ips []net.IP) {
	att := run.att
	sb := att.sb
	switch {
	case sb.state != sbCreating || sb.pod.current != sb:
		w.stats["liveness: ADD of a sandbox killed meanwhile"]++
		return
	case run.overlapped:
		w.stats["liveness: ADD beside another sandbox's of that pod name"]++
		return
	case run.staleIn(att.net):
		w.stats["liveness: ADD that saw the pool in a stale cache"]++
		return
	}
	pools := att.net.pools()
	if len(ips) != len(pools) {
		bad := fmt.Sprintf("ADD of %s returned %d addresses for %d ranges: %s", att.name(), len(ips), len(pools), ipList(ips))
		w.tr.add("LIVENESS: %s", bad)
		w.s.violations = append(w.s.violations, bad)
		return
	}
	w.stats["liveness: ADDs checked"]++
	if run.earlier {
		w.stats["liveness: ADDs checked that had earlier sandboxes' entries"]++
	}
	for i, pool := range pools {
		if bad := w.podHoldsOnly(sb, att, pool, ips[i]); len(bad) > 0 {
			w.tr.add("LIVENESS: after ADD %s -> %s: %v", att.name(), ipList(ips), bad)
			w.s.violations = append(w.s.violations, bad...)
		}
	}
}

// staleIn says whether the ADD saw a pool of n in a stale cache.
func (run *addRun) staleIn(n *network) bool {
	for _, pool := range n.pools() {
		if run.stale[pool] {
			return true
		}
	}
	return false
}

// podHoldsOnly says what is wrong with pool for att's pod, ADD having
// returned ip there for att: it must hold exactly one entry for each
// attachment of att's sandbox in that pool whose ADD has returned, and
// nothing else of the pod.
func (w *world) podHoldsOnly(sb *sandbox, att *attachment, pool string, ip net.IP) []string {
	want := map[string]string{ip.String(): att.ifname} // address -> ifname
	for _, o := range sb.atts {
		if o == att {
			continue
		}
		for _, x := range o.addresses() {
			if x.pool == pool {
				want[x.ip.String()] = o.ifname
			}
		}
	}
	p := w.api.Pool(poolNS, pool)
	if p == nil {
		return []string{fmt.Sprintf("after ADD of %s -> %s, pool %s is gone", att.name(), ip, pool)}
	}
	as, err := shim.Allocations(p)
	if err != nil {
		return []string{fmt.Sprintf("pool %s: %v", pool, err)}
	}
	var bad []string
	for _, a := range as {
		if a.PodRef != sb.pod.ref() {
			continue
		}
		ifn, ok := want[a.IP.String()]
		switch {
		case a.ContainerID != sb.id:
			bad = append(bad, fmt.Sprintf("after ADD of %s -> %s, %s is still held by %s (ifname %q), an earlier sandbox of the pod, in pool %s", att.name(), ip, a.IP, a.ContainerID, a.IfName, pool))
		case !ok:
			bad = append(bad, fmt.Sprintf("after ADD of %s -> %s, the sandbox holds %s (ifname %q) too in pool %s", att.name(), ip, a.IP, a.IfName, pool))
		case a.IfName != ifn && a.IfName != "":
			bad = append(bad, fmt.Sprintf("after ADD of %s -> %s, %s is held for ifname %q, not %q, in pool %s", att.name(), ip, a.IP, a.IfName, ifn, pool))
		default:
			delete(want, a.IP.String())
		}
	}
	for _, addr := range sortedKeys(want) {
		bad = append(bad, fmt.Sprintf("after ADD of %s -> %s, the sandbox holds no entry for %s (%s) in pool %s", att.name(), ip, addr, want[addr], pool))
	}
	sort.Strings(bad)
	return bad
}

// name names an attachment before its ADD returned.
func (a *attachment) name() string {
	return fmt.Sprintf("%s/%s %s (%s)", a.sb.pod.ref(), a.ifname, a.sb.id, a.net.name)
}

// checkDel holds a DEL of harvester-ipam that succeeded to its promise
// ("a DEL that says success must never leave the allocation behind") for
// what a node agent's allocator wrote for the attachment: the agent records
// the address in the checkpoint before it writes the entry, so DEL finds
// the entry even when whereabouts v0.7.0's CRD pruned its ifname, and even
// when the agent and the plugin died together right after the write. (An
// entry whereabouts v0.7.0 wrote, without an ifname, at an address no
// checkpoint recorded, DEL leaves by design: FindAttachment's Ambiguous.)
// Not checked when the DEL began while an ADD of the attachment was still
// under way: a node agent's, whose client went away, goes on with the
// allocation it had begun (the patch sent, the reservation made on a
// context of its own, the address recorded), and what it writes after the
// DEL looked is left for the pod's next ADD or the reconciler.
func (w *world) checkDel(att *attachment) {
	w.stats["DEL checks"]++
	for _, pool := range att.net.pools() {
		if p := w.api.Pool(poolNS, pool); p != nil {
			w.checkDelIn(att, p)
		}
	}
}

// checkDelIn is checkDel in one pool of the attachment's network.
func (w *world) checkDelIn(att *attachment, p *shim.Pool) {
	for _, off := range sortedKeys(p.Spec.Allocations) {
		e := p.Spec.Allocations[off]
		wrote, ok := w.agentWrote[p.Name+"/"+off]
		if !ok || e.ContainerID != att.sb.id || wrote.ContainerID != att.sb.id || wrote.IfName != att.ifname {
			continue
		}
		bad := fmt.Sprintf("after DEL of %s succeeded, the entry the agent wrote for it at offset %s of pool %s is left (ifname %q)", att, off, p.Name, e.IfName)
		w.tr.add("LIVENESS: %s", bad)
		w.s.violations = append(w.s.violations, bad)
	}
}

// addUnderWay says whether an ADD of att is under way.
func (w *world) addUnderWay(att *attachment) bool {
	for _, run := range w.adds {
		if run.att == att {
			return true
		}
	}
	return false
}
