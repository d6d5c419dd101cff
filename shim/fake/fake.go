// Package fake is an in-memory API server for shim.API with the semantics
// harvester-ipam relies on: resourceVersions and UIDs, fresh reads and a
// watch cache that may lag, paged lists, JSON patches whose test operation
// fails with 422, deletes with preconditions that fail with 409, Leases
// updated only at their current resourceVersion, and the API server's limits
// (10,000 operations a patch, 256 KiB of annotations). Tests and the
// simulation reach in with Hook, and write as whereabouts does with the
// methods beyond shim.API.
package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"

	jsonpatch "github.com/evanphx/json-patch"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/harvester/harvester-ipam/shim"
)

// The resources, as the API server names them.
const (
	Pools        = "ippools"
	Reservations = "overlappingrangeipreservations"
	Leases       = "leases"
)

var groups = map[string]schema.GroupResource{
	Pools:        {Group: "whereabouts.cni.cncf.io", Resource: Pools},
	Reservations: {Group: "whereabouts.cni.cncf.io", Resource: Reservations},
	Leases:       {Group: "coordination.k8s.io", Resource: Leases},
}

// Call is one request, as Hook sees it.
type Call struct {
	Verb      string // get, list, create, update, patch, delete
	Resource  string // Pools, Reservations, Leases
	Namespace string
	Name      string
	From      shim.Source // for get
	Patch     shim.Patch  // for patch
	// LoseResponse, set by Hook, applies the request and then fails it as a
	// timeout does: the caller cannot tell that it happened.
	LoseResponse bool
	// Ctx is the request's context (the server itself ignores it: Hook may
	// fail a request whose context ended, as a client would).
	Ctx context.Context
}

// Change is one write as a watch delivers it: the object as stored (nil when
// deleted), and as it was before (nil when new). The objects are the
// server's own: never change them.
type Change struct {
	Resource, Namespace, Name string
	Rev                       int
	Object, Previous          any
}

// API is the in-memory server. The zero value is not usable: call New.
type API struct {
	// Hook, when set, runs before every request, outside the server's lock
	// (it may change the objects): an error fails the request unapplied.
	Hook func(c *Call) error
	// CacheLag, when set, is how many revisions behind the latest a read
	// from the watch cache is served; zero serves the latest.
	CacheLag func() int
	// StaleRead, when set, is told of every read from the watch cache that
	// served an older revision than the latest (under the server's lock: it
	// must not make requests).
	StaleRead func(c Call)
	// OnChange, when set, is told of every change, in the order of the
	// resourceVersions (under the server's lock: it must not make requests).
	OnChange func(c Change)
	// PruneIfName stores pools and reservations as the API server does with
	// whereabouts v0.7.0's CRDs, which know no ifname: an entry's ifname
	// and a reservation's are dropped.
	PruneIfName bool

	mu      sync.Mutex
	rev     int
	uids    int
	objects map[key]*entry
}

type key struct{ resource, namespace, name string }

// entry is an object's history, newest last; a nil object is its deletion.
type entry struct {
	revs []revision
}

type revision struct {
	rev int
	obj any // *shim.Pool, *shim.Reservation, *shim.Lease, or nil
}

// New is an empty server.
func New() *API { return &API{objects: map[key]*entry{}} }

func (a *API) hook(c *Call) error {
	if a.Hook == nil {
		return nil
	}
	return a.Hook(c)
}

// lost is the error of a request whose response never came back.
func lost(c *Call) error {
	return apierrors.NewTimeoutError(fmt.Sprintf("%s %s %s/%s: the response was lost", c.Verb, c.Resource, c.Namespace, c.Name), 0)
}

// current is the latest object at k, nil when there is none.
func (a *API) current(k key) any {
	e := a.objects[k]
	if e == nil || len(e.revs) == 0 {
		return nil
	}
	return e.revs[len(e.revs)-1].obj
}

// cached is the object at k as a watch cache lagging lag revisions sees it.
func (a *API) cached(k key, lag int) any {
	e := a.objects[k]
	if e == nil {
		return nil
	}
	upTo := a.rev - lag
	for i := len(e.revs) - 1; i >= 0; i-- {
		if e.revs[i].rev <= upTo {
			return e.revs[i].obj
		}
	}
	return nil
}

// put stores obj as the newest state at k (nil: deleted) and returns, as
// the caller's type, a copy of what was stored: what the API server answers.
func put[T any](a *API, k key, obj T) T {
	stored := a.store(k, any(obj))
	if stored == nil {
		var zero T
		return zero
	}
	return any(roundTrip(stored)).(T)
}

