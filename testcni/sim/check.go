package sim

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// agentStart is the part of an agent's Lease identity that names its start
// (agent.Identity: harvester-ipam-agent/<node>/<instance>/<random>/, the
// instance the pid here): another in every run, so the trace shows the
// node's agents alike.
var agentStart = regexp.MustCompile(`^(harvester-ipam-agent/[^/]*/)[^/]+/[0-9a-f]{8}(/|$)`)

// live are the attachments in use: the sandbox runs (each of its ADDs
// returned), or is being stopped and its network namespace still holds the
// interface, whose own DEL was not sent yet. Whatever happens, their entries
// and reservations stay, and no two of them share an address.
func (w *world) live() []*attachment {
	var out []*attachment
	for _, sb := range w.sbs {
		switch {
		case sb.state == sbLive:
			for _, att := range sb.atts {
				if !att.freedByWhereabouts {
					out = append(out, att)
				}
			}
		case sb.state == sbDead && sb.netns:
			for _, att := range sb.atts {
				if att.ips != nil && !att.delStarted && !att.podControllerFreed && !att.freedByWhereabouts {
					out = append(out, att)
				}
			}
		}
	}
	return out
}

// liveAddresses are the addresses of the live attachments.
func (w *world) liveAddresses() []address {
	var out []address
	for _, att := range w.live() {
		out = append(out, att.addresses()...)
	}
	return out
}

// running are the attachments of the running sandboxes: what must hold its
// address when the world is at rest.
func (w *world) running() []*attachment {
	var out []*attachment
	for _, sb := range w.sbs {
		if sb.state == sbLive {
			out = append(out, sb.atts...)
		}
	}
	return out
}

// checkLive is the invariant checked after every step: no address is held
// by two live attachments, and no live attachment's entry or reservation is
// freed.
func (w *world) checkLive() []string {
	if l := w.api.Lease(poolNS, names.Lease); l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != w.holder {
		w.holder = *l.Spec.HolderIdentity
		// An agent's identity names its start: the same in every replay.
		w.tr.add("(whereabouts' Lease now held by %q)", agentStart.ReplaceAllString(w.holder, "${1}AGENT/"))
	}
	var bad []string
	// The model's own rule: the kubelet's pod worker makes one sandbox of a
	// pod at a time (harvester-ipam's ADD releases the pod's other
	// sandboxes, which is right only because of it).
	making := map[string]string{}
	for _, sb := range w.sbs {
		if sb.state != sbCreating {
			continue
		}
		if other, ok := making[sb.pod.ref()]; ok {
			bad = append(bad, fmt.Sprintf("the simulated kubelet makes two sandboxes of %s at once (%s, %s): an error of the model", sb.pod.ref(), other, sb.id))
		}
		making[sb.pod.ref()] = sb.id
	}
	bad = append(bad, w.checkTurns()...)
	live := w.liveAddresses()
	if len(live) == 0 {
		return bad
	}
	w.api.View(poolNS, func(pools []*shim.Pool, res map[string]*shim.Reservation) {
		byName := make(map[string]*shim.Pool, len(pools))
		for _, p := range pools {
			byName[p.Name] = p
		}
		byIP := map[string]*attachment{}
		for _, x := range live {
			att := x.att
			// Two pools whose NADs turn reservations off may hold one
			// address by design: one address of one domain is one.
			key := x.domain() + "|" + x.ip.String()
			if other, dup := byIP[key]; dup {
				bad = append(bad, fmt.Sprintf("%s is held by two live attachments: %s and %s", x.ip, other, att))
			}
			byIP[key] = att
			if !w.holds(byName[x.pool], att, x.ip) {
				bad = append(bad, fmt.Sprintf("the entry of live attachment %s at %s was freed", att, x.ip))
			}
			if !x.mustBeReserved() {
				continue
			}
			o := res[x.reservation()]
			if o == nil || o.Spec.PodRef != att.sb.pod.ref() {
				owner := "none"
				if o != nil {
					owner = o.Spec.PodRef
				}
				bad = append(bad, fmt.Sprintf("the reservation of live attachment %s at %s was freed (now %s)", att, x.ip, owner))
			}
		}
	})
	return bad
}

// checkTurns is the Lease's invariant: at most one holder inside a turn
// under whereabouts' Lease at any instant, across whereabouts' binary, the
// plugin's exec path, the reconcilers and every agent. A turn of a process
// that was killed ended with it (nothing it still tries happens).
func (w *world) checkTurns() []string {
	var in []*leaseTurn
	for _, t := range w.turns {
		if t.a == nil || !t.a.killed && !t.a.done {
			in = append(in, t)
		}
	}
	if len(in) < 2 {
		return nil
	}
	var bad []string
	for _, t := range in[1:] {
		bad = append(bad, fmt.Sprintf("two holders inside a turn under whereabouts' Lease at once: %s and %s", in[0], t))
	}
	return bad
}

