// Package cache keeps the node agent's copy of whereabouts' pools and
// reservations: what an informer last delivered, and what the agent's own
// writes answered. It serves shim's reads from the watch cache (a pool to
// choose addresses on, to look for earlier sandboxes in) without a request,
// and every other read and every write goes to the API server as before.
//
// A copy may be behind, and it is not one snapshot (a relist delivers the
// pools by name, not in the order of their writes): that is safe because
// nothing is decided from it alone. A pool write tests the resourceVersion
// the copy had, and fails (422) if it was stale, after which the writer
// reads fresh; a reservation seen here is only a hint to skip an address;
// "nothing to release" and "no reservation" are read from the API server,
// and so is the list of pools a reservation is judged on. Objects are
// shared, never copied per request: callers must not change them.
package cache

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/harvester/harvester-ipam/shim"
)

type key struct{ namespace, name string }

// Objects is the agent's copy. The zero value is not usable: call New.
type Objects struct {
	mu           sync.RWMutex
	pools        map[key]*shim.Pool
	reservations map[key]*shim.Reservation
	// listed are the namespaces whose pools an informer has listed.
	listed map[string]bool
	// watched is, by namespace, the newest resourceVersion of a pool that an
	// informer delivered (never the agent's own writes' answers): a watch
	// delivers in the order of the writes, so every pool written before it
	// is in the copy. advanced is closed (and replaced) when one grows.
	watched  map[string]uint64
	advanced chan struct{}
	// informers are, by informer ("namespace/resource"), how many watches
	// it opened and, while its copy may not follow, why.
	informers map[string]*informerState
}

// informerState is what an informer's watches say of its copy.
type informerState struct {
	// watches counts the watches it opened; each is known by its count.
	watches uint64
	// broken, when set, is why its copy may not follow the cluster.
	broken *breakage
}

// breakage is a failure of an informer's watch or list that nothing has
// made up for yet.
type breakage struct {
	err   error
	since time.Time
	// watch is the last watch opened when it failed: only a later one that
	// delivers proves the copy follows again.
	watch uint64
}

// New is an empty copy.
func New() *Objects {
	return &Objects{pools: map[key]*shim.Pool{}, reservations: map[key]*shim.Reservation{}, listed: map[string]bool{},
		watched: map[string]uint64{}, advanced: make(chan struct{}), informers: map[string]*informerState{}}
}

// Following says why the copy may no longer follow the cluster (nil when it
// does): an informer's list or watch failed (an API server restarting, a
// watch refused while its authorizer warms up, a 410, a 429) and since then
// it has neither listed again nor had a new watch deliver. The agent
// declines meanwhile; the plugin works alone.
//
// client-go's reflector comes back from a failure in one of two ways
// (v0.34.1, tools/cache/reflector.go: Reflector.watch, isWatchErrorRetriable):
// it lists again (an error in the stream but a 429; a watch refused other
// than by a 429 or a refused connection; a watch that ended at once), or it
// watches again from the last resourceVersion it saw, without a list (a 429
// in the stream or at the watch's start, a refused connection). A watch the
// API server accepts from that resourceVersion delivers every write since,
// in order (one that is too old is answered by a 410 first, and the reflector
// lists): so its first event or bookmark shows that the copy follows again.
// Until it delivers, the copy does not (a quiet namespace's bookmark comes
// within about a minute; a write of a pool, the plugin's own included, at
// once). A list's objects and a watch's events reach the copy a moment
// after they are seen here (the informer's queue): what must see a given
// write waits for it with Follows.
func (o *Objects) Following() error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	var which []string
	for k, st := range o.informers {
		if st.broken != nil {
			which = append(which, k)
		}
	}
	if len(which) == 0 {
		return nil
	}
	sort.Strings(which)
	b := o.informers[which[0]].broken
	return fmt.Errorf("the watch of %s failed %s ago (%v) and has neither listed again nor had a new watch deliver",
		which[0], time.Now().Sub(b.since).Round(time.Second), b.err)
}

func (o *Objects) informer(namespace, resource string) *informerState {
	k := namespace + "/" + resource
	st := o.informers[k]
	if st == nil {
		st = &informerState{}
		o.informers[k] = st
	}
	return st
}

// watchOpening records that the informer of resource in namespace opens a
// watch, and returns the watch's number.
func (o *Objects) watchOpening(namespace, resource string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.informer(namespace, resource)
	st.watches++
	return st.watches
}

