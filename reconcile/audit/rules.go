package audit

import (
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/conf/names"
)

// claim is a pod's hold on an address: an entry in a pool, or its
// network-status on a NAD.
type claim struct {
	network string // the finding's label: the pool's NAD, or the status' NAD
	pool    string // "" for a network-status claim
}

// shared finds two Running pods on one address of one collision domain
// (collisionDomain): whereabouts' reservation network (network_name), so
// that overlapping pools of one network_name are one, where reservations
// are on; the pool alone where a NAD turns them off.
func (x *index) shared(o Options) []Finding {
	claims := map[string]map[string][]claim{} // domain|ip -> pod -> claims
	add := func(domain, ip, pod string, c claim) {
		k := domain + "|" + ip
		if claims[k] == nil {
			claims[k] = map[string][]claim{}
		}
		claims[k][pod] = append(claims[k][pod], c)
	}
	for _, e := range x.entries {
		if x.holds(e) {
			add(x.collisionDomain(e.Pool, e.domain), e.IP.String(), e.PodRef, claim{network: x.networkOf(e.Pool), pool: e.Pool})
		}
	}
	for ref, p := range x.pods {
		if !running(p) {
			continue
		}
		st := x.status[ref]
		for _, a := range st {
			nw := x.nets[a.nad]
			if nw == nil {
				continue
			}
			for _, ip := range a.ips {
				add(x.collisionDomain(nw.poolOf(ip), nw.name), ip, ref, claim{network: nw.ref})
			}
		}
	}
	var out []Finding
	for k, byPod := range claims {
		if len(byPod) < 2 {
			continue
		}
		ip := k[strings.LastIndex(k, "|")+1:]
		pods := make([]string, 0, len(byPod))
		var pools, statusNets []string
		for pod, cs := range byPod {
			pods = append(pods, pod)
			for _, c := range cs {
				if c.pool != "" {
					pools = append(pools, c.pool)
				} else {
					statusNets = append(statusNets, c.network)
				}
			}
		}
		sort.Strings(pools)
		sort.Strings(statusNets)
		// Labelled by the first pool's NAD, else the first status' NAD.
		pool, network := first(pools), first(statusNets)
		if pool != "" && (network == "" || x.networkOf(pool) != NoNAD) {
			network = x.networkOf(pool)
		}
		x.newestFirst(pods)
		advice, _ := x.remedy(pods[0], "it gets another address")
		out = append(out, Finding{Kind: SharedAddress, Network: network, Pool: pool, Address: ip, Pods: pods,
			Message: fmt.Sprintf("pods %s all hold %s on network %s (pools %s): traffic for one reaches the other. Give the newest, %s, a new sandbox; the command below shows every entry. %s",
				strings.Join(pods, ", "), ip, network, dashIfEmpty(strings.Join(dedupe(pools), ", ")), pods[0], advice),
			Command: o.Diagnose + " inspect --audit"})
	}
	return out
}

// collisionDomain is where two pods' claims of one address are two pods on
// one address. Where whereabouts reserves (enable_overlapping_ranges, its
// default), its allocator skips an address reserved under the network's
// network_name, whatever pool holds it: the domain is the network_name,
// across overlapping pools. Where a NAD naming the pool turns reservations
// off, the allocator consults the pool alone (whereabouts'
// IPManagement), and hands out an address another pool holds by design:
// the domain is that pool. A status claim outside every range of its NAD
// (pool "") is the NAD's.
func (x *index) collisionDomain(pool, networkName string) string {
	if pool == "" || x.poolReserves(pool) {
		return "network/" + networkName
	}
	return "pool/" + pool
}

// poolReserves says whether whereabouts reserves the pool's addresses:
// every NAD naming it leaves enable_overlapping_ranges on.
func (x *index) poolReserves(pool string) bool {
	for _, nw := range x.poolNets[pool] {
		if !nw.reserves {
			return false
		}
	}
	return true
}

