// Package shim is harvester-ipam's one way to whereabouts' IPPools and
// OverlappingRangeIPReservations (ORIPs): the plugin and the reconciler read
// and write them through Store, which holds the safety rules by construction.
// Every pool write is a patch that tests the resourceVersion of a fresh read
// (Guarded), retried a bounded number of times on 409 and 422. A release is
// planned on a fresh read (Plan) and then takes two steps, so that a crash
// between them loses nothing: ReleaseReservations (while whereabouts' Lease
// is held, delete each reservation that is still the released entry's and
// that no other entry of its pod holds, with UID and resourceVersion
// preconditions), then RemoveAllocations (remove the planned entries that are
// still what the plan saw).
package shim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/harvester/harvester-ipam/conf/names"
)

// Options tune a Store; the zero value of each field is its default.
type Options struct {
	// CallTimeout bounds each API request (10 s).
	CallTimeout time.Duration
	// Backoff bounds the retries of a conflicting write (DefaultBackoff).
	Backoff Backoff
	// Clock is what the store waits by (the wall clock).
	Clock Clock
	// Random draws the jitter of retries, in [0, 1) (math/rand).
	Random func() float64
	// Identity names this process as the holder of whereabouts' Lease
	// ("harvester-ipam/<host>/<pid>").
	Identity string
	// PageSize bounds each LIST (500).
	PageSize int64
	// LeaseSeconds is the leaseDurationSeconds of our record of whereabouts'
	// Lease (5), and LeaseRetry how often we look again at a Lease someone
	// else holds (50 ms): a model of whereabouts sets its own (1 s, 500 ms).
	LeaseSeconds int32
	LeaseRetry   time.Duration
	// Group, when set, is shared by the stores of one process (a node
	// agent's requests): their Locked calls share acquisitions of the
	// Lease, and their releases and removals that wait at one moment are
	// done together (Group). Nil: each call on its own.
	Group *Group
	// AtStep, when set, is called at the step boundaries of a release
	// ("release-after-entries": a release in one turn removed the entries
	// and has not judged the reservations yet): test builds crash there.
	AtStep func(step string)
	// Turn, when set, is called as a turn under whereabouts' Lease begins
	// (the Lease taken or, in a Group, the turn's place in its hold come)
	// with holder, the identity the Lease is held as; the func it returns
	// is called as the turn ends, before the Lease is handed back (also
	// when the turn panics). The simulation checks with it that no two
	// holders are ever inside a turn at once.
	Turn func(holder string) (end func())
}

// Store is the pools and reservations of one namespace. The stores of other
// namespaces made with In share its options and its count of retries.
type Store struct {
	api       API
	namespace string
	o         *Options
	retried   *atomic.Int64
}

// New is the store of namespace behind api.
func New(api API, namespace string, o Options) *Store {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Backoff.Steps <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.Clock == nil {
		o.Clock = RealClock{}
	}
	if o.Random == nil {
		o.Random = defaultRandom
	}
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	if o.LeaseSeconds <= 0 {
		o.LeaseSeconds = leaseSeconds
	}
	if o.LeaseRetry <= 0 {
		o.LeaseRetry = leaseRetry
	}
	return &Store{api: api, namespace: namespace, o: &o, retried: new(atomic.Int64)}
}

// In is this store on another namespace's pools: a checkpoint may name pools
// of a namespace the current kubeconfig does not.
func (s *Store) In(namespace string) *Store {
	if namespace == "" || namespace == s.namespace {
		return s
	}
	return &Store{api: s.api, namespace: namespace, o: s.o, retried: s.retried}
}

// Namespace is where the pools and reservations live.
func (s *Store) Namespace() string { return s.namespace }

// Retried counts the writes retried after a conflict (409) or a failed
// resourceVersion test (422), in this store and those made with In.
func (s *Store) Retried() int64 { return s.retried.Load() }

// Now is the store's clock's time.
func (s *Store) Now() time.Time { return s.o.Clock.Now() }

func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.o.CallTimeout)
}

// callWrite bounds a write: in a turn under the Lease by leaseCallTimeout,
// so that no write made under the Lease lands after the hold may have
// passed to another holder (a read that lands late changes nothing, and a
// large list may take longer); else, and for a write that may land late
// (mayLandLate), as call.
func (s *Store) callWrite(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Value(underLeaseKey{}) != nil && ctx.Value(lateKey{}) == nil && s.o.CallTimeout > leaseCallTimeout {
		return context.WithTimeout(ctx, leaseCallTimeout)
	}
	return context.WithTimeout(ctx, s.o.CallTimeout)
}