// failed records that the informer of resource in namespace failed with
// err, its last watch opened being number watch: its copy no longer
// follows, until it lists or a later watch delivers.
func (o *Objects) failed(namespace, resource string, watch uint64, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.informer(namespace, resource)
	if st.broken == nil {
		st.broken = &breakage{since: time.Now()}
	}
	st.broken.err = err
	st.broken.watch = max(st.broken.watch, watch)
}

// delivered records that watch number watch of the informer of resource in
// namespace delivered an event or a bookmark: a watch opened after the last
// failure that delivers follows the cluster.
func (o *Objects) delivered(namespace, resource string, watch uint64) {
	// Every event comes here: most find nothing to clear, under the read
	// lock.
	o.mu.RLock()
	st := o.informers[namespace+"/"+resource]
	clears := st != nil && st.broken != nil && watch > st.broken.watch
	o.mu.RUnlock()
	if !clears {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if st.broken != nil && watch > st.broken.watch {
		st.broken = nil
	}
}

// relisted records that the informer of resource in namespace listed.
func (o *Objects) relisted(namespace, resource string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.informer(namespace, resource).broken = nil
}

// lastWatch is the number of the last watch the informer of resource in
// namespace opened.
func (o *Objects) lastWatch(namespace, resource string) uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if st := o.informers[namespace+"/"+resource]; st != nil {
		return st.watches
	}
	return 0
}

// WatchedPool records that an informer delivered a pool of namespace at
// resourceVersion rv (an add, an update, a deletion, or a list's object).
func (o *Objects) WatchedPool(namespace, rv string) {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n > o.watched[namespace] {
		o.watched[namespace] = n
		close(o.advanced)
		o.advanced = make(chan struct{})
	}
}

// Follows says whether the copy holds every pool of namespace that existed
// when a pool of it was written at resourceVersion rv: its informer has
// listed and delivered a pool event at rv or later. A resourceVersion that
// is not a number follows nothing.
func (o *Objects) Follows(namespace, rv string) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.follows(namespace, rv)
}

func (o *Objects) follows(namespace, rv string) bool {
	n, err := strconv.ParseUint(rv, 10, 64)
	return err == nil && o.listed[namespace] && o.watched[namespace] >= n
}

// WaitFollows is Follows, waiting until it holds or ctx ends: the informer
// delivers the agent's own write a moment after its answer.
func (o *Objects) WaitFollows(ctx context.Context, namespace, rv string) bool {
	for {
		o.mu.RLock()
		ok, advanced := o.follows(namespace, rv), o.advanced
		o.mu.RUnlock()
		if ok {
			return true
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return o.Follows(namespace, rv)
		}
	}
}

// Pools are the pools of a namespace as last seen, by name, and whether an
// informer has listed them: until then, a pool may exist that the copy does
// not hold.
func (o *Objects) Pools(namespace string) ([]*shim.Pool, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	var out []*shim.Pool
	for k, p := range o.pools {
		if k.namespace == namespace {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, o.listed[namespace]
}

// Listed records that an informer has listed the pools of namespace.
func (o *Objects) Listed(namespace string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.listed[namespace] = true
}

// Pool is the pool as last seen; nil when none was.
func (o *Objects) Pool(namespace, name string) *shim.Pool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.pools[key{namespace, name}]
}

// Reservation is the reservation as last seen; nil when none was.
func (o *Objects) Reservation(namespace, name string) *shim.Reservation {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.reservations[key{namespace, name}]
}

// Len counts the pools and reservations held.
func (o *Objects) Len() (pools, reservations int) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return len(o.pools), len(o.reservations)
}

// SawPool keeps p unless a newer version of it is held: an informer's event
// may arrive after the answer to the agent's own later write.
func (o *Objects) SawPool(p *shim.Pool) {
	if p == nil {
		return
	}
	k := key{p.Namespace, p.Name}
	o.mu.Lock()
	defer o.mu.Unlock()
	if have := o.pools[k]; have == nil || !newer(have.ResourceVersion, p.ResourceVersion) {
		o.pools[k] = p
	}
}