func (a *API) store(k key, obj any) any {
	if obj != nil {
		obj = roundTrip(obj)
		if a.PruneIfName {
			pruneIfName(obj)
		}
	}
	e := a.objects[k]
	if e == nil {
		e = &entry{}
		a.objects[k] = e
	}
	if a.OnChange != nil {
		var prev any
		if len(e.revs) > 0 {
			prev = e.revs[len(e.revs)-1].obj
		}
		if obj != nil || prev != nil {
			a.OnChange(Change{Resource: k.resource, Namespace: k.namespace, Name: k.name, Rev: a.rev, Object: obj, Previous: prev})
		}
	}
	e.revs = append(e.revs, revision{rev: a.rev, obj: obj})
	// A short history is all a lagging cache needs.
	if len(e.revs) > 64 {
		e.revs = append([]revision(nil), e.revs[len(e.revs)-32:]...)
	}
	return obj
}

// roundTrip stores an object as the API server does: what JSON cannot tell
// apart (an empty map of an omitempty field, and none) is not told apart.
func roundTrip(obj any) any {
	switch o := obj.(type) {
	case *shim.Pool:
		c := o.DeepCopy()
		normalize(&c.ObjectMeta)
		return c
	case *shim.Reservation:
		c := o.DeepCopy()
		normalize(&c.ObjectMeta)
		return c
	case *shim.Lease:
		c := o.DeepCopy()
		normalize(&c.ObjectMeta)
		return c
	}
	panic(fmt.Sprintf("fake: cannot store a %T", obj))
}

// pruneIfName drops what whereabouts v0.7.0's CRDs do not know.
func pruneIfName(obj any) {
	switch o := obj.(type) {
	case *shim.Pool:
		for off, e := range o.Spec.Allocations {
			if e.IfName != "" {
				e.IfName = ""
				o.Spec.Allocations[off] = e
			}
		}
	case *shim.Reservation:
		o.Spec.IfName = ""
	}
}

func normalize(m *metav1.ObjectMeta) {
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	if len(m.Labels) == 0 {
		m.Labels = nil
	}
}

func notFound(k key) error { return apierrors.NewNotFound(groups[k.resource], k.name) }

func conflict(k key, msg string) error {
	return apierrors.NewConflict(groups[k.resource], k.name, fmt.Errorf("%s", msg))
}

func invalid(k key, msg string) error {
	gk := schema.GroupKind{Group: groups[k.resource].Group, Kind: k.resource}
	return apierrors.NewInvalid(gk, k.name, field.ErrorList{field.Invalid(field.NewPath("patch"), nil, msg)})
}

// stamp gives an object its next resourceVersion (and, when new, a UID).
func (a *API) stamp(meta metaObject, isNew bool) {
	a.rev++
	meta.SetResourceVersion(strconv.Itoa(a.rev))
	if isNew {
		a.uids++
		meta.SetUID(types.UID(fmt.Sprintf("uid-%d", a.uids)))
	}
}

type metaObject interface {
	SetResourceVersion(string)
	GetResourceVersion() string
	SetUID(types.UID)
	GetUID() types.UID
	GetAnnotations() map[string]string
}

// do runs one request: the hook, then apply under the lock.
func (a *API) do(c Call, apply func() error) error {
	if err := a.hook(&c); err != nil {
		return err
	}
	a.mu.Lock()
	err := apply()
	a.mu.Unlock()
	if err == nil && c.LoseResponse {
		return lost(&c)
	}
	return err
}

// ---- pools

func (a *API) GetPool(ctx context.Context, ns, name string, from shim.Source) (*shim.Pool, error) {
	var out *shim.Pool
	k := key{Pools, ns, name}
	err := a.do(Call{Ctx: ctx, Verb: "get", Resource: Pools, Namespace: ns, Name: name, From: from}, func() error {
		obj := a.current(k)
		if from == shim.Cache && a.CacheLag != nil {
			obj = a.cached(k, a.CacheLag())
			if obj != a.current(k) && a.StaleRead != nil {
				a.StaleRead(Call{Verb: "get", Resource: Pools, Namespace: ns, Name: name, From: from})
			}
		}
		if obj == nil {
			return notFound(k)
		}
		out = obj.(*shim.Pool).DeepCopy()
		return nil
	})
	return out, err
}

