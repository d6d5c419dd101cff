package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ReservationSpec is what a reservation says of its holder.
type ReservationSpec = whereaboutsv1alpha1.OverlappingRangeIPReservationSpec

var reservationsResource = schema.GroupResource{Group: "whereabouts.cni.cncf.io", Resource: "overlappingrangeipreservations"}

// The writes of an allocation, as whereabouts' own ADD makes them, for the
// node agent's allocator: a pool created empty on a range's first ADD, new
// entries added by one guarded patch, and the reservation created after the
// entry. Unlike the release's writes these are not retried here: the caller
// chooses its addresses again on a fresh read after a conflict.

// EnsurePool reads a pool fresh and, when it does not exist, creates it as
// whereabouts does: the range and no allocations. A pool someone else created
// meanwhile is read again.
func (s *Store) EnsurePool(ctx context.Context, name, ipRange string) (*Pool, error) {
	p, err := s.Pool(ctx, name)
	if err != nil || p != nil {
		return p, err
	}
	fresh := &Pool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace}}
	fresh.Spec.Range = ipRange
	fresh.Spec.Allocations = map[string]IPAllocation{}
	cctx, cancel := s.callWrite(ctx)
	created, err := s.api.CreatePool(cctx, s.namespace, fresh)
	cancel()
	switch {
	case err == nil:
		return created, nil
	case apierrors.IsAlreadyExists(err):
		p, err = s.Pool(ctx, name)
		if err == nil && p == nil {
			return nil, fmt.Errorf("pool %s/%s was created and deleted under us", s.namespace, name)
		}
		return p, err
	default:
		return nil, fmt.Errorf("create pool %s/%s: %w", s.namespace, name, err)
	}
}

// Assignment is one change an allocation makes to a pool: an entry added at
// a free offset, or (Rewrite) an entry of the same pod and interface given
// the new container ID, as whereabouts v0.8.0 and later do.
type Assignment struct {
	Offset  string
	Entry   IPAllocation
	Rewrite bool
}

// Assign writes assignments into the pool base was read as, in one patch
// that tests base's resourceVersion and, as whereabouts' own patch does, that
// every added offset is still empty. It returns the pool as written. A
// conflict (409, or 422 for a failed test) means base is stale: the caller
// reads fresh and chooses again; IsConflict tells it.
func (s *Store) Assign(ctx context.Context, base *Pool, as []Assignment) (*Pool, error) {
	if len(as) == 0 {
		return base, nil
	}
	ops := make([]PatchOp, 0, 2*len(as))
	for _, a := range as {
		path := "/spec/allocations/" + escapePointer(a.Offset)
		if a.Rewrite {
			ops = append(ops, PatchOp{Op: "replace", Path: path + "/id", Value: a.Entry.ContainerID})
			continue
		}
		ops = append(ops,
			PatchOp{Op: "test", Path: path, Value: json.RawMessage("null")},
			PatchOp{Op: "add", Path: path, Value: a.Entry})
	}
	if base.Spec.Allocations == nil {
		// An empty map reads back as none: add the map itself first, as
		// whereabouts' diff of an empty pool does.
		ops = append([]PatchOp{{Op: "add", Path: "/spec/allocations", Value: map[string]IPAllocation{}}}, ops...)
	}
	if len(ops) > maxPatchOps {
		return nil, fmt.Errorf("assign %d addresses in pool %s/%s: more than one patch may hold", len(as), s.namespace, base.Name)
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	p, err := s.api.PatchPool(cctx, s.namespace, base.Name, Guarded(base.ResourceVersion, ops...))
	if err != nil {
		if isConflict(err) {
			s.retried.Add(1)
		}
		return nil, fmt.Errorf("assign in pool %s/%s at resourceVersion %s: %w", s.namespace, base.Name, base.ResourceVersion, err)
	}
	return p, nil
}

// maxPatchOps is the API server's limit on the operations of one JSON patch.
const maxPatchOps = 10000

// IsGone says whether a write failed because its object does not exist
// (404): a pool deleted since it was read.
func IsGone(err error) bool { return apierrors.IsNotFound(err) }

// IsConflict says whether a write failed because what it was based on
// changed: a 409, or a 422 for a failed test of a guarded patch.
func IsConflict(err error) bool { return isConflict(err) }

// Reserve creates an address's reservation as whereabouts' ADD does, with
// the container ID too (whereabouts v0.7.0's CRD requires it; later ones
// keep it). It returns the reservation that exists at that name when the
// create finds one (AlreadyExists), read fresh, and nil when it created it.
// A reservation deleted between the create and the read (its holder
// released it) leaves the address free: it is created again, a few times.
func (s *Store) Reserve(ctx context.Context, name string, spec ReservationSpec) (existing *Reservation, err error) {
	for try := 1; ; try++ {
		o := &Reservation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace}, Spec: spec}
		cctx, cancel := s.callWrite(ctx)
		_, err = s.api.CreateReservation(cctx, s.namespace, o)
		cancel()
		if err == nil {
			return nil, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create reservation %s/%s: %w", s.namespace, name, err)
		}
		existing, err = s.Reservation(ctx, name)
		if err != nil || existing != nil {
			return existing, err
		}
		if try >= reserveTries {
			return nil, apierrors.NewConflict(reservationsResource, name, fmt.Errorf("reservation %s/%s was deleted while it was created, %d times", s.namespace, name, try))
		}
		s.retried.Add(1)
	}
}

// reserveTries bounds the creates of one reservation that each find it
// there and then gone.
const reserveTries = 5

// Pause waits d on the store's clock (a simulated one in the simulation).
func (s *Store) Pause(ctx context.Context, d time.Duration) error { return s.o.Clock.Sleep(ctx, d) }
