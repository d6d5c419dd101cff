package reconcile

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

const component = "harvester-ipam-reconciler"

// maxEvents bounds the Events of one pool in one pass: one per release up to
// it, then one that sums up the rest (a node loss may free thousands).
const maxEvents = 10

// events tells operators, on the pool, what was released and why. A failed
// Event loses no data: it is counted, not fatal.
func (r *Reconciler) events(ctx context.Context, p *shim.Pool, removed []shim.Allocation, deletedORIPs []string, network string) {
	deleted := map[string]bool{}
	for _, n := range deletedORIPs {
		deleted[n] = true
	}
	ref := corev1.ObjectReference{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPool", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	for i, a := range removed {
		if i == maxEvents-1 && len(removed) > maxEvents {
			var pods []string
			for _, rest := range removed[i:] {
				if len(pods) < 5 {
					pods = append(pods, rest.PodRef)
				}
			}
			r.emit(ctx, ref, "StaleAllocationsReleased",
				fmt.Sprintf("released %d more stale allocations (pods %s, ...)", len(removed)-i, strings.Join(pods, ", ")))
			return
		}
		orip := ""
		if name := names.Reservation(a.IP, network); deleted[name] {
			orip = ", reservation " + name + " deleted"
		}
		r.emit(ctx, ref, "StaleAllocationReleased",
			fmt.Sprintf("released %s of pod %s (container %s, ifname %q)%s", a.IP, a.PodRef, a.ContainerID, a.IfName, orip))
	}
}

func (r *Reconciler) oripEvent(ctx context.Context, o *shim.Reservation) {
	r.emit(ctx, corev1.ObjectReference{
		APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "OverlappingRangeIPReservation",
		Namespace: o.Namespace, Name: o.Name, UID: o.UID,
	}, "OrphanedReservationDeleted",
		fmt.Sprintf("deleted reservation %s of pod %s: no pool allocation holds the address for it", o.Name, o.Spec.PodRef))
}

func (r *Reconciler) emit(ctx context.Context, ref corev1.ObjectReference, reason, msg string) {
	now := metav1.NewTime(r.now())
	ev := &corev1.Event{
		// Named as client-go's recorder names events: object name and a timestamp.
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, time.Now().UnixNano()), Namespace: ref.Namespace},
		InvolvedObject: ref, Reason: reason, Message: msg, Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: component}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "harvesterhci.io/" + component, ReportingInstance: component,
	}
	if err := r.Cluster.Event(ctx, ev); err != nil {
		r.EventErrors++
	}
}