func (a *API) ListPools(ctx context.Context, ns string, page shim.Page) ([]shim.Pool, string, error) {
	var out []shim.Pool
	var next string
	err := a.do(Call{Ctx: ctx, Verb: "list", Resource: Pools, Namespace: ns}, func() error {
		objs, cont := a.list(Pools, ns, page)
		for _, o := range objs {
			out = append(out, *o.(*shim.Pool).DeepCopy())
		}
		next = cont
		return nil
	})
	return out, next, err
}

// list is one page of the objects of a resource in ns, by name.
func (a *API) list(resource, ns string, page shim.Page) ([]any, string) {
	var names []string
	for k := range a.objects {
		if k.resource == resource && k.namespace == ns && a.current(k) != nil && k.name > page.Continue {
			names = append(names, k.name)
		}
	}
	sort.Strings(names)
	next := ""
	if page.Limit > 0 && int64(len(names)) > page.Limit {
		names = names[:page.Limit]
		next = names[len(names)-1]
	}
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = a.current(key{resource, ns, n})
	}
	return out, next
}

// maxPatchOps is the API server's limit on the operations of a JSON patch.
const maxPatchOps = 10000

// maxAnnotations is the API server's limit on an object's annotations.
const maxAnnotations = 256 * 1024

func (a *API) PatchPool(ctx context.Context, ns, name string, patch shim.Patch) (*shim.Pool, error) {
	var out *shim.Pool
	k := key{Pools, ns, name}
	err := a.do(Call{Ctx: ctx, Verb: "patch", Resource: Pools, Namespace: ns, Name: name, Patch: patch}, func() error {
		cur, _ := a.current(k).(*shim.Pool)
		if cur == nil {
			return notFound(k)
		}
		next := &shim.Pool{}
		if err := applyPatch(k, cur, patch, next); err != nil {
			return err
		}
		a.stamp(next, false)
		out = put(a, k, next)
		return nil
	})
	return out, err
}

// applyPatch applies a JSON patch to cur into next, as the API server does.
func applyPatch(k key, cur any, patch shim.Patch, next any) error {
	if len(patch.Ops()) > maxPatchOps {
		return invalid(k, fmt.Sprintf("the allowed maximum operations in a JSON patch is %d, got %d", maxPatchOps, len(patch.Ops())))
	}
	doc, err := json.Marshal(cur)
	if err != nil {
		return err
	}
	body, err := patch.MarshalJSON()
	if err != nil {
		return err
	}
	p, err := jsonpatch.DecodePatch(body)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	patched, err := p.Apply(doc)
	if err != nil {
		return invalid(k, err.Error())
	}
	if err := json.Unmarshal(patched, next); err != nil {
		return invalid(k, err.Error())
	}
	if m, ok := next.(metaObject); ok {
		size := 0
		for key, v := range m.GetAnnotations() {
			size += len(key) + len(v)
		}
		if size > maxAnnotations {
			return invalid(k, fmt.Sprintf("metadata.annotations: Too long: must have at most %d bytes", maxAnnotations))
		}
	}
	return nil
}

func (a *API) DeletePool(ctx context.Context, ns, name string, pre shim.Preconditions) error {
	k := key{Pools, ns, name}
	return a.do(Call{Ctx: ctx, Verb: "delete", Resource: Pools, Namespace: ns, Name: name}, func() error {
		cur, _ := a.current(k).(*shim.Pool)
		if cur == nil {
			return notFound(k)
		}
		return a.deleteAt(k, cur, pre)
	})
}

// deleteAt deletes the object at k, cur, if the preconditions hold, as the
// API server does: 409 when they name another object or another version.
func (a *API) deleteAt(k key, cur metaObject, pre shim.Preconditions) error {
	if pre.UID != "" && pre.UID != cur.GetUID() {
		return conflict(k, fmt.Sprintf("Precondition failed: UID in precondition: %s, UID in object meta: %s", pre.UID, cur.GetUID()))
	}
	if pre.ResourceVersion != "" && pre.ResourceVersion != cur.GetResourceVersion() {
		return conflict(k, fmt.Sprintf("Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s", pre.ResourceVersion, cur.GetResourceVersion()))
	}
	a.rev++
	a.store(k, nil)
	return nil
}

// CreatePool creates a pool, as whereabouts does on its first ADD in a range.
func (a *API) CreatePool(ctx context.Context, ns string, p *shim.Pool) (*shim.Pool, error) {
	var out *shim.Pool
	k := key{Pools, ns, p.Name}
	err := a.do(Call{Ctx: ctx, Verb: "create", Resource: Pools, Namespace: ns, Name: p.Name}, func() error {
		if a.current(k) != nil {
			return apierrors.NewAlreadyExists(groups[Pools], p.Name)
		}
		obj := p.DeepCopy()
		obj.Namespace = ns
		a.stamp(obj, true)
		out = put(a, k, obj)
		return nil
	})
	return out, err
}

