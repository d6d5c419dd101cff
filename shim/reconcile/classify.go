// Package reconcile finds the allocations and reservations that no ADD of
// their pod will ever release — a node that died, a pod force-deleted, a NAD
// deleted while pods held addresses, a leftover ORIP — and releases them,
// cluster-wide, without any NAD. It judges staleness conservatively: in every
// case of doubt an allocation is live, and a stale one is released only after
// it has been seen stale for a grace period.
package reconcile

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
)

// NetworkStatusAnnotation is where Multus records each attachment's addresses.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// Reason says why an allocation is stale; "" means it is live.
type Reason string

const (
	Live            Reason = ""
	PodGone         Reason = "pod gone"
	PodTerminated   Reason = "pod terminated"
	NodeGone        Reason = "node gone"
	Superseded      Reason = "newer sandbox holds another address"
	OrphanedORIP    Reason = "no allocation holds its address for its pod"
	livePending            = "pod pending"
	liveNoStatus           = "another sandbox, but no network-status yet"
	liveUnowned            = "no podref"
	liveRunning            = "pod running"
	liveUnknownNode        = "node list unavailable"
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

// NetworkName recovers whereabouts' network_name from a pool's name and range:
// the pool "blue-192.168.50.0-24" of range 192.168.50.0/24 is network "blue".
func NetworkName(p *whereaboutsv1alpha1.IPPool) string {
	base := conf.PoolName(p.Spec.Range, "")
	if p.Name == base {
		return ""
	}
	return strings.TrimSuffix(p.Name, "-"+base)
}

// Classify judges every allocation of a pool against what the pass read.
func Classify(p *whereaboutsv1alpha1.IPPool, w World) ([]Verdict, error) {
	allocs, err := shim.Allocations(p)
	if err != nil {
		return nil, err
	}
	// Addresses of each pod in this pool, to spot superseded sandboxes.
	byPod := map[string][]shim.Allocation{}
	for _, a := range allocs {
		byPod[a.PodRef] = append(byPod[a.PodRef], a)
	}
	out := make([]Verdict, 0, len(allocs))
	for _, a := range allocs {
		out = append(out, judge(a, byPod[a.PodRef], w))
	}
	return out, nil
}

func judge(a shim.Allocation, samePod []shim.Allocation, w World) Verdict {
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
	if pod.Spec.NodeName != "" {
		if !w.NodesKnown {
			v.Why = liveUnknownNode
		} else if !w.Nodes[pod.Spec.NodeName] {
			v.Reason = NodeGone
			return v
		}
	}
	if len(samePod) > 1 {
		ips, known := statusIPs(pod)
		switch {
		case !known:
			v.Why = liveNoStatus
		case ips[a.IP.String()]:
			v.Why = liveRunning
		default:
			// Stale only when the status names another of the pod's addresses
			// here: that one is the newer sandbox's.
			for _, o := range samePod {
				if o.Offset != a.Offset && ips[o.IP.String()] {
					v.Reason = Superseded
					return v
				}
			}
			v.Why = liveNoStatus
		}
		return v
	}
	if v.Why == "" {
		v.Why = liveRunning
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
			if parsed := net.ParseIP(ip); parsed != nil {
				ips[parsed.String()] = true
			}
		}
	}
	return ips, true
}

// ORIPVerdict is the judgement of one reservation.
type ORIPVerdict struct {
	ORIP   *whereaboutsv1alpha1.OverlappingRangeIPReservation
	Reason Reason
}

// ClassifyORIPs finds the reservations that no pool allocation backs: none
// holds the reservation's address, under its network name, for its podref.
func ClassifyORIPs(pools []whereaboutsv1alpha1.IPPool, orips []whereaboutsv1alpha1.OverlappingRangeIPReservation) ([]ORIPVerdict, error) {
	held := map[string]map[string]bool{} // ORIP name -> podrefs holding it
	for i := range pools {
		p := &pools[i]
		allocs, err := shim.Allocations(p)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		nn := NetworkName(p)
		for _, a := range allocs {
			name := shim.ORIPName(a.IP, nn)
			if held[name] == nil {
				held[name] = map[string]bool{}
			}
			held[name][a.PodRef] = true
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
