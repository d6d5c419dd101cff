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

	"github.com/harvester/harvester-ipam/shim/names"
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
	ps, err := ListAll(ctx, s.o.PageSize, func(ctx context.Context, page Page) ([]Pool, string, error) {
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

// Plan is what a release removes from one pool: the entries a picker chose on
// a fresh read, with the network_name their reservations are named under.
type Plan struct {
	Pool    string
	Network string
	Entries []Allocation
}

// Empty says that the plan releases nothing.
func (pl Plan) Empty() bool { return len(pl.Entries) == 0 }

// Plan reads a pool fresh and plans the release of what pick chooses; a pool
// that does not exist holds nothing.
func (s *Store) Plan(ctx context.Context, pool, networkName string, pick Picker) (Plan, error) {
	p, err := s.Pool(ctx, pool)
	if err != nil || p == nil {
		return Plan{Pool: pool, Network: networkName}, err
	}
	return PlanOf(p, networkName, pick)
}

// PlanOf plans the release of what pick chooses from p, which the caller has
// just read fresh.
func PlanOf(p *Pool, networkName string, pick Picker) (Plan, error) {
	es, err := entries(p, pick(p))
	return Plan{Pool: p.Name, Network: networkName, Entries: es}, err
}

// maxRemovals bounds the removals of one patch: the API server refuses a JSON
// patch of more than 10,000 operations, and a huge one holds the pool long.
const maxRemovals = 1000

// RemoveAllocations removes from the plan's pool the planned entries that are
// still what the plan saw (an entry that changed hands since is another
// sandbox's now), in guarded patches of at most maxRemovals removals, each on
// a fresh read. It returns the entries removed.
func (s *Store) RemoveAllocations(ctx context.Context, plan Plan) ([]Allocation, error) {
	var removed []Allocation
	for start := 0; start < len(plan.Entries); start += maxRemovals {
		chunk := plan.Entries[start:min(start+maxRemovals, len(plan.Entries))]
		want := make(map[string]whereaboutsv1alpha1.IPAllocation, len(chunk))
		for _, e := range chunk {
			want[e.Offset] = e.IPAllocation
		}
		var done []Allocation
		err := s.retry(ctx, func() error {
			done = nil
			p, err := s.Pool(ctx, plan.Pool)
			if err != nil || p == nil {
				return err
			}
			offsets := Exactly(want)(p)
			if len(offsets) == 0 {
				return nil
			}
			es, err := entries(p, offsets)
			if err != nil {
				return err
			}
			cctx, cancel := s.call(ctx)
			defer cancel()
			_, err = s.api.PatchPool(cctx, s.namespace, plan.Pool, removeAllocations(p.ResourceVersion, offsets))
			if apierrors.IsNotFound(err) {
				return nil // deleted under us: nothing left to remove
			}
			if err != nil {
				return fmt.Errorf("release %s from pool %s/%s: %w", describe(es), s.namespace, plan.Pool, err)
			}
			done = es
			return nil
		})
		removed = append(removed, done...)
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// quickLook bounds the reservations ReleaseReservations GETs one by one before
// taking the Lease; more are listed in one go.
const quickLook = 20

// ReleaseReservations deletes the reservations of the plan's entries that
// are still theirs (same podref, and container when the reservation names
// one) and that no other entry of the pod holds: in any pool that may hold
// reservations of the plan's network (an overlapping range, a node slice), a
// new sandbox of the pod may have the address again, and then the
// reservation is its. The judgement and the delete happen while whereabouts'
// Lease is held, so that no whereabouts ADD can take the address (and keep
// its reservation, as whereabouts does when the podref matches) between the
// two; without a reservation that may be the entries', the Lease is not
// taken. It returns the names deleted.
func (s *Store) ReleaseReservations(ctx context.Context, plan Plan) ([]string, error) {
	cands, err := s.reservationCandidates(ctx, plan)
	if err != nil || len(cands) == 0 {
		return nil, err
	}
	var deleted []string
	going := map[string]bool{}
	for _, e := range plan.Entries {
		going[plan.Pool+"/"+e.Offset+"/"+e.ContainerID] = true
	}
	err = s.Locked(ctx, func(ctx context.Context, l *Locked) error {
		var holders map[string][]Allocation
		held := func(ctx context.Context, o *Reservation, fresh bool) (bool, error) {
			if holders == nil || fresh {
				pools, err := l.Pools(ctx)
				if err != nil {
					return false, err
				}
				holders = Holders(pools, plan.Network)
			}
			for _, h := range holders[o.Name] {
				if h.PodRef == o.Spec.PodRef && !going[h.Pool+"/"+h.Offset+"/"+h.ContainerID] {
					return true, nil
				}
			}
			return false, nil
		}
		for _, c := range cands {
			name, err := l.releaseReservation(ctx, c, held)
			if err != nil {
				return err
			}
			if name != "" {
				deleted = append(deleted, name)
			}
		}
		return nil
	})
	return deleted, err
}

// candidate is a planned entry whose reservation exists and may be its own.
type candidate struct {
	Allocation
	name string
}

// reservationCandidates are the planned entries whose reservation exists and
// is theirs, looked up without the Lease: most often whereabouts deleted
// them already (its own DEL), and then no Lease is needed.
func (s *Store) reservationCandidates(ctx context.Context, plan Plan) ([]candidate, error) {
	if len(plan.Entries) == 0 {
		return nil, nil
	}
	var byName map[string]*Reservation
	if len(plan.Entries) > quickLook {
		all, err := s.Reservations(ctx)
		if err != nil {
			return nil, err
		}
		byName = make(map[string]*Reservation, len(all))
		for i := range all {
			byName[all[i].Name] = &all[i]
		}
	}
	var out []candidate
	seen := map[string]bool{}
	for _, e := range plan.Entries {
		name := names.Reservation(e.IP, plan.Network)
		if seen[name] {
			continue
		}
		seen[name] = true
		o := byName[name]
		if byName == nil {
			var err error
			if o, err = s.Reservation(ctx, name); err != nil {
				return nil, err
			}
		}
		if o != nil && Owns(o, e) {
			out = append(out, candidate{Allocation: e, name: name})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// Owns says whether a reservation is an entry's: same podref, and the same
// container when the reservation names one (whereabouts before v0.8 did).
func Owns(o *Reservation, a Allocation) bool {
	return o.Spec.PodRef == a.PodRef && (o.Spec.ContainerID == "" || o.Spec.ContainerID == a.ContainerID)
}

// Holders indexes, by the name of their reservation under networkName, the
// entries of the pools that may hold reservations of that network
// (names.MayHoldReservationsOf).
func Holders(pools []Pool, networkName string) map[string][]Allocation {
	out := map[string][]Allocation{}
	for i := range pools {
		p := &pools[i]
		if !names.MayHoldReservationsOf(p.Name, p.Spec.Range, networkName) {
			continue
		}
		as, err := Allocations(p)
		if err != nil {
			// An unreadable pool may hold anything: count it as holding by
			// nobody we can name; the caller keeps what it cannot judge.
			continue
		}
		for _, a := range as {
			name := names.Reservation(a.IP, networkName)
			out[name] = append(out[name], a)
		}
	}
	return out
}

// SetPoolAnnotation sets (or, with "", removes) one annotation of a pool,
// computed by value from the pool as freshly read, with a guarded patch
// retried as every pool write is.
func (s *Store) SetPoolAnnotation(ctx context.Context, pool, key string, value func(*Pool) string) error {
	return s.retry(ctx, func() error {
		p, err := s.Pool(ctx, pool)
		if err != nil || p == nil {
			return err
		}
		want := value(p)
		have, ok := p.Annotations[key]
		if want == have && (ok || want == "") {
			return nil
		}
		cctx, cancel := s.call(ctx)
		defer cancel()
		_, err = s.api.PatchPool(cctx, s.namespace, pool, setAnnotation(p.ResourceVersion, p.Annotations, key, want))
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("annotate pool %s/%s: %w", s.namespace, pool, err)
		}
		return nil
	})
}

// DeletePool deletes a pool that still is what keep, judging it as freshly
// read, says may go: read fresh, judged, then deleted with the UID and
// resourceVersion of that read as preconditions, so that a pool written
// since (an ADD took an address, a release, a sighting) is not deleted on a
// judgement of what it was. It is not retried: a conflict (409) means the
// pool changed, and the caller judges it again on its next look; deleted is
// false then, as it is when the pool is gone or may not go.
func (s *Store) DeletePool(ctx context.Context, name string, mayGo func(*Pool) bool) (deleted bool, err error) {
	p, err := s.Pool(ctx, name)
	if err != nil || p == nil || !mayGo(p) {
		return false, err
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	err = s.api.DeletePool(cctx, s.namespace, name, Preconditions{UID: p.UID, ResourceVersion: p.ResourceVersion})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete pool %s/%s: %w", s.namespace, name, err)
	}
	return true, nil
}

// MarkReservation sets (or, with "", removes) one annotation of a
// reservation as it was read: a reservation changed since (or gone) is left
// alone, and ok is false; the caller judges it again on its next look.
func (s *Store) MarkReservation(ctx context.Context, o *Reservation, key, value string) (ok bool, err error) {
	if _, has := o.Annotations[key]; value == "" && !has {
		return true, nil
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	_, err = s.api.PatchReservation(cctx, s.namespace, o.Name, setAnnotation(o.ResourceVersion, o.Annotations, key, value))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err), apierrors.IsInvalid(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("annotate reservation %s/%s: %w", s.namespace, o.Name, err)
	}
	return true, nil
}

// retry runs fn again, after a pause, while it fails with a conflict (409)
// or a failed patch test (422), up to Backoff.Steps attempts in all. fn reads
// fresh each time.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 1; ; attempt++ {
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