// UpdatePool writes a pool at its resourceVersion: 409 when it changed.
func (a *API) UpdatePool(ns string, p *shim.Pool) (*shim.Pool, error) {
	var out *shim.Pool
	k := key{Pools, ns, p.Name}
	err := a.do(Call{Verb: "update", Resource: Pools, Namespace: ns, Name: p.Name}, func() error {
		cur, _ := a.current(k).(*shim.Pool)
		if cur == nil {
			return notFound(k)
		}
		if cur.ResourceVersion != p.ResourceVersion {
			return conflict(k, "the object has been modified")
		}
		obj := p.DeepCopy()
		obj.UID = cur.UID
		a.stamp(obj, false)
		out = put(a, k, obj)
		return nil
	})
	return out, err
}

// ---- reservations

func (a *API) GetReservation(ctx context.Context, ns, name string) (*shim.Reservation, error) {
	var out *shim.Reservation
	k := key{Reservations, ns, name}
	err := a.do(Call{Ctx: ctx, Verb: "get", Resource: Reservations, Namespace: ns, Name: name}, func() error {
		o, _ := a.current(k).(*shim.Reservation)
		if o == nil {
			return notFound(k)
		}
		out = o.DeepCopy()
		return nil
	})
	return out, err
}

func (a *API) ListReservations(ctx context.Context, ns string, page shim.Page) ([]shim.Reservation, string, error) {
	var out []shim.Reservation
	var next string
	err := a.do(Call{Ctx: ctx, Verb: "list", Resource: Reservations, Namespace: ns}, func() error {
		objs, cont := a.list(Reservations, ns, page)
		for _, o := range objs {
			out = append(out, *o.(*shim.Reservation).DeepCopy())
		}
		next = cont
		return nil
	})
	return out, next, err
}

func (a *API) PatchReservation(ctx context.Context, ns, name string, patch shim.Patch) (*shim.Reservation, error) {
	var out *shim.Reservation
	k := key{Reservations, ns, name}
	err := a.do(Call{Ctx: ctx, Verb: "patch", Resource: Reservations, Namespace: ns, Name: name, Patch: patch}, func() error {
		cur, _ := a.current(k).(*shim.Reservation)
		if cur == nil {
			return notFound(k)
		}
		next := &shim.Reservation{}
		if err := applyPatch(k, cur, patch, next); err != nil {
			return err
		}
		a.stamp(next, false)
		out = put(a, k, next)
		return nil
	})
	return out, err
}

func (a *API) DeleteReservation(ctx context.Context, ns, name string, pre shim.Preconditions) error {
	k := key{Reservations, ns, name}
	return a.do(Call{Ctx: ctx, Verb: "delete", Resource: Reservations, Namespace: ns, Name: name}, func() error {
		cur, _ := a.current(k).(*shim.Reservation)
		if cur == nil {
			return notFound(k)
		}
		return a.deleteAt(k, cur, pre)
	})
}

// CreateReservation creates a reservation, as whereabouts does.
func (a *API) CreateReservation(ctx context.Context, ns string, o *shim.Reservation) (*shim.Reservation, error) {
	var out *shim.Reservation
	k := key{Reservations, ns, o.Name}
	err := a.do(Call{Ctx: ctx, Verb: "create", Resource: Reservations, Namespace: ns, Name: o.Name}, func() error {
		if a.current(k) != nil {
			return apierrors.NewAlreadyExists(groups[Reservations], o.Name)
		}
		obj := o.DeepCopy()
		obj.Namespace = ns
		a.stamp(obj, true)
		out = put(a, k, obj)
		return nil
	})
	return out, err
}

// ---- leases

func (a *API) GetLease(ctx context.Context, ns, name string) (*shim.Lease, error) {
	var out *shim.Lease
	k := key{Leases, ns, name}
	err := a.do(Call{Ctx: ctx, Verb: "get", Resource: Leases, Namespace: ns, Name: name}, func() error {
		l, _ := a.current(k).(*shim.Lease)
		if l == nil {
			return notFound(k)
		}
		out = l.DeepCopy()
		return nil
	})
	return out, err
}

