package fake

import (
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
)

// Builders of the objects tests put in the fake with Put, in kube-system,
// where Harvester's whereabouts keeps them: the tests of shim, reconcile
// and plugin share them.

// NewPool is the IPPool name over the range rng, holding allocs.
func NewPool(name, rng string, allocs map[string]shim.IPAllocation) *shim.Pool {
	return &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}
}

// NewReservation is the OverlappingRangeIPReservation name (the address, as
// names.Reservation spells it) of podRef.
func NewReservation(name, podRef string) *shim.Reservation {
	return &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef}}
}