func (t *leaseTurn) String() string {
	who := "no actor"
	if t.a != nil {
		who = t.a.name
	}
	return fmt.Sprintf("%q (%s)", agentStart.ReplaceAllString(t.holder, "${1}AGENT/"), who)
}

// holds says whether p gives att's address ip to att's sandbox:
// whereabouts v0.7.0 writes no ifname, so then the container must match.
func (w *world) holds(p *shim.Pool, att *attachment, ip net.IP) bool {
	if p == nil {
		return false
	}
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		return false
	}
	for off, a := range p.Spec.Allocations {
		at, err := shim.OffsetIP(first, off)
		if err != nil || !at.Equal(ip) {
			continue
		}
		return a.ContainerID == att.sb.id && (a.IfName == att.ifname || a.IfName == "")
	}
	return false
}

// checkQuiet is the invariant of a world at rest (every DEL the runtime
// owed sent, every pod with a new sandbox, the reconciler past its grace):
// no entry or reservation of a dead sandbox remains.
func (w *world) checkQuiet() []string {
	var bad []string
	liveEntry := map[string]bool{} // pool/ip/container
	liveRes := map[string]string{} // reservation -> podref
	for _, att := range w.running() {
		for _, x := range att.addresses() {
			liveEntry[x.pool+"/"+x.ip.String()+"/"+att.sb.id] = true
			if x.reserved() && !att.freedByWhereabouts { // its reservation is gone, maybe another's now
				liveRes[x.reservation()] = att.sb.pod.ref()
			}
		}
	}
	for _, p := range w.api.AllPools(poolNS) {
		as, err := shim.Allocations(&p)
		if err != nil {
			bad = append(bad, fmt.Sprintf("pool %s: %v", p.Name, err))
			continue
		}
		for _, a := range as {
			if !liveEntry[p.Name+"/"+a.IP.String()+"/"+a.ContainerID] {
				bad = append(bad, fmt.Sprintf("at rest, %s is still held by %s (%s, ifname %q) in pool %s, not a live sandbox", a.IP, a.ContainerID, a.PodRef, a.IfName, p.Name))
			}
		}
	}
	for _, o := range w.api.AllReservations(poolNS) {
		if ref, ok := liveRes[o.Name]; !ok || ref != o.Spec.PodRef {
			bad = append(bad, fmt.Sprintf("at rest, reservation %s of %s remains, no live sandbox holds its address", o.Name, o.Spec.PodRef))
		}
	}
	sort.Strings(bad)
	return bad
}

// describe is the state for a violation's report.
func (w *world) describe() string {
	var b strings.Builder
	for _, p := range w.api.AllPools(poolNS) {
		fmt.Fprintf(&b, "pool %s (rv %s):\n", p.Name, p.ResourceVersion)
		as, _ := shim.Allocations(&p)
		for _, a := range as {
			fmt.Fprintf(&b, "  %s %s %s %q\n", a.IP, a.ContainerID, a.PodRef, a.IfName)
		}
	}
	b.WriteString("reservations:\n")
	for _, o := range w.api.AllReservations(poolNS) {
		fmt.Fprintf(&b, "  %s %s\n", o.Name, o.Spec.PodRef)
	}
	if l := w.api.Lease(poolNS, names.Lease); l != nil && l.Spec.HolderIdentity != nil {
		fmt.Fprintf(&b, "lease held by %q\n", *l.Spec.HolderIdentity)
	}
	b.WriteString("sandboxes:\n")
	for _, sb := range w.sbs {
		var atts []string
		for _, a := range sb.atts {
			atts = append(atts, fmt.Sprintf("%s=%s@%s", a.ifname, ipList(a.ips), a.net.name))
		}
		fmt.Fprintf(&b, "  %s %s on %s: %s %s\n", sb.id, sb.pod.ref(), sb.node, sb.state, strings.Join(atts, " "))
	}
	return b.String()
}

// tolerated are checkLive's breaks but those of live attachments (a freed
// entry or reservation, an address held twice), which
// Options.auditTolerates leaves to the audit.
func tolerated(bad []string) []string {
	var out []string
	for _, b := range bad {
		if !strings.Contains(b, "held by two live attachments") && !strings.Contains(b, "was freed") {
			out = append(out, b)
		}
	}
	return out
}

// ipList is addresses as the trace shows them: a,b.
func ipList(ips []net.IP) string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	if out == nil {
		return "<nil>"
	}
	return strings.Join(out, ",")
}
