package cache

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/shim"
)

// Watch keeps o filled from informers of the pools and reservations of
// namespace (each ListerWatcher of that namespace), until ctx ends. It
// returns once both have listed (and Pools says so), or with ctx's error.
// managedFields are dropped as objects arrive: a 10,000-entry pool carries
// them for every writer.
func (o *Objects) Watch(ctx context.Context, namespace string, pools, reservations toolscache.ListerWatcher) error {
	pi := toolscache.NewSharedIndexInformer(o.following(namespace, "ippools", pools), &shim.Pool{}, 0, toolscache.Indexers{})
	ri := toolscache.NewSharedIndexInformer(o.following(namespace, "overlappingrangeipreservations", reservations), &shim.Reservation{}, 0, toolscache.Indexers{})
	for _, inf := range []toolscache.SharedIndexInformer{pi, ri} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return fmt.Errorf("informer transform: %w", err)
		}
	}
	saw := func(obj any) {
		if p := asPool(obj); p != nil {
			o.SawPool(p)
			o.WatchedPool(p.Namespace, p.ResourceVersion)
		}
	}
	if _, err := pi.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    saw,
		UpdateFunc: func(_, obj any) { saw(obj) },
		DeleteFunc: func(obj any) {
			if p := asPool(obj); p != nil {
				o.GonePool(p.Namespace, p.Name, p.ResourceVersion)
				o.WatchedPool(p.Namespace, p.ResourceVersion)
			}
		},
	}); err != nil {
		return fmt.Errorf("pool informer: %w", err)
	}
	if _, err := ri.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.SawReservation(asReservation(obj)) },
		UpdateFunc: func(_, obj any) { o.SawReservation(asReservation(obj)) },
		DeleteFunc: func(obj any) {
			if r := asReservation(obj); r != nil {
				o.GoneReservation(r.Namespace, r.Name, r.ResourceVersion)
			}
		},
	}); err != nil {
		return fmt.Errorf("reservation informer: %w", err)
	}
	go pi.Run(ctx.Done())
	go ri.Run(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), pi.HasSynced, ri.HasSynced) {
		return errors.Join(errors.New("pools and reservations not listed"), ctx.Err())
	}
	o.Listed(namespace)
	return nil
}

// following is lw whose lists and watches tell o whether the informer of
// resource follows the cluster (Objects.Following): a list or a watch that
// fails, or an error in a watch's stream, says it does not; a list, or an
// event or a bookmark of a watch opened since, that it does again. A watch
// that merely closes (its timeout) is watched again from its
// resourceVersion, missing nothing.
func (o *Objects) following(namespace, resource string, lw toolscache.ListerWatcher) toolscache.ListerWatcher {
	return &toolscache.ListWatch{
		ListFunc: func(opts metav1.ListOptions) (runtime.Object, error) {
			obj, err := lw.List(opts)
			if err != nil {
				o.failed(namespace, resource, o.lastWatch(namespace, resource), fmt.Errorf("list: %w", err))
				return nil, err
			}
			o.relisted(namespace, resource)
			return obj, nil
		},
		WatchFunc: func(opts metav1.ListOptions) (watch.Interface, error) {
			n := o.watchOpening(namespace, resource)
			w, err := lw.Watch(opts)
			if err != nil {
				// Refused: the reflector watches again later, without a
				// list when it was a 429 or a refused connection.
				o.failed(namespace, resource, n, err)
				return nil, err
			}
			// A watch that streams the initial state instead of a list
			// (client-go's WatchListClient) is a list once its initial
			// events have ended.
			streamsList := opts.SendInitialEvents != nil && *opts.SendInitialEvents
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				switch {
				case e.Type == watch.Error:
					o.failed(namespace, resource, n, apierrors.FromObject(e.Object))
				case !streamsList:
					o.delivered(namespace, resource, n)
				case e.Type == watch.Bookmark && initialEventsEnd(e.Object):
					o.relisted(namespace, resource)
				}
				return e, true
			}), nil
		},
	}
}

func initialEventsEnd(obj runtime.Object) bool {
	m, ok := obj.(metav1.Object)
	return ok && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
}

func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func asPool(obj any) *shim.Pool {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, _ := obj.(*shim.Pool)
	return p
}

func asReservation(obj any) *shim.Reservation {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	r, _ := obj.(*shim.Reservation)
	return r
}
