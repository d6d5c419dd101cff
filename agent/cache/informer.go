package cache

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/shim"
)

// Watch keeps o filled from informers of the pools and reservations of
// namespace (each ListerWatcher of that namespace), until ctx ends. It
// returns once both have listed (and Pools says so), or with ctx's error.
// managedFields are dropped as objects arrive: a 10,000-entry pool carries
// them for every writer.
func (o *Objects) Watch(ctx context.Context, namespace string, pools, reservations toolscache.ListerWatcher) error {
	pi := toolscache.NewSharedIndexInformer(pools, &shim.Pool{}, 0, toolscache.Indexers{})
	ri := toolscache.NewSharedIndexInformer(reservations, &shim.Reservation{}, 0, toolscache.Indexers{})
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
