// Package watch runs the audit (package audit) where an operator looks: it
// reads the cluster (a list per look, or informers that re-judge on every
// change), records an Event on the pod or pool of each finding that opens,
// and exports the findings and each network's headroom as metrics. It
// writes Events and nothing else: never a pool, never a reservation.
package watch

import (
	"context"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/audit"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/reconcile"
)

// Source is what a look reads.
type Source interface {
	Snapshot(ctx context.Context) (audit.Snapshot, error)
}

// ListSource reads every look from the API server: pools and reservations
// through the store, pods of every namespace page by page (trimmed as they
// come), the nodes and NADs through the reconciler's Cluster. For a single
// run (a CronJob's pass, inspect).
type ListSource struct {
	Store   *shim.Store
	Cluster reconcile.Cluster
	Kube    kubernetes.Interface
	// CallTimeout bounds each request; PageSize the pods of a page.
	CallTimeout time.Duration
	PageSize    int64
}

// Snapshot lists what a look judges.
func (l *ListSource) Snapshot(ctx context.Context) (audit.Snapshot, error) {
	s := audit.Snapshot{PoolNamespace: l.Store.Namespace(), Nodes: -1}
	var err error
	if s.Pools, err = l.Store.Pools(ctx); err != nil {
		return s, fmt.Errorf("audit: %w", err)
	}
	if s.Reservations, err = l.Store.Reservations(ctx); err != nil {
		return s, fmt.Errorf("audit: %w", err)
	}
	s.NADs, s.NADsErr = l.Cluster.NADs(ctx)
	if nodes, err := l.Cluster.Nodes(ctx); err == nil {
		s.Nodes = len(nodes)
	}
	timeout, size := l.CallTimeout, l.PageSize
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if size <= 0 {
		size = 500
	}
	s.Pods, err = shim.ListAll(ctx, size, func(ctx context.Context, page shim.Page) ([]*corev1.Pod, string, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		list, err := l.Kube.CoreV1().Pods("").List(cctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
		if err != nil {
			return nil, "", err
		}
		out := make([]*corev1.Pod, len(list.Items))
		for i := range list.Items {
			out[i] = audit.TrimPod(&list.Items[i])
		}
		return out, list.Continue, nil
	})
	if err != nil {
		return s, fmt.Errorf("audit: list pods: %w", err)
	}
	return s, nil
}

// WatchSource serves each look from informers of the pods, nodes, pools,
// reservations and NADs, and says when any of them changed: the Deployment
// re-judges then, not at its next pass.
type WatchSource struct {
	namespace string
	pods      toolscache.SharedIndexInformer
	nodes     toolscache.SharedIndexInformer
	pools     toolscache.SharedIndexInformer
	orips     toolscache.SharedIndexInformer
	nads      toolscache.SharedIndexInformer
	changed   chan struct{}
}

// NewWatchSource starts the informers (they stop with ctx) and waits, at
// most syncTimeout, until they have listed.
func NewWatchSource(ctx context.Context, rc *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface, namespace string, syncTimeout time.Duration) (*WatchSource, error) {
	w := &WatchSource{namespace: namespace, changed: make(chan struct{}, 1)}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(trim))
	w.pods, w.nodes = f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
	wb, params, err := shim.WhereaboutsClient(rc)
	if err != nil {
		return nil, err
	}
	lw := func(resource string, list func() runtime.Object) *toolscache.ListWatch {
		return &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				out := list()
				return out, wb.Get().Namespace(namespace).Resource(resource).VersionedParams(&o, params).Do(ctx).Into(out)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
				o.Watch = true
				req := wb.Get().Namespace(namespace).Resource(resource).VersionedParams(&o, params)
				if o.TimeoutSeconds != nil {
					req = req.Timeout(time.Duration(*o.TimeoutSeconds) * time.Second)
				}
				return req.Watch(ctx)
			},
		}
	}
	w.pools = toolscache.NewSharedIndexInformer(lw("ippools", func() runtime.Object { return &shim.PoolList{} }), &shim.Pool{}, 0, toolscache.Indexers{})
	w.orips = toolscache.NewSharedIndexInformer(lw("overlappingrangeipreservations", func() runtime.Object { return &shim.ReservationList{} }), &shim.Reservation{}, 0, toolscache.Indexers{})
	w.nads = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(reconcile.NADResource).Informer()
	poke := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { w.poke() },
		UpdateFunc: func(old, cur any) {
			if !unchangedForAudit(old, cur) {
				w.poke()
			}
		},
		DeleteFunc: func(any) { w.poke() },
	}
	for _, inf := range []toolscache.SharedIndexInformer{w.pods, w.pools, w.orips, w.nads} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return nil, fmt.Errorf("audit informer: %w", err)
		}
	}
	for _, inf := range []toolscache.SharedIndexInformer{w.pools, w.orips, w.nads} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, fmt.Errorf("audit informer transform: %w", err)
		}
	}
	f.Start(ctx.Done())
	go w.pools.Run(ctx.Done())
	go w.orips.Run(ctx.Done())
	go w.nads.Run(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !toolscache.WaitForCacheSync(sctx.Done(), w.pods.HasSynced, w.nodes.HasSynced, w.pools.HasSynced, w.orips.HasSynced, w.nads.HasSynced) {
		return nil, fmt.Errorf("audit informers (pods, nodes, ippools, reservations, NADs) not synced after %s", syncTimeout)
	}
	return w, nil
}