func (a *API) CreateLease(ctx context.Context, l *shim.Lease) (*shim.Lease, error) {
	var out *shim.Lease
	k := key{Leases, l.Namespace, l.Name}
	err := a.do(Call{Ctx: ctx, Verb: "create", Resource: Leases, Namespace: l.Namespace, Name: l.Name}, func() error {
		if a.current(k) != nil {
			return apierrors.NewAlreadyExists(groups[Leases], l.Name)
		}
		obj := l.DeepCopy()
		a.stamp(obj, true)
		out = put(a, k, obj)
		return nil
	})
	return out, err
}

func (a *API) UpdateLease(ctx context.Context, l *shim.Lease) (*shim.Lease, error) {
	var out *shim.Lease
	k := key{Leases, l.Namespace, l.Name}
	err := a.do(Call{Ctx: ctx, Verb: "update", Resource: Leases, Namespace: l.Namespace, Name: l.Name}, func() error {
		cur, _ := a.current(k).(*shim.Lease)
		if cur == nil {
			return notFound(k)
		}
		if cur.ResourceVersion != l.ResourceVersion {
			return conflict(k, "the object has been modified; please apply your changes to the latest version and try again")
		}
		obj := l.DeepCopy()
		obj.UID = cur.UID
		a.stamp(obj, false)
		out = put(a, k, obj)
		return nil
	})
	return out, err
}

// ---- direct access, for tests and the simulation's checker: no hook.

// Pool is a pool as it is now; nil when there is none.
func (a *API) Pool(ns, name string) *shim.Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, _ := a.current(key{Pools, ns, name}).(*shim.Pool)
	if p == nil {
		return nil
	}
	return p.DeepCopy()
}

// AllPools are the pools of ns as they are now, by name.
func (a *API) AllPools(ns string) []shim.Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	objs, _ := a.list(Pools, ns, shim.Page{})
	out := make([]shim.Pool, len(objs))
	for i, o := range objs {
		out[i] = *o.(*shim.Pool).DeepCopy()
	}
	return out
}

// AllReservations are the reservations of ns as they are now, by name.
func (a *API) AllReservations(ns string) []shim.Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	objs, _ := a.list(Reservations, ns, shim.Page{})
	out := make([]shim.Reservation, len(objs))
	for i, o := range objs {
		out[i] = *o.(*shim.Reservation).DeepCopy()
	}
	return out
}

// View lets see reads the pools and reservations of ns as they are now,
// without copies: see must not change them, nor keep them.
func (a *API) View(ns string, see func(pools []*shim.Pool, reservations map[string]*shim.Reservation)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var pools []*shim.Pool
	res := map[string]*shim.Reservation{}
	for k, e := range a.objects {
		if k.namespace != ns || len(e.revs) == 0 {
			continue
		}
		switch o := e.revs[len(e.revs)-1].obj.(type) {
		case *shim.Pool:
			pools = append(pools, o)
		case *shim.Reservation:
			res[k.name] = o
		}
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Name < pools[j].Name })
	see(pools, res)
}

// ResourceVersion is an object's resourceVersion now ("" when there is none).
func (a *API) ResourceVersion(resource, ns, name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.current(key{resource, ns, name}).(metaObject); ok {
		return m.GetResourceVersion()
	}
	return ""
}

// Lease is a Lease as it is now; nil when there is none.
func (a *API) Lease(ns, name string) *shim.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, _ := a.current(key{Leases, ns, name}).(*shim.Lease)
	if l == nil {
		return nil
	}
	return l.DeepCopy()
}

// Put stores objects as they are (a *shim.Pool, *shim.Reservation or
// *shim.Lease, each with its namespace), as a test's starting state.
func (a *API) Put(objs ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, obj := range objs {
		switch o := obj.(type) {
		case *shim.Pool:
			c := o.DeepCopy()
			a.stamp(c, true)
			a.store(key{Pools, c.Namespace, c.Name}, c)
		case *shim.Reservation:
			c := o.DeepCopy()
			a.stamp(c, true)
			a.store(key{Reservations, c.Namespace, c.Name}, c)
		case *shim.Lease:
			c := o.DeepCopy()
			a.stamp(c, true)
			a.store(key{Leases, c.Namespace, c.Name}, c)
		default:
			panic(fmt.Sprintf("fake: cannot store a %T", obj))
		}
	}
}

// Remove deletes an object whatever it is, as a test or an operator would.
func (a *API) Remove(resource, ns, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.current(key{resource, ns, name}) != nil {
		a.rev++
		a.store(key{resource, ns, name}, nil)
	}
}

var _ shim.API = (*API)(nil)
