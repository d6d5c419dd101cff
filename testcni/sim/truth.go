package sim

import (
	"fmt"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/audit"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/names"
	"github.com/harvester/harvester-ipam/shim/reconcile"
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
//     controller freeing a stopping sandbox's entry, podControllerFreed):
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

// inUse are the attachments whose interface holds its address: the
// sandbox runs, or is being stopped (its network namespace kept) and the
// attachment's own DEL was not sent; whatever whereabouts did to their
// entries (unlike live(), which counts what the product must keep).
func (w *world) inUse() []*attachment {
	var out []*attachment
	for _, sb := range w.sbs {
		for _, att := range sb.atts {
			if att.ip != nil && (sb.state == sbLive || sb.state == sbDead && sb.netns && !att.delStarted) {
				out = append(out, att)
			}
		}
	}
	return out
}

// statusNames says whether att's pod is Running and its network-status
// names att's address, on a NAD that exists.
func (w *world) statusNames(att *attachment) bool {
	p := att.sb.pod
	return w.runningPod(p) && p.statusOf == att.sb && p.status[att.ifname] == att.ip.String() && !statusNet(p, att.ifname).deleted
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

// sharedFacts: two Running pods' attachments in use on one address of one
// reservation network, each claim shown by the API (its entry, naming its
// pod, or its pod's network-status).
func (w *world) sharedFacts(v *apiView, add func(*fact)) {
	groups := map[string][]*attachment{}
	for _, att := range w.inUse() {
		if w.runningPod(att.sb.pod) {
			k := att.net.netName + "|" + att.ip.String()
			groups[k] = append(groups[k], att)
		}
	}
	for _, k := range sortedKeys(groups) {
		var pods, who []string
		for _, att := range groups[k] {
			ref := att.sb.pod.ref()
			e, ok := v.entries[att.net.pool()+"|"+att.ip.String()]
			if (ok && e.PodRef == ref || w.statusNames(att)) && !contains(pods, ref) {
				pods = append(pods, ref)
				who = append(who, att.String())
			}
		}
		if len(pods) < 2 {
			continue
		}
		sort.Strings(pods)
		_, ip, _ := strings.Cut(k, "|")
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
		if n.deleted || p.status[ifn] != "" && statusNet(p, ifn) == n {
			continue
		}
		why := "Multus' network-status leaves it out"
		if p.status[ifn] != "" {
			why = fmt.Sprintf("its sandbox %s attached %s, replaced since", p.current.id, statusNet(p, ifn).name)
		}
		add(&fact{kind: audit.MissingAddress, network: nadNamespace + "/" + n.name, pods: []string{p.ref()},
			key: fmt.Sprintf("M|%s|%d|%s|%s", p.ref(), p.uid, ifn, n.name), what: fmt.Sprintf("%s asks for %s on %s: %s", p.ref(), n.name, ifn, why)})
	}
}

// mismatchFacts: a Running pod's live attachment whose address its
// network-status names has no entry of the pod there; or the entries at
// those addresses name more than one sandbox.
func (w *world) mismatchFacts(p *pod, v *apiView, add func(*fact)) {
	containers := map[string]string{}
	for _, att := range p.current.atts {
		if !w.statusNames(att) || v.pools[att.net.pool()] == nil {
			continue
		}
		ip := att.ip.String()
		e, ok := v.entries[att.net.pool()+"|"+ip]
		if ok && e.PodRef == p.ref() {
			if e.ContainerID != "" {
				containers[e.ContainerID] = ip
			}
			continue
		}
		var held []string
		for _, k := range sortedKeys(v.entries) {
			if e := v.entries[k]; e.PodRef == p.ref() && strings.HasPrefix(k, att.net.pool()+"|") {
				held = append(held, e.IP.String())
			}
		}
		add(&fact{kind: audit.PodPoolMismatch, pods: []string{p.ref()}, addr: ip, key: "P|" + p.ref() + "|" + ip + "|" + strings.Join(held, ","),
			what: fmt.Sprintf("live attachment %s has no entry of its pod at its address (the pool holds %v for it)", att, held)})
	}
	if len(containers) > 1 {
		ids := sortedKeys(containers)
		add(&fact{kind: audit.PodPoolMismatch, pods: []string{p.ref()}, key: "P2|" + p.ref() + "|" + strings.Join(ids, ","),
			what: fmt.Sprintf("the entries at %s's live addresses name sandboxes %v", p.ref(), ids)})
	}
}

// reservationFacts: an attachment in use whose entry (naming its pod) has
// no reservation, or whose reservation names another pod, which no entry
// at that address names.
func (w *world) reservationFacts(v *apiView, add func(*fact)) {
	for _, att := range w.inUse() {
		p := att.sb.pod
		ip := att.ip.String()
		e, ok := v.entries[att.net.pool()+"|"+ip]
		if !w.runningPod(p) || !ok || e.PodRef != p.ref() {
			continue
		}
		var o *shim.Reservation
		for _, nn := range names.ReservationNetworks(att.net.pool(), att.net.rng) {
			if o = v.res[names.Reservation(att.ip, nn)]; o != nil {
				break
			}
		}
		switch {
		case o == nil && v.reserved[att.net.netName]:
			add(&fact{kind: audit.EntryReservationMismatch, pods: []string{p.ref()}, addr: ip, key: "E|" + p.ref() + "|" + ip + "|" + e.ContainerID,
				what: fmt.Sprintf("attachment in use %s has its entry and no reservation", att)})
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
