package shim

import (
	"context"
	"fmt"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// kubeAPI is API on a real API server, through two REST clients that
// know only what they carry: whereabouts' CRDs (whereabouts.cni.cncf.io/
// v1alpha1) and coordination.k8s.io/v1 Leases. Not whereabouts' generated
// clientset nor client-go's typed clients: the plugin links this, and every
// sandbox pays at its start for what it links. The generated typed client
// builds on client-go's gentype, whose fake links client-go/testing and with
// it managedfields, structured-merge-diff, kube-openapi and protobuf (66
// packages, a third of the plugin's package inits); client-go's typed
// coordination client brings the scheme of every built-in API group.
type kubeAPI struct {
	wb    rest.Interface
	lease rest.Interface
	// params encodes GetOptions and ListOptions as query parameters.
	params runtime.ParameterCodec
}

// groupClient is a REST client of one API group version whose scheme add
// fills, with the parameter codec of that scheme.
func groupClient(cfg *rest.Config, gv schema.GroupVersion, add func(*runtime.Scheme) error) (rest.Interface, runtime.ParameterCodec, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return nil, nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, nil, err
	}
	return rc, runtime.NewParameterCodec(scheme), nil
}

// leaseClient is a REST client that knows Leases and nothing else.
func leaseClient(cfg *rest.Config) (rest.Interface, error) {
	gv := coordinationv1.SchemeGroupVersion
	rc, _, err := groupClient(cfg, gv, func(s *runtime.Scheme) error {
		s.AddKnownTypes(gv, &coordinationv1.Lease{}, &coordinationv1.LeaseList{})
		metav1.AddToGroupVersion(s, gv)
		return nil
	})
	return rc, err
}

// WhereaboutsClient is a REST client of whereabouts' CRDs and the codec of
// their GetOptions and ListOptions: what NewKubeAPI reads and writes with,
// and what a node agent's informers list and watch with.
func WhereaboutsClient(cfg *rest.Config) (rest.Interface, runtime.ParameterCodec, error) {
	rc, params, err := groupClient(cfg, whereaboutsv1alpha1.SchemeGroupVersion, whereaboutsv1alpha1.AddToScheme)
	if err != nil {
		return nil, nil, fmt.Errorf("whereabouts client: %w", err)
	}
	return rc, params, nil
}

const (
	leases       = "leases"
	pools        = "ippools"
	reservations = "overlappingrangeipreservations"
)

// NewKubeAPI is the API of the server cfg names.
func NewKubeAPI(cfg *rest.Config) (API, error) {
	wb, params, err := WhereaboutsClient(cfg)
	if err != nil {
		return nil, err
	}
	lease, err := leaseClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("coordination client: %w", err)
	}
	return &kubeAPI{wb: wb, lease: lease, params: params}, nil
}

func (k *kubeAPI) GetPool(ctx context.Context, ns, name string, from Source) (*Pool, error) {
	opts := metav1.GetOptions{}
	if from == Cache {
		opts.ResourceVersion = "0"
	}
	out := &Pool{}
	err := k.wb.Get().Namespace(ns).Resource(pools).Name(name).VersionedParams(&opts, k.params).Do(ctx).Into(out)
	return out, err
}

// listOptions are a page's.
func listOptions(page Page) *metav1.ListOptions {
	o := &metav1.ListOptions{Limit: page.Limit, Continue: page.Continue}
	if page.NotOlderThan != "" && page.Continue == "" {
		o.ResourceVersion, o.ResourceVersionMatch = page.NotOlderThan, metav1.ResourceVersionMatchNotOlderThan
	}
	return o
}

func (k *kubeAPI) ListPools(ctx context.Context, ns string, page Page) ([]Pool, string, error) {
	l := &PoolList{}
	err := k.wb.Get().Namespace(ns).Resource(pools).VersionedParams(listOptions(page), k.params).Do(ctx).Into(l)
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
	out := &Pool{}
	err = k.wb.Patch(types.JSONPatchType).Namespace(ns).Resource(pools).Name(name).Body(body).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) CreatePool(ctx context.Context, ns string, p *Pool) (*Pool, error) {
	out := &Pool{}
	err := k.wb.Post().Namespace(ns).Resource(pools).Body(p).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) CreateReservation(ctx context.Context, ns string, o *Reservation) (*Reservation, error) {
	out := &Reservation{}
	err := k.wb.Post().Namespace(ns).Resource(reservations).Body(o).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) DeletePool(ctx context.Context, ns, name string, pre Preconditions) error {
	return k.delete(ctx, pools, ns, name, pre)
}

func (k *kubeAPI) delete(ctx context.Context, resource, ns, name string, pre Preconditions) error {
	uid, rv := pre.UID, pre.ResourceVersion
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}
	return k.wb.Delete().Namespace(ns).Resource(resource).Name(name).Body(opts).Do(ctx).Error()
}

func (k *kubeAPI) GetReservation(ctx context.Context, ns, name string) (*Reservation, error) {
	out := &Reservation{}
	err := k.wb.Get().Namespace(ns).Resource(reservations).Name(name).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) ListReservations(ctx context.Context, ns string, page Page) ([]Reservation, string, error) {
	l := &ReservationList{}
	err := k.wb.Get().Namespace(ns).Resource(reservations).VersionedParams(listOptions(page), k.params).Do(ctx).Into(l)
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
	out := &Reservation{}
	err = k.wb.Patch(types.JSONPatchType).Namespace(ns).Resource(reservations).Name(name).Body(body).Do(ctx).Into(out)
	return out, err
}

func (k *kubeAPI) DeleteReservation(ctx context.Context, ns, name string, pre Preconditions) error {
	return k.delete(ctx, reservations, ns, name, pre)
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
