package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pool and Reservation are whereabouts' objects: an IPPool, and an
// OverlappingRangeIPReservation (ORIP).
type (
	Pool        = whereaboutsv1alpha1.IPPool
	Reservation = whereaboutsv1alpha1.OverlappingRangeIPReservation
	Lease       = coordinationv1.Lease
)

// API is all harvester-ipam asks of the Kubernetes API server: whereabouts'
// pools and reservations, and the Lease whereabouts serialises on. Errors are
// the API server's, told apart with k8s.io/apimachinery/pkg/api/errors. The
// Kubernetes implementation is NewKubeAPI; shim/fake has one in memory, for
// tests and the simulation. Nothing else in harvester-ipam reaches these
// objects: Store is the only caller.
type API interface {
	// GetPool reads a pool; from Cache it may lag behind what was written.
	GetPool(ctx context.Context, namespace, name string, from Source) (*Pool, error)
	ListPools(ctx context.Context, namespace string, page Page) ([]Pool, string, error)
	// PatchPool applies a guarded JSON patch: it fails with 422 when the pool
	// changed since the resourceVersion the patch tests.
	PatchPool(ctx context.Context, namespace, name string, patch Patch) (*Pool, error)
	// CreatePool creates a pool: AlreadyExists when one has its name.
	CreatePool(ctx context.Context, namespace string, pool *Pool) (*Pool, error)
	// DeletePool deletes only the pool the preconditions name: 409 when its
	// UID or resourceVersion differ.
	DeletePool(ctx context.Context, namespace, name string, pre Preconditions) error

	GetReservation(ctx context.Context, namespace, name string) (*Reservation, error)
	ListReservations(ctx context.Context, namespace string, page Page) ([]Reservation, string, error)
	PatchReservation(ctx context.Context, namespace, name string, patch Patch) (*Reservation, error)
	// CreateReservation creates a reservation: AlreadyExists when one has
	// its name (the address is reserved).
	CreateReservation(ctx context.Context, namespace string, o *Reservation) (*Reservation, error)
	// DeleteReservation deletes only the object the preconditions name: 409
	// when its UID or resourceVersion differ.
	DeleteReservation(ctx context.Context, namespace, name string, pre Preconditions) error

	GetLease(ctx context.Context, namespace, name string) (*Lease, error)
	CreateLease(ctx context.Context, lease *Lease) (*Lease, error)
	// UpdateLease writes lease if its resourceVersion is current: 409 otherwise.
	UpdateLease(ctx context.Context, lease *Lease) (*Lease, error)
}

// Source says where a read is served from.
type Source int

const (
	// Fresh is a quorum read: what etcd holds now.
	Fresh Source = iota
	// Cache is the API server's watch cache (resourceVersion "0"): cheap, and
	// possibly behind. Good for deciding whether to look fresh, never for
	// deciding what to write.
	Cache
)

// Page is one request of a paged LIST.
type Page struct {
	Limit    int64
	Continue string
	// NotOlderThan, when set (first page only), asks for a list at least
	// as new as that resourceVersion, one of the caller's own writes to the
	// resource: the API server's watch cache answers it as soon as it has
	// seen that write, where a list with none waits until the cache has
	// caught up with etcd's latest revision (a progress notification, about
	// 80 ms, when the latest write was to another resource).
	NotOlderThan string
}

// Preconditions name the very object a delete may remove.
type Preconditions struct {
	UID             types.UID
	ResourceVersion string
}

// Patch is a JSON patch (RFC 6902) whose first operation tests the object's
// resourceVersion: the only kind of write harvester-ipam makes to a pool or a
// reservation. It is made by Guarded, so no unguarded patch can exist.
type Patch struct {
	ops []PatchOp
}

// PatchOp is one JSON patch operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Guarded is a patch of ops that applies only to resourceVersion rv.
func Guarded(rv string, ops ...PatchOp) Patch {
	return Patch{ops: append([]PatchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: rv}}, ops...)}
}

// Ops are the patch's operations, the resourceVersion test first.
func (p Patch) Ops() []PatchOp { return p.ops }

// ResourceVersion is the version the patch applies to.
func (p Patch) ResourceVersion() string {
	if len(p.ops) == 0 {
		return ""
	}
	rv, _ := p.ops[0].Value.(string)
	return rv
}

// MarshalJSON is the patch as the API server takes it.
func (p Patch) MarshalJSON() ([]byte, error) { return json.Marshal(p.ops) }

// Removals counts the patch's remove operations.
func (p Patch) Removals() int {
	n := 0
	for _, op := range p.ops {
		if op.Op == "remove" {
			n++
		}
	}
	return n
}

// removeAllocations removes offsets from a pool's spec.allocations.
func removeAllocations(rv string, offsets []string) Patch {
	ops := make([]PatchOp, 0, len(offsets))
	for _, off := range offsets {
		ops = append(ops, PatchOp{Op: "remove", Path: "/spec/allocations/" + escapePointer(off)})
	}
	return Guarded(rv, ops...)
}

// setAnnotation sets key to value in an object's annotations (have), or
// removes it when value is "".
func setAnnotation(rv string, have map[string]string, key, value string) Patch {
	switch {
	case value == "":
		return Guarded(rv, PatchOp{Op: "remove", Path: "/metadata/annotations/" + escapePointer(key)})
	case len(have) == 0:
		// The API server drops an empty map: there is no object to add to.
		return Guarded(rv, PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{key: value}})
	default:
		return Guarded(rv, PatchOp{Op: "add", Path: "/metadata/annotations/" + escapePointer(key), Value: value})
	}
}

// escapePointer escapes a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// ListAll reads every page of a paged LIST, limit items a page: the one
// paging loop of harvester-ipam, for the reconciler's pods and nodes as for
// pools and reservations.
func ListAll[T any](ctx context.Context, limit int64, list func(context.Context, Page) ([]T, string, error)) ([]T, error) {
	return listAll(ctx, Page{Limit: limit}, list)
}

func listAll[T any](ctx context.Context, page Page, list func(context.Context, Page) ([]T, string, error)) ([]T, error) {
	var out []T
	for {
		items, next, err := list(ctx, page)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		if next == page.Continue {
			return nil, fmt.Errorf("list did not advance past continue token %q", next)
		}
		page.Continue, page.NotOlderThan = next, ""
	}
}

// PoolList and ReservationList are whereabouts' lists, as informers take them.
type (
	PoolList        = whereaboutsv1alpha1.IPPoolList
	ReservationList = whereaboutsv1alpha1.OverlappingRangeIPReservationList
)
