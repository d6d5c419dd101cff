package audit

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// NetworksAnnotation is where a pod asks Multus for its networks.
const NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"

// network is one NAD whose IPAM is whereabouts.
type network struct {
	ref    string // namespace/name
	name   string // network_name: where whereabouts reserves its addresses
	pools  []string
	ranges []string // each pool's range
	// reserves is false when the NAD turns whereabouts' reservations off
	// (enable_overlapping_ranges: false): no entry has one.
	reserves bool
}

// poolOf is the pool of the NAD whose range holds ip; "" when none does.
func (nw *network) poolOf(ip string) string {
	addr := net.ParseIP(ip)
	for i, r := range nw.ranges {
		if _, n, err := net.ParseCIDR(r); err == nil && n.Contains(addr) {
			return nw.pools[i]
		}
	}
	return ""
}

// entry is a pool entry with the network its reservations are under.
type entry struct {
	shim.Allocation
	domain string // the reservation network (names.PoolPrefix)
}

// index is a snapshot, read once for every rule.
type index struct {
	nets      map[string]*network   // by NAD ref
	poolNets  map[string][]*network // pool name -> NADs naming it
	nadsKnown bool
	nads      *reconcile.NADs
	pools     []*shim.Pool
	ranges    map[string]string // pool name -> range
	// byName and verdicts (each pool's entries, live) are made once, for headroom.
	byName   map[string]*shim.Pool
	verdicts map[string][]reconcile.Verdict
	entries  []entry
	byPod    map[string][]entry // podref -> entries
	pods     map[string]*corev1.Pod
	// status and requests are each pod's annotations, read once.
	status   map[string][]attachment
	requests map[string][]request
	orips    map[string]*shim.Reservation // by name
	// domains that hold at least one reservation: where none does, the
	// reservations are off (a flat file's enable_overlapping_ranges).
	reservedDomains map[string]bool
	// onStatus are the addresses of each pod's network-status, and
	// sandboxes the addresses of each container's entries, for leak.
	onStatus  map[string]map[string]bool
	sandboxes map[string][]string
}