// lateKey marks the context of a write made in a turn under the Lease that
// may land after the hold passed to another holder.
type lateKey struct{}

// mayLandLate is ctx for the one write of a turn that is safe whenever it
// lands: a release's guarded removal of the very entries it releases
// (removeFirst), each removed only while it is what the plan saw, which the
// plugin alone makes without the Lease at all. It is bounded as outside the
// Lease: on a large pool the API server decodes, validates and stores the
// whole object at every write (10,000 entries: 1.3-1.6 s on a quiet
// machine, over 2 s on a busy one, where its bound of 2 s failed the
// agent's DELs that whereabouts alone served). The turn goes on after it
// only once the Lease is kept again (Keep: renewed in the record it last
// wrote, so nobody took it meanwhile, or lost).
func mayLandLate(ctx context.Context) context.Context {
	return context.WithValue(ctx, lateKey{}, true)
}

// Pool reads a pool fresh; nil, nil when it does not exist.
//
// A GET, on purpose: a LIST by name with no resourceVersion is as fresh, and
// Kubernetes 1.31+ serves it from the watch cache 3x cheaper for a pool of
// 10,000 entries, but it first waits for that cache to catch up with etcd
// (up to ~100 ms whenever anything else changed, such as whereabouts' Lease),
// which doubled a small pool's ADD in the bench.
func (s *Store) Pool(ctx context.Context, name string) (*Pool, error) {
	return s.getPool(ctx, name, Fresh)
}

// CachedPool reads a pool from the API server's watch cache: cheap, and
// possibly behind. A picker that finds nothing in it has nothing to do but
// what the next read will show; one that finds something must Plan, fresh.
func (s *Store) CachedPool(ctx context.Context, name string) (*Pool, error) {
	return s.getPool(ctx, name, Cache)
}

// Local is what an API may also offer: the process's own copy of the pools
// and reservations (a node agent's informer copy, which its own writes keep
// current; agent/cache). A copy may be behind: the store takes from it only
// what a guarded write or a read under the Lease checks again, and never
// decides from it that something is not there.
type Local interface {
	// LocalPool is the pool as the copy holds it; nil when it holds none.
	LocalPool(namespace, name string) *Pool
	// LocalReservation is the reservation as the copy holds it; nil when it
	// holds none.
	LocalReservation(namespace, name string) *Reservation
}

func (s *Store) local() Local {
	l, _ := s.api.(Local)
	return l
}

// LocalPool is the pool as the process's own copy holds it (Local); nil
// without a copy, or when it holds none. Callers must not change it.
func (s *Store) LocalPool(name string) *Pool {
	if l := s.local(); l != nil {
		return l.LocalPool(s.namespace, name)
	}
	return nil
}

// Look is a pool in which pick chooses something, to plan a release on: the
// process's own copy (LocalPool) when it shows something to pick (onCopy),
// else a fresh read. What the copy does not show is read fresh, so nothing
// is decided from a copy alone to be not there; and a plan made on the copy
// whose removal finds its entries gone must be made again on a fresh read,
// since what the copy did not show may be there. Nil when the pool does not
// exist.
func (s *Store) Look(ctx context.Context, name string, pick Picker) (p *Pool, onCopy bool, err error) {
	if p := s.LocalPool(name); p != nil && len(pick(p)) > 0 {
		return p, true, nil
	}
	p, err = s.Pool(ctx, name)
	return p, false, err
}

func (s *Store) getPool(ctx context.Context, name string, from Source) (*Pool, error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	p, err := s.api.GetPool(cctx, s.namespace, name, from)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pool %s/%s: %w", s.namespace, name, err)
	}
	return p, nil
}

// Pools lists every pool of the namespace, fresh, page by page.
func (s *Store) Pools(ctx context.Context) ([]Pool, error) {
	return s.poolsNotOlderThan(ctx, "")
}

// poolsNotOlderThan lists every pool of the namespace as of rv, one of the
// store's own pool writes, or later ("": fresh).
func (s *Store) poolsNotOlderThan(ctx context.Context, rv string) ([]Pool, error) {
	ps, err := listAll(ctx, Page{Limit: s.o.PageSize, NotOlderThan: rv}, func(ctx context.Context, page Page) ([]Pool, string, error) {
		cctx, cancel := s.call(ctx)
		defer cancel()
		return s.api.ListPools(cctx, s.namespace, page)
	})
	if err != nil {
		return nil, fmt.Errorf("list pools in %s: %w", s.namespace, err)
	}
	return ps, nil
}

