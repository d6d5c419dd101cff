package sim

import (
	"fmt"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
)

// The ground truth the audit's verdicts are held to: the inconsistencies
// the model knows the world has, from what it knows and the API does not
// say (which sandbox is live, which interfaces hold which address, who
// freed what), each one the audit is right to report. The product's own
// breaks (checkLive's) stop a schedule at once, so in the default
// schedules what the audit must report comes from what the model lets
// happen on purpose:
//
//   - whereabouts' own hazards (freedByWhereabouts: its DEL deleted a live
//     attachment's reservation across overlapping ranges; its pod
//     controller freeing a stopping sandbox's entry, podControllerFreed;
//     its ADD over several ranges leaving a later range's address without
//     its reservation once an earlier one's had the pod's own, unreserved):
//     real inconsistencies, reported when the API shows them (a pod that
//     is gone shows nothing);
//   - Multus' partial network-status (startSandbox names only some
//     interfaces now and then): a Running pod whose network-status has no
//     address on a network its networks annotation asks for. That is what
//     Harvester #11639 looks like from the API, and all the API says: the
//     audit cannot tell a sandbox without the interface from a status
//     without it, and whereabouts' own reconciler frees an address the
//     status does not name. So it is a true MissingAddress, and the
//     checker requires that it be reported;
//   - the storage network's NAD replaced (replaceNetwork): the model
//     rewrites what a pod asks for in place (a shortcut for Longhorn making
//     it again), and a pod whose sandbox was made before runs without the
//     network it now asks for: a true MissingAddress too.
//
// With Options.auditTolerates, the product's breaks are left running (the
// checker's tests): a freed live entry or reservation, two live
// attachments on one address, each a fact the audit must report.
//
// What the audit cannot see is no fact: an attachment of a pod not shown
// Running (force-deleted while its sandbox is stopped; being stopped
// before its next sandbox: a pod not Running holds no address in the
// audit's eyes, and its entries may be an ADD in flight); a live entry
// freed whose address the network-status does not name; two attachments
// of one pod on one address (the audit judges pods); an entry that names
// an earlier sandbox of a pod with one network (the API does not say which
// sandbox is live: docs/audit.md); a reservation missing in a network
// where none exists (the audit reads that as reservations turned off).

// apiView is what the API holds, read for the ground truth.
type apiView struct {
	// entries by pool|ip; domains: every entry of a reservation network
	// (whereabouts' network_name) by domain|ip.
	entries  map[string]shim.Allocation
	domains  map[string][]shim.Allocation
	pools    map[string]*shim.Pool
	res      map[string]*shim.Reservation
	reserved map[string]bool // domains where some entry has its reservation
}

func newAPIView(s audit.Snapshot) *apiView {
	v := &apiView{entries: map[string]shim.Allocation{}, domains: map[string][]shim.Allocation{}, pools: map[string]*shim.Pool{},
		res: map[string]*shim.Reservation{}, reserved: map[string]bool{}}
	for i := range s.Reservations {
		v.res[s.Reservations[i].Name] = &s.Reservations[i]
	}
	for i := range s.Pools {
		p := &s.Pools[i]
		v.pools[p.Name] = p
		as, err := shim.Allocations(p)
		if err != nil {
			continue
		}
		domain := reconcile.NetworkName(p)
		for _, a := range as {
			ip := a.IP.String()
			v.entries[p.Name+"|"+ip] = a
			v.domains[domain+"|"+ip] = append(v.domains[domain+"|"+ip], a)
			if v.res[names.Reservation(a.IP, domain)] != nil {
				v.reserved[domain] = true
			}
		}
	}
	return v
}

// inUse are the addresses whose interface holds them: the attachment's
// sandbox runs, or is being stopped (its network namespace kept) and the
// attachment's own DEL was not sent; whatever whereabouts did to their
// entries (unlike live(), which counts what the product must keep).
func (w *world) inUse() []address {
	var out []address
	for _, sb := range w.sbs {
		for _, att := range sb.atts {
			if att.ips != nil && (sb.state == sbLive || sb.state == sbDead && sb.netns && !att.delStarted) {
				out = append(out, att.addresses()...)
			}
		}
	}
	return out
}