// unchangedForAudit says whether an update of a pod changed nothing the
// audit reads: its trimmed copies (audit.TrimPod) differ in their
// resourceVersion only. Most of a cluster's pod updates (conditions,
// container statuses, labels) are such; judging again on each would cost a
// look a second on a busy cluster for nothing.
func unchangedForAudit(old, cur any) bool {
	a, ok := old.(*corev1.Pod)
	if !ok {
		return false
	}
	b, ok := cur.(*corev1.Pod)
	if !ok {
		return false
	}
	x, y := *a, *b
	x.ResourceVersion, y.ResourceVersion = "", ""
	return reflect.DeepEqual(x, y)
}

func (w *WatchSource) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Changed receives when an informer delivered a change since the last receive.
func (w *WatchSource) Changed() <-chan struct{} { return w.changed }

// Snapshot is what the informers hold now. Objects are shared with the
// informers: the audit only reads them.
func (w *WatchSource) Snapshot(context.Context) (audit.Snapshot, error) {
	s := audit.Snapshot{PoolNamespace: w.namespace, Nodes: len(w.nodes.GetStore().ListKeys())}
	for _, o := range w.pods.GetStore().List() {
		if p, ok := o.(*corev1.Pod); ok {
			s.Pods = append(s.Pods, p)
		}
	}
	for _, o := range w.pools.GetStore().List() {
		if p, ok := o.(*shim.Pool); ok {
			s.Pools = append(s.Pools, *p)
		}
	}
	for _, o := range w.orips.GetStore().List() {
		if r, ok := o.(*shim.Reservation); ok {
			s.Reservations = append(s.Reservations, *r)
		}
	}
	for _, o := range w.nads.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		// A config that is not a string reads as broken: its NAD names no
		// network (reconcile.IndexNADs says the NADs are not all known).
		cfg, _, _ := unstructured.NestedString(u.Object, "spec", "config")
		s.NADs = append(s.NADs, reconcile.NAD{Namespace: u.GetNamespace(), Name: u.GetName(), Config: cfg})
	}
	return s, nil
}

// trim keeps of a pod what the audit reads, of a node its name.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return audit.TrimPod(o), nil
	case *corev1.Node:
		n := &corev1.Node{}
		n.Name, n.UID, n.ResourceVersion = o.Name, o.UID, o.ResourceVersion
		return n, nil
	}
	return obj, nil
}

func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
