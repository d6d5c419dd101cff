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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
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
// re-judges then, not at its next pass. A look while an informer does not
// follow the cluster (Following) judges nothing.
type WatchSource struct {
	namespace string
	following *Following
	pods      toolscache.SharedIndexInformer
	nodes     toolscache.SharedIndexInformer
	pools     toolscache.SharedIndexInformer
	orips     toolscache.SharedIndexInformer
	nads      toolscache.SharedIndexInformer
	changed   chan struct{}
}

// Shared are the cluster-wide pod and node informers of the reconciler's
// Deployment: one of each, read by the reconciler's passes
// (reconcile.NewCachedClusterFrom) and by the audit, each pod trimmed to
// what either reads (audit.TrimPod keeps all that the reconciler's judge
// reads: names, phase, node, deletion, network-status), their lists and
// watches followed (Following).
type Shared struct {
	Pods, Nodes toolscache.SharedIndexInformer
	Following   *Following
}

// NewShared makes the informers; Start runs them.
func NewShared(kube kubernetes.Interface) (*Shared, error) {
	f := NewFollowing()
	pods := toolscache.NewSharedIndexInformer(f.ListerWatcher("pods", &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return kube.CoreV1().Pods("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			return kube.CoreV1().Pods("").Watch(ctx, o)
		},
	}), &corev1.Pod{}, 0, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	nodes := toolscache.NewSharedIndexInformer(f.ListerWatcher("nodes", &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return kube.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			return kube.CoreV1().Nodes().Watch(ctx, o)
		},
	}), &corev1.Node{}, 0, toolscache.Indexers{})
	for _, inf := range []toolscache.SharedIndexInformer{pods, nodes} {
		if err := inf.SetTransform(trim); err != nil {
			return nil, fmt.Errorf("pod and node informers' transform: %w", err)
		}
	}
	return &Shared{Pods: pods, Nodes: nodes, Following: f}, nil
}

// Start runs the informers until ctx ends, and waits, at most syncTimeout,
// until they have listed.
func (sh *Shared) Start(ctx context.Context, syncTimeout time.Duration) error {
	go sh.Pods.Run(ctx.Done())
	go sh.Nodes.Run(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !toolscache.WaitForCacheSync(sctx.Done(), sh.Pods.HasSynced, sh.Nodes.HasSynced) {
		return fmt.Errorf("pod and node informers not synced after %s", syncTimeout)
	}
	return nil
}

// NewWatchSource starts the informers of the pools, reservations and NADs
// (they stop with ctx), and those of shared when it is nil, and waits, at
// most syncTimeout, until they have listed.
func NewWatchSource(ctx context.Context, rc *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface, namespace string, syncTimeout time.Duration, shared *Shared) (*WatchSource, error) {
	if shared == nil {
		var err error
		if shared, err = NewShared(kube); err != nil {
			return nil, err
		}
		if err := shared.Start(ctx, syncTimeout); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
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
	return newWatchSource(ctx, namespace, shared,
		lw("ippools", func() runtime.Object { return &shim.PoolList{} }),
		lw("overlappingrangeipreservations", func() runtime.Object { return &shim.ReservationList{} }),
		&toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return dyn.Resource(reconcile.NADResource).Namespace(metav1.NamespaceAll).List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
				return dyn.Resource(reconcile.NADResource).Namespace(metav1.NamespaceAll).Watch(ctx, o)
			},
		}, syncTimeout)
}

// newWatchSource is NewWatchSource on the given list-watches of the pools,
// reservations and NADs.
func newWatchSource(ctx context.Context, namespace string, shared *Shared, pools, orips, nads toolscache.ListerWatcher, syncTimeout time.Duration) (*WatchSource, error) {
	f := shared.Following
	w := &WatchSource{namespace: namespace, following: f, pods: shared.Pods, nodes: shared.Nodes, changed: make(chan struct{}, 1)}
	w.pools = toolscache.NewSharedIndexInformer(f.ListerWatcher("ippools", pools), &shim.Pool{}, 0, toolscache.Indexers{})
	w.orips = toolscache.NewSharedIndexInformer(f.ListerWatcher("overlappingrangeipreservations", orips), &shim.Reservation{}, 0, toolscache.Indexers{})
	w.nads = toolscache.NewSharedIndexInformer(f.ListerWatcher("network-attachment-definitions", nads), &unstructured.Unstructured{}, 0, toolscache.Indexers{})
	f.mu.Lock()
	f.onFollow = w.poke // every informer follows again: look
	f.mu.Unlock()
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
	if err := w.following.Err(); err != nil {
		return s, fmt.Errorf("audit: %w", err)
	}
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