// canonical is s with every list in one order (NADs and pods by namespace
// and name, pools and reservations by name), in slices of its own: an
// informer store's List returns them in an order that changes from look to
// look, and every rule, every finding's key and message, must be a function
// of the world alone (issue 44).
func canonical(s Snapshot) Snapshot {
	s.NADs = append([]reconcile.NAD(nil), s.NADs...)
	sort.SliceStable(s.NADs, func(i, j int) bool {
		a, b := s.NADs[i], s.NADs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	pools := make([]int, len(s.Pools))
	for i := range pools {
		pools[i] = i
	}
	sort.SliceStable(pools, func(i, j int) bool { return s.Pools[pools[i]].Name < s.Pools[pools[j]].Name })
	sortedPools := make([]shim.Pool, len(s.Pools))
	for i, k := range pools {
		sortedPools[i] = s.Pools[k]
	}
	s.Pools = sortedPools
	s.Reservations = append([]shim.Reservation(nil), s.Reservations...)
	sort.SliceStable(s.Reservations, func(i, j int) bool { return s.Reservations[i].Name < s.Reservations[j].Name })
	s.Pods = append([]*corev1.Pod(nil), s.Pods...)
	sort.SliceStable(s.Pods, func(i, j int) bool {
		a, b := s.Pods[i], s.Pods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return s
}

func newIndex(s Snapshot) (*index, []error) {
	s = canonical(s)
	x := &index{nets: map[string]*network{}, poolNets: map[string][]*network{}, byPod: map[string][]entry{},
		pods: make(map[string]*corev1.Pod, len(s.Pods)), orips: make(map[string]*shim.Reservation, len(s.Reservations)),
		reservedDomains: map[string]bool{}, ranges: make(map[string]string, len(s.Pools))}
	var errs []error
	x.nads = reconcile.IndexNADs(s.NADs, s.NADsErr)
	x.nadsKnown = s.NADsErr == nil
	if s.NADsErr != nil {
		errs = append(errs, fmt.Errorf("NADs not read: only pools and reservations judged: %w", s.NADsErr))
	}
	for _, n := range s.NADs {
		nw := readNAD(n)
		if nw == nil {
			continue
		}
		x.nets[nw.ref] = nw
		for _, p := range nw.pools {
			x.poolNets[p] = append(x.poolNets[p], nw)
		}
	}
	x.status = make(map[string][]attachment, len(s.Pods))
	x.requests = make(map[string][]request, len(s.Pods))
	for _, p := range s.Pods {
		ref := p.Namespace + "/" + p.Name
		x.pods[ref] = p
		if st, ok := statusOf(p); ok {
			x.status[ref] = st
		}
		if rs := requestsOf(p); len(rs) > 0 {
			x.requests[ref] = rs
		}
	}
	for i := range s.Pools {
		p := &s.Pools[i]
		x.pools = append(x.pools, p)
		x.ranges[p.Name] = p.Spec.Range
		as, err := shim.Allocations(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		domain := reconcile.NetworkName(p)
		for _, a := range as {
			e := entry{Allocation: a, domain: domain}
			x.entries = append(x.entries, e)
			x.byPod[a.PodRef] = append(x.byPod[a.PodRef], e)
		}
	}
	for i := range s.Reservations {
		o := &s.Reservations[i]
		x.orips[o.Name] = o
	}
	for _, e := range x.entries {
		if x.orips[names.Reservation(e.IP, e.domain)] != nil {
			x.reservedDomains[e.domain] = true
		}
	}
	x.onStatus = make(map[string]map[string]bool, len(x.status))
	for ref, st := range x.status {
		ips := map[string]bool{}
		for _, a := range st {
			for _, ip := range a.ips {
				ips[ip] = true
			}
		}
		x.onStatus[ref] = ips
	}
	x.sandboxes = map[string][]string{}
	for _, e := range x.entries {
		if e.ContainerID != "" {
			x.sandboxes[e.ContainerID] = append(x.sandboxes[e.ContainerID], e.IP.String())
		}
	}
	return x, errs
}

// holds says whether an entry is an address its pod holds: the pod is
// Running (one not Running yet holds none: its entry is an ADD in flight,
// or an earlier sandbox's that its next ADD releases) and the entry is no
// leak (docs/audit.md: never a holder).
func (x *index) holds(e entry) bool {
	return running(x.pods[e.PodRef]) && !x.leak(e)
}

// leak says whether the reconciler judges a Running pod's entry stale
// (reconcile.Classify's rules, NotOnStatus and Superseded): the pod has a
// network-status, which names neither the entry's address nor any other
// of its container's. An earlier sandbox's, the reconciler's to release.
func (x *index) leak(e entry) bool {
	ips, known := x.onStatus[e.PodRef]
	if !known || ips[e.IP.String()] {
		return false
	}
	for _, ip := range x.sandboxes[e.ContainerID] {
		if ips[ip] {
			return false
		}
	}
	return true
}

// readNAD reads a NAD's first whereabouts IPAM; nil when it has none or
// cannot be read (reconcile.IndexNADs says so for the pools).
func readNAD(n reconcile.NAD) *network {
	ipams, err := conf.NetworkIPAMs([]byte(n.Config))
	if err != nil || len(ipams) == 0 || ipams[0].NodeSliceSize != "" {
		return nil
	}
	nw := &network{ref: n.Namespace + "/" + n.Name, name: ipams[0].NetworkName, reserves: reservesOf(n.Config)}
	for _, r := range ipams[0].Ranges {
		nw.pools = append(nw.pools, r.Pool)
		nw.ranges = append(nw.ranges, r.Range)
	}
	return nw
}

// reservesOf reads enable_overlapping_ranges (whereabouts' default: true)
// of a config's ipam, a plugin's or a conflist's.
func reservesOf(config string) bool {
	var top struct {
		IPAM    map[string]json.RawMessage   `json:"ipam"`
		Plugins []map[string]json.RawMessage `json:"plugins"`
	}
	if json.Unmarshal([]byte(config), &top) != nil {
		return true
	}
	ipams := []map[string]json.RawMessage{top.IPAM}
	for _, p := range top.Plugins {
		var ipam map[string]json.RawMessage
		if json.Unmarshal(p["ipam"], &ipam) == nil {
			ipams = append(ipams, ipam)
		}
	}
	for _, ipam := range ipams {
		if raw, ok := ipam["enable_overlapping_ranges"]; ok && strings.TrimSpace(string(raw)) == "false" {
			return false
		}
	}
	return true
}

// networkOf is the network a pool's findings are labelled with: the first
// NAD naming it, or NoNAD.
func (x *index) networkOf(pool string) string {
	nets := x.poolNets[pool]
	if len(nets) == 0 {
		return NoNAD
	}
	refs := make([]string, len(nets))
	for i, n := range nets {
		refs[i] = n.ref
	}
	sort.Strings(refs)
	return refs[0]
}

// live is a pod whose addresses count: it exists, is not being deleted, and
// has not terminated.
func live(p *corev1.Pod) bool {
	if p == nil || p.DeletionTimestamp != nil {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// running is a live pod whose sandbox Multus has finished with.
func running(p *corev1.Pod) bool {
	return live(p) && p.Status.Phase == corev1.PodRunning && !p.Spec.HostNetwork
}

// attachment is one network of a pod's network-status.
type attachment struct {
	nad   string // namespace/name
	iface string
	ips   []string
}

// statusOf reads a pod's network-status; ok is false when it is missing or
// unreadable.
func statusOf(p *corev1.Pod) ([]attachment, bool) {
	raw, ok := p.Annotations[reconcile.NetworkStatusAnnotation]
	if !ok || raw == "" {
		return nil, false
	}
	var st []struct {
		Name      string   `json:"name"`
		Interface string   `json:"interface"`
		IPs       []string `json:"ips"`
	}
	if json.Unmarshal([]byte(raw), &st) != nil {
		return nil, false
	}
	out := make([]attachment, 0, len(st))
	for _, s := range st {
		a := attachment{nad: qualify(s.Name, p.Namespace), iface: s.Interface}
		for _, ip := range s.IPs {
			if parsed := net.ParseIP(strings.TrimSpace(ip)); parsed != nil {
				a.ips = append(a.ips, parsed.String())
			}
		}
		out = append(out, a)
	}
	return out, true
}

// request is one network a pod's networks annotation asks for.
type request struct {
	nad   string
	iface string
}

// requestsOf reads a pod's networks annotation: a JSON list of
// {namespace, name, interface}, or Multus' short form "ns/name@if, name".
func requestsOf(p *corev1.Pod) []request {
	raw := strings.TrimSpace(p.Annotations[NetworksAnnotation])
	if raw == "" {
		return nil
	}
	var out []request
	if strings.HasPrefix(raw, "[") {
		var sel []struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			Interface string `json:"interface"`
		}
		if json.Unmarshal([]byte(raw), &sel) != nil {
			return nil
		}
		for _, s := range sel {
			ns := s.Namespace
			if ns == "" {
				ns = p.Namespace
			}
			out = append(out, request{nad: ns + "/" + s.Name, iface: s.Interface})
		}
		return out
	}
	for _, item := range strings.Split(raw, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, iface, _ := strings.Cut(item, "@")
		out = append(out, request{nad: qualify(name, p.Namespace), iface: iface})
	}
	return out
}

func qualify(name, namespace string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return namespace + "/" + name
}