// Reservation reads one reservation; nil, nil when it does not exist.
func (s *Store) Reservation(ctx context.Context, name string) (*Reservation, error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	o, err := s.api.GetReservation(cctx, s.namespace, name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get reservation %s/%s: %w", s.namespace, name, err)
	}
	return o, nil
}

// Reservations lists every reservation of the namespace, page by page.
func (s *Store) Reservations(ctx context.Context) ([]Reservation, error) {
	os, err := ListAll(ctx, s.o.PageSize, func(ctx context.Context, page Page) ([]Reservation, string, error) {
		cctx, cancel := s.call(ctx)
		defer cancel()
		return s.api.ListReservations(cctx, s.namespace, page)
	})
	if err != nil {
		return nil, fmt.Errorf("list reservations in %s: %w", s.namespace, err)
	}
	return os, nil
}

// Ping asks the API server for one pool: it answers when the store is usable.
func (s *Store) Ping(ctx context.Context) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	if _, _, err := s.api.ListPools(cctx, s.namespace, Page{Limit: 1}); err != nil {
		return fmt.Errorf("list pools in %s: %w", s.namespace, err)
	}
	return nil
}

// retry runs fn again, after a pause, while it fails with a conflict (409)
// or a failed patch test (422), up to Backoff.Steps attempts in all. fn reads
// fresh each time.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	return s.retryFrom(ctx, 1, fn)
}

// retryFrom is retry when attempts before the first were made already.
func (s *Store) retryFrom(ctx context.Context, first int, fn func() error) error {
	var err error
	for attempt := first; ; attempt++ {
		err = fn()
		if !isConflict(err) || attempt >= s.o.Backoff.Steps {
			return err
		}
		s.retried.Add(1)
		if serr := s.o.Clock.Sleep(ctx, s.o.Backoff.wait(attempt, s.o.Random)); serr != nil {
			return errors.Join(err, serr)
		}
	}
}

func isConflict(err error) bool { return apierrors.IsConflict(err) || apierrors.IsInvalid(err) }

// describe names released addresses, the first few of many.
func describe(as []Allocation) string {
	const show = 8
	var ips []string
	for i, a := range as {
		if i == show {
			ips = append(ips, fmt.Sprintf("and %d more", len(as)-show))
			break
		}
		ips = append(ips, a.IP.String())
	}
	return strings.Join(ips, ", ")
}

// IPs are the addresses of entries.
func IPs(as []Allocation) []net.IP {
	out := make([]net.IP, len(as))
	for i, a := range as {
		out[i] = a.IP
	}
	return out
}

// ReleaseStrayReservations deletes the reservations of podRef, under
// networkName, that no entry of the pod holds in any pool that may hold
// that network's reservations: what a release killed between its two steps
// leaves when it removed the entries first (a node agent's, as whereabouts'
// own DEL). The pod's next ADD would not find them (it looks for entries),
// and whereabouts v0.7.0 takes such an address as taken. They are judged as
// ReleaseReservations judges, under whereabouts' Lease on a fresh list of
// the pools, and deleted with the read's preconditions. The reservations
// are listed before the pools: one an ADD creates (always after its entry)
// is then either no candidate or seen held. It returns the names deleted.
//
// Only the reservations of addresses are looked at (those an earlier
// sandbox of the pod recorded): a reservation of the pod's current sandbox
// may be one whereabouts shares between its interfaces on overlapping
// ranges, and is never a stray's.
func (s *Store) ReleaseStrayReservations(ctx context.Context, podRef, networkName string, addresses []net.IP) ([]string, error) {
	if len(addresses) == 0 {
		return nil, nil
	}
	want := map[string]bool{}
	for _, ip := range addresses {
		want[names.Reservation(ip, networkName)] = true
	}
	all, err := s.Reservations(ctx)
	if err != nil {
		return nil, err
	}
	var cands []candidate
	for i := range all {
		o := &all[i]
		if o.Spec.PodRef != podRef || !want[o.Name] {
			continue
		}
		cands = append(cands, candidate{Allocation: Allocation{IPAllocation: whereaboutsv1alpha1.IPAllocation{
			PodRef: podRef, ContainerID: o.Spec.ContainerID}}, name: o.Name, read: o})
	}
	if len(cands) == 0 {
		return nil, nil
	}
	j := &releaseJob{ctx: ctx, network: networkName, cands: cands, going: map[string]bool{}}
	s.runRelease(ctx, j)
	sort.Strings(j.deleted)
	return j.deleted, j.err
}