// newestFirst orders pods by creation, the newest first (then by name).
func (x *index) newestFirst(pods []string) {
	sort.Slice(pods, func(i, j int) bool {
		a, b := x.pods[pods[i]], x.pods[pods[j]]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return pods[i] < pods[j]
	})
}

// missing finds Running pods that asked for a network and have no address
// on it in their network-status: #11639.
func (x *index) missing(Options) []Finding {
	var out []Finding
	for ref, p := range x.pods {
		if !running(p) {
			continue
		}
		st := x.status[ref]
		for _, r := range x.requests[ref] {
			nw := x.nets[r.nad]
			if nw == nil || attached(st, r) {
				continue
			}
			iface := ""
			if r.iface != "" {
				iface = " (interface " + r.iface + ")"
			}
			advice, command := x.remedy(ref, "its next sandbox attaches the network")
			out = append(out, Finding{Kind: MissingAddress, Network: nw.ref, Pool: first(nw.pools), Pods: []string{ref},
				Message: fmt.Sprintf("pod %s runs without an address on network %s%s, which its networks annotation asks for: its sandbox was made without it (Multus not ready when it started, Harvester issue #11639). A Longhorn instance manager so started serves no replica over the storage network. %s",
					ref, nw.ref, iface, advice),
				Command: command, detail: string(p.UID) + "@" + r.iface})
		}
	}
	return out
}

// attached says whether a network-status has an address on what r asks for.
func attached(st []attachment, r request) bool {
	for _, a := range st {
		if a.nad == r.nad && (r.iface == "" || a.iface == r.iface) && len(a.ips) > 0 {
			return true
		}
	}
	return false
}