// statusNames says whether x's pod is Running and its network-status
// names x's address on x's interface, on a NAD that exists.
func (w *world) statusNames(x address) bool {
	att := x.att
	p := att.sb.pod
	return w.runningPod(p) && p.statusOf == att.sb && contains(p.status[att.ifname], x.ip.String()) && !statusNet(p, att.ifname).deleted
}

// facts are the inconsistencies of the world now, by key.
func (w *world) facts(s audit.Snapshot) map[string]*fact {
	v := newAPIView(s)
	out := map[string]*fact{}
	add := func(f *fact) { out[f.key] = f }
	w.sharedFacts(v, add)
	for _, p := range w.pods_() {
		if w.runningPod(p) {
			w.missingFacts(p, add)
			w.mismatchFacts(p, v, add)
		}
	}
	w.reservationFacts(v, add)
	return out
}

// sharedFacts: two Running pods' addresses in use on one address of one
// collision domain (address.domain: the reservation network, or the pool
// of a NAD that turns reservations off), each claim shown by the API (its
// entry, naming its pod, or its pod's network-status).
func (w *world) sharedFacts(v *apiView, add func(*fact)) {
	groups := map[string][]address{}
	byDesign := map[string]map[string]bool{} // ip -> domains
	for _, x := range w.inUse() {
		if w.runningPod(x.att.sb.pod) {
			k := x.domain() + "|" + x.ip.String()
			groups[k] = append(groups[k], x)
			if x.att.net.noOverlap {
				if byDesign[x.ip.String()] == nil {
					byDesign[x.ip.String()] = map[string]bool{}
				}
				byDesign[x.ip.String()][x.domain()] = true
			}
		}
	}
	for _, ip := range sortedKeys(byDesign) {
		if len(byDesign[ip]) > 1 {
			// What the audit must not call two pods on one address.
			w.stats["audit: looks at one address in two pools with reservations off"]++
		}
	}
	for _, k := range sortedKeys(groups) {
		var pods, who []string
		for _, x := range groups[k] {
			ref := x.att.sb.pod.ref()
			e, ok := v.entries[x.pool+"|"+x.ip.String()]
			if (ok && e.PodRef == ref || w.statusNames(x)) && !contains(pods, ref) {
				pods = append(pods, ref)
				who = append(who, x.att.String())
			}
		}
		if len(pods) < 2 {
			continue
		}
		sort.Strings(pods)
		ip := k[strings.LastIndex(k, "|")+1:]
		add(&fact{kind: audit.SharedAddress, pods: pods, addr: ip, key: "S|" + k + "|" + strings.Join(pods, ","),
			what: "attachments in use on one address: " + strings.Join(who, ", ")})
	}
}

// missingFacts: a Running pod whose network-status has no address on a
// network it asks for (a partial status, or a network replaced since its
// sandbox was made).
func (w *world) missingFacts(p *pod, add func(*fact)) {
	for _, ifn := range sortedKeys(p.nets) {
		n := p.nets[ifn]
		if n.deleted || len(p.status[ifn]) > 0 && statusNet(p, ifn) == n {
			continue
		}
		why := "Multus' network-status leaves it out"
		if len(p.status[ifn]) > 0 {
			why = fmt.Sprintf("its sandbox %s attached %s, replaced since", p.current.id, statusNet(p, ifn).name)
		}
		add(&fact{kind: audit.MissingAddress, network: nadNamespace + "/" + n.name, pods: []string{p.ref()},
			key: fmt.Sprintf("M|%s|%d|%s|%s", p.ref(), p.uid, ifn, n.name), what: fmt.Sprintf("%s asks for %s on %s: %s", p.ref(), n.name, ifn, why)})
	}
}

