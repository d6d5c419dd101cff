// Package reconcile finds the allocations and reservations that no ADD of
// their pod will ever release — a node that died, a pod force-deleted, a NAD
// deleted while pods held addresses, a range changed under running pods, a
// leftover ORIP — and releases them, cluster-wide, without any NAD. It judges
// staleness conservatively: in every case of doubt an allocation is live, and
// a stale one is released only after it has been seen stale for a grace
// period and judged stale again on a fresh look.
package reconcile

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// NetworkStatusAnnotation is where Multus records each attachment's addresses.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// Reason says why an allocation is stale; "" means it is live.
type Reason string

const (
	Live          Reason = ""
	PodGone       Reason = "pod gone"
	PodTerminated Reason = "pod terminated"
	NodeGone      Reason = "node gone"
	// Superseded: the pod's network-status names another of its addresses in
	// the same pool, a newer sandbox's.
	Superseded Reason = "newer sandbox holds another address"
	// NotOnStatus: the pod runs, and its network-status names no attachment
	// with this address or any other of this sandbox's (the range or the
	// network changed under it, and this entry's DEL was lost).
	NotOnStatus  Reason = "not on the pod's network-status"
	OrphanedORIP Reason = "no allocation holds its address for its pod"

	livePending     = "pod pending"
	liveNoStatus    = "no network-status yet"
	liveUnowned     = "no podref"
	liveOnStatus    = "on the pod's network-status"
	liveSibling     = "another interface of the pod's current sandbox"
	liveUnknownNode = "node list unavailable"
)

// World is what a pass read: pods by "namespace/name" and the node names.
type World struct {
	Pods map[string]*corev1.Pod
	// Nodes are the existing nodes; NodesKnown is false when they could not be listed.
	Nodes      map[string]bool
	NodesKnown bool
}

// Verdict is the judgement of one allocation.
type Verdict struct {
	shim.Allocation
	Reason Reason
	// Why is the live reason, for people (pod running, pod pending, ...).
	Why string
}

func (v Verdict) Stale() bool { return v.Reason != Live }

// Sandboxes indexes the addresses each container holds, in every pool:
// the interfaces of one sandbox, wherever their pools are.
type Sandboxes map[string][]string

// SandboxesOf indexes the entries of pools by container ID.
func SandboxesOf(pools []shim.Pool) Sandboxes {
	out := Sandboxes{}
	for i := range pools {
		as, err := shim.Allocations(&pools[i])
		if err != nil {
			continue
		}
		for _, a := range as {
			if a.ContainerID != "" {
				out[a.ContainerID] = append(out[a.ContainerID], a.IP.String())
			}
		}
	}
	return out
}

// Classify judges every allocation of a pool against what the pass read.
func Classify(p *shim.Pool, w World, sb Sandboxes) ([]Verdict, error) {
	allocs, err := shim.Allocations(p)
	if err != nil {
		return nil, err
	}
	byPod := map[string][]shim.Allocation{}
	for _, a := range allocs {
		byPod[a.PodRef] = append(byPod[a.PodRef], a)
	}
	out := make([]Verdict, 0, len(allocs))
	for _, a := range allocs {
		out = append(out, judge(a, byPod[a.PodRef], sb[a.ContainerID], w))
	}
	return out, nil
}

// judge is one allocation's verdict. samePod are the pod's entries in this
// pool; sandbox are the addresses the entry's container holds anywhere.
func judge(a shim.Allocation, samePod []shim.Allocation, sandbox []string, w World) Verdict {
	v := Verdict{Allocation: a}
	if a.PodRef == "" || !strings.Contains(a.PodRef, "/") {
		v.Why = liveUnowned // cannot be tied to a pod: never proven stale
		return v
	}
	pod, ok := w.Pods[a.PodRef]
	if !ok {
		v.Reason = PodGone
		return v
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		v.Reason = PodTerminated
		return v
	case corev1.PodPending, "":
		v.Why = livePending
		return v
	}
	if node := pod.Spec.NodeName; node != "" && w.NodesKnown && !w.Nodes[node] {
		v.Reason = NodeGone
		return v
	}
	ips, known := statusIPs(pod)
	switch {
	case !known:
		v.Why = liveNoStatus
		if !w.NodesKnown {
			v.Why = liveUnknownNode
		}
		return v
	case ips[a.IP.String()]:
		v.Why = liveOnStatus
		return v
	}
	for _, ip := range sandbox {
		if ip != a.IP.String() && ips[ip] {
			// The sandbox's other interface is on the status: this sandbox is
			// the pod's current one, and its entry is live.
			v.Why = liveSibling
			return v
		}
	}
	v.Reason = NotOnStatus
	for _, o := range samePod {
		if o.Offset != a.Offset && ips[o.IP.String()] {
			v.Reason = Superseded
		}
	}
	return v
}

// statusIPs are the addresses Multus recorded for the pod; known is false
// when the annotation is missing or unreadable.
func statusIPs(pod *corev1.Pod) (map[string]bool, bool) {
	raw, ok := pod.Annotations[NetworkStatusAnnotation]
	if !ok || raw == "" {
		return nil, false
	}
	var st []struct {
		IPs []string `json:"ips"`
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return nil, false
	}
	ips := map[string]bool{}
	for _, s := range st {
		for _, ip := range s.IPs {
			if parsed := net.ParseIP(strings.TrimSpace(ip)); parsed != nil {
				ips[parsed.String()] = true
			}
		}
	}
	return ips, true
}

// NetworkName is the network_name a pool's reservations are named under:
// the prefix of its name before its range (names.PoolPrefix).
func NetworkName(p *shim.Pool) string {
	prefix, _ := names.PoolPrefix(p.Name, p.Spec.Range)
	return prefix
}

// ORIPVerdict is the judgement of one reservation.
type ORIPVerdict struct {
	ORIP   *shim.Reservation
	Reason Reason
}

// ClassifyORIPs finds the reservations that no pool allocation backs: none
// holds the reservation's address for its podref, under any network name the
// pool's addresses may be reserved under (names.ReservationNetworks: in
// doubt, a reservation is held).
func ClassifyORIPs(pools []shim.Pool, orips []shim.Reservation) ([]ORIPVerdict, error) {
	held := map[string]map[string]bool{} // reservation name -> podrefs holding it
	for i := range pools {
		p := &pools[i]
		allocs, err := shim.Allocations(p)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		networks := names.ReservationNetworks(p.Name, p.Spec.Range)
		for _, a := range allocs {
			for _, nn := range networks {
				name := names.Reservation(a.IP, nn)
				if held[name] == nil {
					held[name] = map[string]bool{}
				}
				held[name][a.PodRef] = true
			}
		}
	}
	out := make([]ORIPVerdict, 0, len(orips))
	for i := range orips {
		o := &orips[i]
		v := ORIPVerdict{ORIP: o}
		if !held[o.Name][o.Spec.PodRef] {
			v.Reason = OrphanedORIP
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ORIP.Name < out[j].ORIP.Name })
	return out, nil
}
