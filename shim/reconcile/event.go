package reconcile

import (
	"context"
	"fmt"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
)

const component = "harvester-ipam-reconciler"

// event tells operators, on the pool, what was released and why. A failed
// event loses no data: it is counted, not fatal.
func (r *Reconciler) event(ctx context.Context, p *whereaboutsv1alpha1.IPPool, rel shim.Release) {
	orip := ""
	if rel.ORIP != "" {
		orip = ", reservation " + rel.ORIP + " deleted"
	}
	r.emit(ctx, corev1.ObjectReference{
		APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPool",
		Namespace: p.Namespace, Name: p.Name, UID: p.UID,
	}, "StaleAllocationReleased",
		fmt.Sprintf("released %s of pod %s (container %s, ifname %q)%s", rel.IP, rel.PodRef, rel.ContainerID, rel.IfName, orip))
}

func (r *Reconciler) oripEvent(ctx context.Context, o *whereaboutsv1alpha1.OverlappingRangeIPReservation) {
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
	cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
	defer cancel()
	if _, err := r.Kube.CoreV1().Events(ref.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		r.EventErrors++
	}
}