// mismatchFacts: a Running pod's live address that its network-status
// names has no entry of the pod there; or the entries at those addresses
// name more than one sandbox.
func (w *world) mismatchFacts(p *pod, v *apiView, add func(*fact)) {
	containers := map[string]string{}
	for _, att := range p.current.atts {
		for _, x := range att.addresses() {
			if !w.statusNames(x) || v.pools[x.pool] == nil {
				continue
			}
			ip := x.ip.String()
			e, ok := v.entries[x.pool+"|"+ip]
			if ok && e.PodRef == p.ref() {
				if e.ContainerID != "" {
					containers[e.ContainerID] = ip
				}
				continue
			}
			// What the pools of the network hold for the pod: the audit's
			// finding (and its key) names them.
			held := v.podEntries(p.ref(), att.net.pools())
			add(&fact{kind: audit.PodPoolMismatch, pods: []string{p.ref()}, addr: ip, key: "P|" + p.ref() + "|" + ip + "|" + strings.Join(held, ","),
				what: fmt.Sprintf("live attachment %s has no entry of its pod at %s (the pools hold %v for it)", att, ip, held)})
		}
	}
	if len(containers) > 1 {
		ids := sortedKeys(containers)
		add(&fact{kind: audit.PodPoolMismatch, pods: []string{p.ref()}, key: "P2|" + p.ref() + "|" + strings.Join(ids, ","),
			what: fmt.Sprintf("the entries at %s's live addresses name sandboxes %v", p.ref(), ids)})
	}
}

// podEntries are the addresses of pod's entries in pools, sorted.
func (v *apiView) podEntries(pod string, pools []string) []string {
	var held []string
	for _, k := range sortedKeys(v.entries) {
		pool, _, _ := strings.Cut(k, "|")
		if e := v.entries[k]; e.PodRef == pod && contains(pools, pool) {
			held = append(held, e.IP.String())
		}
	}
	sort.Strings(held)
	return held
}

// reservationFacts: an address in use whose entry (naming its pod) has no
// reservation, or whose reservation names another pod, which no entry at
// that address names; where the NAD reserves (a NAD that turns
// reservations off has none, by design).
func (w *world) reservationFacts(v *apiView, add func(*fact)) {
	for _, x := range w.inUse() {
		att := x.att
		p := att.sb.pod
		ip := x.ip.String()
		e, ok := v.entries[x.pool+"|"+ip]
		if !x.reserved() || !w.runningPod(p) || !ok || e.PodRef != p.ref() {
			continue
		}
		var o *shim.Reservation
		for _, nn := range names.ReservationNetworks(x.pool, v.pools[x.pool].Spec.Range) {
			if o = v.res[names.Reservation(x.ip, nn)]; o != nil {
				break
			}
		}
		switch {
		case o == nil && v.reserved[att.net.netName]:
			add(&fact{kind: audit.EntryReservationMismatch, pods: []string{p.ref()}, addr: ip, key: "E|" + p.ref() + "|" + ip + "|" + e.ContainerID,
				what: fmt.Sprintf("attachment in use %s has its entry at %s and no reservation", att, ip)})
		case o != nil && o.Spec.PodRef != p.ref() && !v.names(att.net.netName, ip, o.Spec.PodRef):
			add(&fact{kind: audit.EntryReservationMismatch, pods: []string{p.ref(), o.Spec.PodRef}, addr: ip, key: "E2|" + o.Name + "|" + o.Spec.PodRef + "|" + string(o.UID),
				what: fmt.Sprintf("attachment in use %s: its reservation %s names %s", att, o.Name, o.Spec.PodRef)})
		}
	}
}

// names says whether an entry at ip of the domain names pod.
func (v *apiView) names(domain, ip, pod string) bool {
	for _, e := range v.domains[domain+"|"+ip] {
		if e.PodRef == pod {
			return true
		}
	}
	return false
}
