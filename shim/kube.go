package shim

import (
	"context"
	"fmt"

	wbclient "github.com/k8snetworkplumbingwg/whereabouts/pkg/client/clientset/versioned/typed/whereabouts.cni.cncf.io/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
)

// kubeAPI is API on a real API server, through the typed clients of
// whereabouts' CRDs and of coordination.k8s.io; only these two, since the
// plugin links them and every sandbox pays for what it links.
type kubeAPI struct {
	wb    wbclient.WhereaboutsV1alpha1Interface
	lease coordinationclient.CoordinationV1Interface
}

// NewKubeAPI is the API of the server cfg names.
func NewKubeAPI(cfg *rest.Config) (API, error) {
	wb, err := wbclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("whereabouts client: %w", err)
	}
	lease, err := coordinationclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("coordination client: %w", err)
	}
	return &kubeAPI{wb: wb, lease: lease}, nil
}

func (k *kubeAPI) GetPool(ctx context.Context, ns, name string, from Source) (*Pool, error) {
	opts := metav1.GetOptions{}
	if from == Cache {
		opts.ResourceVersion = "0"
	}
	return k.wb.IPPools(ns).Get(ctx, name, opts)
}

func (k *kubeAPI) ListPools(ctx context.Context, ns string, page Page) ([]Pool, string, error) {
	l, err := k.wb.IPPools(ns).List(ctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
	if err != nil {
		return nil, "", err
	}
	return l.Items, l.Continue, nil
}

func (k *kubeAPI) PatchPool(ctx context.Context, ns, name string, patch Patch) (*Pool, error) {
	body, err := patch.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return k.wb.IPPools(ns).Patch(ctx, name, types.JSONPatchType, body, metav1.PatchOptions{})
}

func (k *kubeAPI) DeletePool(ctx context.Context, ns, name string, pre Preconditions) error {
	uid, rv := pre.UID, pre.ResourceVersion
	return k.wb.IPPools(ns).Delete(ctx, name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

func (k *kubeAPI) GetReservation(ctx context.Context, ns, name string) (*Reservation, error) {
	return k.wb.OverlappingRangeIPReservations(ns).Get(ctx, name, metav1.GetOptions{})
}

func (k *kubeAPI) ListReservations(ctx context.Context, ns string, page Page) ([]Reservation, string, error) {
	l, err := k.wb.OverlappingRangeIPReservations(ns).List(ctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
	if err != nil {
		return nil, "", err
	}
	return l.Items, l.Continue, nil
}

func (k *kubeAPI) PatchReservation(ctx context.Context, ns, name string, patch Patch) (*Reservation, error) {
	body, err := patch.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return k.wb.OverlappingRangeIPReservations(ns).Patch(ctx, name, types.JSONPatchType, body, metav1.PatchOptions{})
}

func (k *kubeAPI) DeleteReservation(ctx context.Context, ns, name string, pre Preconditions) error {
	uid, rv := pre.UID, pre.ResourceVersion
	return k.wb.OverlappingRangeIPReservations(ns).Delete(ctx, name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

func (k *kubeAPI) GetLease(ctx context.Context, ns, name string) (*Lease, error) {
	return k.lease.Leases(ns).Get(ctx, name, metav1.GetOptions{})
}

func (k *kubeAPI) CreateLease(ctx context.Context, l *Lease) (*Lease, error) {
	return k.lease.Leases(l.Namespace).Create(ctx, l, metav1.CreateOptions{})
}

func (k *kubeAPI) UpdateLease(ctx context.Context, l *Lease) (*Lease, error) {
	return k.lease.Leases(l.Namespace).Update(ctx, l, metav1.UpdateOptions{})
}