// mismatched finds Running pods whose network-status names an address that
// is not their entry in the network's pools, and pods whose attachments'
// entries name more than one sandbox.
func (x *index) mismatched(o Options) []Finding {
	var out []Finding
	for ref, p := range x.pods {
		if !running(p) {
			continue
		}
		st := x.status[ref]
		containers := map[string]string{} // container -> an address it holds on the status
		for _, a := range st {
			nw := x.nets[a.nad]
			if nw == nil || !x.anyPool(nw) {
				continue // not whereabouts, or its pools are in another namespace: not judged
			}
			mine := x.entriesIn(ref, nw.pools)
			for _, ip := range a.ips {
				e, ok := at(mine, ip)
				if ok {
					if e.ContainerID != "" {
						containers[e.ContainerID] = ip
					}
					continue
				}
				held := make([]string, 0, len(mine))
				for _, m := range mine {
					held = append(held, m.IP.String())
				}
				what := "none"
				if len(held) > 0 {
					what = strings.Join(held, ", ")
				}
				advice, command := x.remedy(ref, "its next sandbox's ADD writes its entry again")
				out = append(out, Finding{Kind: PodPoolMismatch, Network: nw.ref, Pool: x.poolFor(nw, ip), Address: ip, Pods: []string{ref},
					Message: fmt.Sprintf("pod %s's network-status names %s on network %s, but the pools hold %s for it: whereabouts may hand %s to another pod. %s",
						ref, ip, nw.ref, what, ip, advice),
					Command: command, detail: strings.Join(held, ",")})
			}
		}
		if len(containers) > 1 {
			ids := make([]string, 0, len(containers))
			for id := range containers {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			advice, command := x.remedy(ref, "one sandbox holds them all")
			out = append(out, Finding{Kind: PodPoolMismatch, Network: x.networkOfAddress(ref, containers[ids[1]]), Pool: "", Address: containers[ids[1]], Pods: []string{ref},
				Message: fmt.Sprintf("pod %s's live attachments are entries of different sandboxes (%s): one is an earlier sandbox's, and that sandbox's DEL frees a live address. %s",
					ref, strings.Join(ids, ", "), advice),
				Command: command, detail: strings.Join(ids, ",")})
		}
	}
	return out
}

// anyPool says whether the snapshot holds a pool of nw: a NAD whose
// kubeconfig keeps its pools in another namespace is not judged here.
func (x *index) anyPool(nw *network) bool {
	for _, p := range nw.pools {
		if _, ok := x.ranges[p]; ok {
			return true
		}
	}
	return false
}

// entriesIn are a pod's entries in the given pools.
func (x *index) entriesIn(pod string, pools []string) []entry {
	var out []entry
	for _, e := range x.byPod[pod] {
		for _, p := range pools {
			if e.Pool == p {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

func at(es []entry, ip string) (entry, bool) {
	for _, e := range es {
		if e.IP.String() == ip {
			return e, true
		}
	}
	return entry{}, false
}

// poolFor is the pool of nw whose range holds ip.
func (x *index) poolFor(nw *network, ip string) string {
	addr := net.ParseIP(ip)
	for _, p := range x.pools {
		for _, name := range nw.pools {
			if p.Name != name {
				continue
			}
			if _, n, err := net.ParseCIDR(p.Spec.Range); err == nil && n.Contains(addr) {
				return p.Name
			}
		}
	}
	return first(nw.pools)
}

// networkOfAddress is the network of the pod's entry at ip.
func (x *index) networkOfAddress(pod, ip string) string {
	for _, e := range x.byPod[pod] {
		if e.IP.String() == ip {
			return x.networkOf(e.Pool)
		}
	}
	return NoNAD
}

// reservations finds the entries that hold an address (index.holds) without
// their reservation, and reservations held by another pod than the entry
// that holds their address.
func (x *index) reservations(o Options) []Finding {
	held := map[string][]entry{} // reservation name -> entries at its address
	var out []Finding
	for _, e := range x.entries {
		nws := names.ReservationNetworks(e.Pool, x.rangeOf(e.Pool))
		reserved := false
		for _, nn := range nws {
			name := names.Reservation(e.IP, nn)
			held[name] = append(held[name], e)
			if x.orips[name] != nil {
				reserved = true
			}
		}
		if reserved || !x.holds(e) || !x.reserves(e) {
			continue
		}
		name := names.Reservation(e.IP, e.domain)
		advice, command := x.remedy(e.PodRef, "its next sandbox reserves its address again")
		out = append(out, Finding{Kind: EntryReservationMismatch, Network: x.networkOf(e.Pool), Pool: e.Pool, Address: e.IP.String(), Pods: []string{e.PodRef},
			Message: fmt.Sprintf("pod %s's entry %s in pool %s has no reservation %s: whereabouts may give %s to a pod of an overlapping range. %s",
				e.PodRef, e.IP, e.Pool, name, e.IP, advice),
			Command: command, detail: e.ContainerID})
	}
	for name, orip := range x.orips {
		es := held[name]
		if len(es) == 0 {
			continue // orphaned: the reconciler's, a leak
		}
		var holders []string
		match := false
		for _, e := range es {
			match = match || e.PodRef == orip.Spec.PodRef
			if x.holds(e) {
				holders = append(holders, e.PodRef)
			}
		}
		if match || len(holders) == 0 {
			continue
		}
		holders = dedupe(holders)
		e := es[0]
		out = append(out, Finding{Kind: EntryReservationMismatch, Network: x.networkOf(e.Pool), Pool: e.Pool, Address: e.IP.String(),
			Pods: append(holders, orip.Spec.PodRef),
			Message: fmt.Sprintf("reservation %s names pod %s, but the entry at %s in pool %s is pod %s's: two pods may believe they hold %s. See both with the command below; then give the pod that should not hold it a new sandbox, the way its kind allows: %s.",
				name, orip.Spec.PodRef, e.IP, e.Pool, strings.Join(holders, ", "), e.IP, x.remediesShort(append(append([]string(nil), holders...), orip.Spec.PodRef))),
			Command: o.Diagnose + " inspect --audit", detail: string(orip.UID)})
	}
	return out
}

// reserves says whether an entry's network writes reservations: not when
// its NAD turns them off, nor where no entry of its network has one.
func (x *index) reserves(e entry) bool {
	return x.poolReserves(e.Pool) && x.reservedDomains[e.domain]
}

func (x *index) rangeOf(pool string) string { return x.ranges[pool] }

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