// GonePool forgets a pool deleted at resourceVersion rv ("" when unknown),
// unless what is held is newer.
func (o *Objects) GonePool(namespace, name, rv string) {
	k := key{namespace, name}
	o.mu.Lock()
	defer o.mu.Unlock()
	if have := o.pools[k]; have != nil && (rv == "" || !newer(have.ResourceVersion, rv)) {
		delete(o.pools, k)
	}
}

// SawReservation keeps r unless a newer version of it is held.
func (o *Objects) SawReservation(r *shim.Reservation) {
	if r == nil {
		return
	}
	k := key{r.Namespace, r.Name}
	o.mu.Lock()
	defer o.mu.Unlock()
	if have := o.reservations[k]; have == nil || !newer(have.ResourceVersion, r.ResourceVersion) {
		o.reservations[k] = r
	}
}

// GoneReservation forgets a reservation deleted at rv ("" when unknown).
func (o *Objects) GoneReservation(namespace, name, rv string) {
	k := key{namespace, name}
	o.mu.Lock()
	defer o.mu.Unlock()
	if have := o.reservations[k]; have != nil && (rv == "" || !newer(have.ResourceVersion, rv)) {
		delete(o.reservations, k)
	}
}

// newer says whether resourceVersion a is newer than b. Kubernetes names
// them as etcd revisions, which grow; when either is not a number, nothing
// is known and the incoming one (b) wins: a stale copy costs one conflict.
func newer(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// API is a shim.API whose reads from the watch cache are served from the
// copy when it holds the pool, and whose writes' answers update the copy.
type API struct {
	shim.API
	Objects *Objects
}

var (
	_ shim.API   = API{}
	_ shim.Local = API{}
)

// LocalPool is the pool as the copy holds it (shim.Local).
func (a API) LocalPool(namespace, name string) *shim.Pool { return a.Objects.Pool(namespace, name) }

// LocalReservation is the reservation as the copy holds it (shim.Local).
func (a API) LocalReservation(namespace, name string) *shim.Reservation {
	return a.Objects.Reservation(namespace, name)
}

// GetPool serves a read from the watch cache from the copy.
func (a API) GetPool(ctx context.Context, namespace, name string, from shim.Source) (*shim.Pool, error) {
	if from == shim.Cache {
		if p := a.Objects.Pool(namespace, name); p != nil {
			return p, nil
		}
	}
	p, err := a.API.GetPool(ctx, namespace, name, from)
	switch {
	case err == nil && from == shim.Fresh:
		a.Objects.SawPool(p)
	case shim.IsGone(err) && from == shim.Fresh:
		// Deleted, and the informer has not said so yet: no read from
		// the copy serves it again.
		a.Objects.GonePool(namespace, name, "")
	}
	return p, err
}

func (a API) PatchPool(ctx context.Context, namespace, name string, patch shim.Patch) (*shim.Pool, error) {
	p, err := a.API.PatchPool(ctx, namespace, name, patch)
	if err == nil {
		a.Objects.SawPool(p)
	}
	return p, err
}

func (a API) CreatePool(ctx context.Context, namespace string, pool *shim.Pool) (*shim.Pool, error) {
	p, err := a.API.CreatePool(ctx, namespace, pool)
	if err == nil {
		a.Objects.SawPool(p)
	}
	return p, err
}

func (a API) DeletePool(ctx context.Context, namespace, name string, pre shim.Preconditions) error {
	err := a.API.DeletePool(ctx, namespace, name, pre)
	if err == nil {
		a.Objects.GonePool(namespace, name, pre.ResourceVersion)
	}
	return err
}

func (a API) CreateReservation(ctx context.Context, namespace string, o *shim.Reservation) (*shim.Reservation, error) {
	r, err := a.API.CreateReservation(ctx, namespace, o)
	if err == nil {
		a.Objects.SawReservation(r)
	}
	return r, err
}

func (a API) PatchReservation(ctx context.Context, namespace, name string, patch shim.Patch) (*shim.Reservation, error) {
	r, err := a.API.PatchReservation(ctx, namespace, name, patch)
	if err == nil {
		a.Objects.SawReservation(r)
	}
	return r, err
}

func (a API) DeleteReservation(ctx context.Context, namespace, name string, pre shim.Preconditions) error {
	err := a.API.DeleteReservation(ctx, namespace, name, pre)
	if err == nil {
		a.Objects.GoneReservation(namespace, name, pre.ResourceVersion)
	}
	return err
}
