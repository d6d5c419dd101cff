package shim

import (
	"context"
	"fmt"

	wbclient "github.com/k8snetworkplumbingwg/whereabouts/pkg/generated/clientset/versioned/typed/whereabouts.cni.cncf.io/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// kubeAPI is API on a real API server, through the typed client of
// whereabouts' CRDs and a REST client of coordination.k8s.io/v1 Leases. Only
// these, since the plugin links them and every sandbox pays for what it
// links: client-go's typed coordination client would bring the scheme of
// every built-in API group (twice the plugin's memory, 40 ms of start-up).
type kubeAPI struct {
	wb    wbclient.WhereaboutsV1alpha1Interface
	lease rest.Interface
}

// leaseClient is a REST client that knows Leases and nothing else.
func leaseClient(cfg *rest.Config) (rest.Interface, error) {
	scheme := runtime.NewScheme()
	gv := coordinationv1.SchemeGroupVersion
	scheme.AddKnownTypes(gv, &coordinationv1.Lease{}, &coordinationv1.LeaseList{})
	metav1.AddToGroupVersion(scheme, gv)
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
}

const leases = "leases"

// NewKubeAPI is the API of the server cfg names.
func NewKubeAPI(cfg *rest.Config) (API, error) {
	wb, err := wbclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("whereabouts client: %w", err)
	}
	lease, err := leaseClient(cfg)
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

func (k *kubeAPI) CreatePool(ctx context.Context, ns string, p *Pool) (*Pool, error) {
	return k.wb.IPPools(ns).Create(ctx, p, metav1.CreateOptions{})
}

func (k *kubeAPI) CreateReservation(ctx context.Context, ns string, o *Reservation) (*Reservation, error) {
	return k.wb.OverlappingRangeIPReservations(ns).Create(ctx, o, metav1.CreateOptions{})
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
	out := &Lease{}
	err := k.lease.Get().Namespace(ns).Resource(leases).Name(name).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) CreateLease(ctx context.Context, l *Lease) (*Lease, error) {
	out := &Lease{}
	err := k.lease.Post().Namespace(l.Namespace).Resource(leases).Body(l).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) UpdateLease(ctx context.Context, l *Lease) (*Lease, error) {
	out := &Lease{}
	err := k.lease.Put().Namespace(l.Namespace).Resource(leases).Name(l.Name).Body(l).Do(ctx).Into(out)
	return out, err
}
