package shim

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
)

// Whereabouts serialises every ADD and DEL on a coordination.k8s.io Lease
// (client-go's leader election: a holder keeps the Lease by renewing it; an
// observer takes it over once its holder is empty, or once the record has
// not changed for its leaseDurationSeconds). harvester-ipam holds the same
// Lease, with the same protocol, while it judges and deletes reservations:
// whereabouts reuses a reservation whose podref is the pod's without
// changing it, so no precondition could tell that it became live again.
const (
	// leaseSeconds is the leaseDurationSeconds of our record: how long
	// whereabouts waits when we die holding the Lease.
	leaseSeconds = 5
	// Within a long critical section the Lease is renewed once it has been
	// held leaseRenewAfter of its duration (1.5 s of 5 s), and no request is
	// made under it that could land (leaseCallTimeout) later than
	// leaseValidFor of its duration after our last write: a renewal that
	// fails loses the hold unless the time after it, plus leaseCallTimeout,
	// is within that (never, at 5 s).
	leaseRenewAfter = 0.3
	leaseValidFor   = 0.6
	// leaseCallTimeout bounds each request made under the Lease, well within
	// leaseSeconds: a request must not land after we lost it.
	leaseCallTimeout = 2 * time.Second
	// leaseRetry is how often we look again at a Lease someone else holds
	// (whereabouts looks every 500 ms).
	leaseRetry = 50 * time.Millisecond
)

func defaultIdentity() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("harvester-ipam/%s/%d", host, os.Getpid())
}

// Locked is the store while whereabouts' Lease is held: whereabouts
// allocates and deallocates nothing meanwhile.
type Locked struct {
	s *Store
	h *hold
}

// hold is one acquisition of the Lease: the record as we last wrote it.
// The calls of a Group that share an acquisition share its hold.
type hold struct {
	mu       sync.Mutex
	lease    *Lease
	written  time.Time // our last successful write of the Lease
	identity string
	lost     bool // a renewal failed: the Lease may be someone else's
	// renewing, while set, is closed once the renewal under way ends: the
	// requests of one turn made side by side (a release's deletes) renew
	// one at a time, and those that come meanwhile wait for it. mu is
	// never held across a request, so that a scheduler running one
	// goroutine at a time (Group.Await) can run the one renewing.
	renewing chan struct{}
}

// Locked runs fn while holding whereabouts' Lease of the namespace, and
// releases it after, whatever fn returns. With Options.Group, the calls of
// the group's stores take their turns under one acquisition (Group).
func (s *Store) Locked(ctx context.Context, fn func(context.Context, *Locked) error) error {
	if s.o.Group != nil {
		return s.o.Group.locked(ctx, s, fn)
	}
	h, err := s.acquire(ctx, s.o.Identity, nil)
	if err != nil {
		return err
	}
	defer h.release(ctx, s)
	defer s.turn(s.o.Identity)()
	return fn(underLease(ctx), &Locked{s: s, h: h})
}

// turn tells Options.Turn that a turn under the Lease held as holder
// begins; what it returns tells that it ended.
func (s *Store) turn(holder string) (end func()) {
	if s.o.Turn == nil {
		return func() {}
	}
	return s.o.Turn(holder)
}

// goAside runs f beside the caller, as the store's Group runs its own
// goroutines (a goroutine without one).
func (s *Store) goAside(f func()) {
	if g := s.o.Group; g != nil {
		g.spawn(f)
		return
	}
	go f()
}

// await returns once done is closed, waiting as the store's Group waits.
func (s *Store) await(done <-chan struct{}) {
	if g := s.o.Group; g != nil {
		g.await(done)
		return
	}
	<-done
}

// underLeaseKey marks the context of a turn under the Lease.
type underLeaseKey struct{}

// underLease is ctx for the requests of a turn under the Lease: each is
// bounded by leaseCallTimeout, not the store's CallTimeout, so that none
// lands after the hold may have passed to another holder.
func underLease(ctx context.Context) context.Context {
	return context.WithValue(ctx, underLeaseKey{}, true)
}

// acquire takes the Lease as identity. record, when set, is the Lease as
// this process last wrote it when its previous hold ended: handed back, or
// still under identity when the hand back failed. While nobody has written
// it since, it is ours: free, taken with no read first (a conflict says
// someone did: then it is read as usual), or still held by us.
//
// A holder is the process that wrote the record, not a name: client-go's
// electors take a record under their own identity as theirs, which is safe
// only while no two processes share one (they add a UUID to it). Two node
// agents of one node may (each pid 1 in its container), and so may a
// crashed process and its replacement: a record under identity that this
// process did not write (its resourceVersion is not record's) is another
// holder's, waited out as any other holder's, and taken from it with a
// transition.
func (s *Store) acquire(ctx context.Context, identity string, record *Lease) (*hold, error) {
	if record != nil && (record.Spec.HolderIdentity == nil || *record.Spec.HolderIdentity == "") {
		l := record.DeepCopy()
		transitions := int32(1)
		if l.Spec.LeaseTransitions != nil {
			transitions += *l.Spec.LeaseTransitions
		}
		l.Spec.LeaseTransitions = &transitions
		now := s.Now()
		s.hold(l, now, identity)
		cctx, cancel := s.call(ctx)
		got, err := s.api.UpdateLease(cctx, l)
		cancel()
		if err == nil {
			return &hold{lease: got, written: now, identity: identity}, nil
		}
		// Written by someone since (409), or not answered: look at it.
	}
	// The holder's record as we first saw it, and when: an elector judges a
	// Lease expired when its record has not changed for its duration.
	var seen string
	var seenAt time.Time
	for {
		cctx, cancel := s.call(ctx)
		cur, err := s.api.GetLease(cctx, s.namespace, names.Lease)
		cancel()
		now := s.Now()
		switch {
		case apierrors.IsNotFound(err):
			zero := int32(0)
			l := &Lease{ObjectMeta: metav1.ObjectMeta{Name: names.Lease, Namespace: s.namespace}}
			l.Spec.LeaseTransitions = &zero
			s.hold(l, now, identity)
			cctx, cancel := s.call(ctx)
			got, err := s.api.CreateLease(cctx, l)
			cancel()
			if err == nil {
				return &hold{lease: got, written: now, identity: identity}, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create lease %s/%s: %w", s.namespace, names.Lease, err)
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("get lease %s/%s: %w", s.namespace, names.Lease, err)
		}
		holder := ""
		if cur.Spec.HolderIdentity != nil {
			holder = *cur.Spec.HolderIdentity
		}
		if cur.ResourceVersion != seen {
			// The record changed (a holder renewed it, or took it): its
			// duration counts from now, as every client-go elector counts it.
			seen, seenAt = cur.ResourceVersion, now
		}
		duration := time.Duration(0)
		if cur.Spec.LeaseDurationSeconds != nil {
			duration = time.Duration(*cur.Spec.LeaseDurationSeconds) * time.Second
		}
		if holder == "" || wrote(record, cur, identity) || !now.Before(seenAt.Add(duration)) {
			l := cur.DeepCopy()
			if !wrote(record, cur, identity) {
				transitions := int32(0)
				if l.Spec.LeaseTransitions != nil {
					transitions = *l.Spec.LeaseTransitions
				}
				transitions++
				l.Spec.LeaseTransitions = &transitions
			}
			s.hold(l, now, identity)
			cctx, cancel := s.call(ctx)
			got, err := s.api.UpdateLease(cctx, l)
			cancel()
			if err == nil {
				return &hold{lease: got, written: now, identity: identity}, nil
			}
			if !apierrors.IsConflict(err) {
				return nil, fmt.Errorf("take lease %s/%s: %w", s.namespace, names.Lease, err)
			}
			continue // someone else took it first: look again
		}
		if err := s.o.Clock.Sleep(ctx, s.o.LeaseRetry+time.Duration(float64(s.o.LeaseRetry)*s.o.Random())); err != nil {
			return nil, fmt.Errorf("wait for lease %s/%s held by %s: %w", s.namespace, names.Lease, holder, err)
		}
	}
}

// wrote says whether cur is record, the Lease as this process last wrote
// it, held under identity: the same version of the object, which nobody
// wrote since. A holder of the same name is another holder.
func wrote(record, cur *Lease, identity string) bool {
	return record != nil && cur.ResourceVersion != "" && record.ResourceVersion == cur.ResourceVersion &&
		record.Spec.HolderIdentity != nil && *record.Spec.HolderIdentity == identity
}

// hold makes l's record identity's, acquired or renewed at now.
func (s *Store) hold(l *Lease, now time.Time, identity string) {
	secs := s.o.LeaseSeconds
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &identity, &secs
	l.Spec.AcquireTime, l.Spec.RenewTime = &t, &t
}

// Keep makes sure the Lease is still ours for the next request, renewing it
// when it has been held a while; it fails when it is lost. Locked's own
// requests keep it; a caller that writes by other means calls it first.
func (l *Locked) Keep(ctx context.Context) error {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.renewing != nil {
		wait := h.renewing
		h.mu.Unlock()
		l.s.await(wait)
		h.mu.Lock()
	}
	if h.lost {
		return fmt.Errorf("lease %s/%s: lost", l.s.namespace, names.Lease)
	}
	now := l.s.Now()
	duration := time.Duration(l.s.o.LeaseSeconds) * time.Second
	if now.Sub(h.written) < time.Duration(float64(duration)*leaseRenewAfter) {
		return nil
	}
	next := h.lease.DeepCopy()
	t := metav1.NewMicroTime(now)
	next.Spec.RenewTime = &t
	// The request is made without mu (the others wait on renewing), and
	// its outcome is the hold's before renewing ends: whoever waited then
	// sees it renewed, or lost.
	renewing := make(chan struct{})
	h.renewing = renewing
	h.mu.Unlock()
	unlocked := true
	defer func() {
		// Also when the request panics (a killed process unwinding): mu
		// is then not held, and the deferred Unlock needs it.
		if unlocked {
			h.mu.Lock()
		}
		h.renewing = nil
		close(renewing)
	}()
	cctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	got, err := l.s.api.UpdateLease(cctx, next)
	cancel()
	h.mu.Lock()
	unlocked = false
	if err != nil {
		// Still ours only if the next request, made now and bounded by
		// leaseCallTimeout, lands within validity of our last good write:
		// judged by the clock after the failed renewal, which may have
		// taken up to leaseCallTimeout itself (a timeout).
		after := l.s.Now()
		if after.Sub(h.written)+leaseCallTimeout < time.Duration(float64(duration)*leaseValidFor) && !apierrors.IsConflict(err) {
			return nil // a failed renewal within validity: still ours this once
		}
		h.lost = true
		return fmt.Errorf("renew lease %s/%s: %w", l.s.namespace, names.Lease, err)
	}
	h.lease, h.written = got, now
	return nil
}

// lost says whether the hold is lost: a renewal failed, and no request may
// be made under it.
func (l *Locked) lost() bool {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	return l.h.lost
}

// release hands the Lease back as client-go's elector does: no holder, a
// duration of one second; a Lease that changed meanwhile is not ours to
// touch. It returns the Lease as this hold last wrote it: handed back, or,
// when the hand back failed, as it last took or renewed it (still ours
// while nobody wrote it since: acquire's record).
func (h *hold) release(ctx context.Context, s *Store) *Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	next := h.lease.DeepCopy()
	empty, one := "", int32(1)
	t := metav1.NewMicroTime(s.Now())
	next.Spec.HolderIdentity, next.Spec.LeaseDurationSeconds = &empty, &one
	next.Spec.RenewTime, next.Spec.AcquireTime = &t, &t
	// A cancelled verb still hands the Lease back, or whereabouts would wait
	// leaseSeconds for it.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseCallTimeout)
	defer cancel()
	got, err := s.api.UpdateLease(cctx, next)
	if err != nil {
		return h.lease
	}
	return got
}

// Pools lists every pool of the namespace, fresh.
func (l *Locked) Pools(ctx context.Context) ([]Pool, error) {
	if err := l.Keep(ctx); err != nil {
		return nil, err
	}
	return l.s.Pools(ctx)
}

// Reservation reads one reservation fresh; nil, nil when it does not exist.
func (l *Locked) Reservation(ctx context.Context, name string) (*Reservation, error) {
	if err := l.Keep(ctx); err != nil {
		return nil, err
	}
	return l.s.Reservation(ctx, name)
}

// DeleteReservation deletes o if it is unchanged since it was read (UID and
// resourceVersion preconditions). deleted is false when it changed (409) or
// is gone already.
func (l *Locked) DeleteReservation(ctx context.Context, o *Reservation) (deleted bool, err error) {
	if err := l.Keep(ctx); err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	err = l.s.api.DeleteReservation(cctx, l.s.namespace, o.Name, Preconditions{UID: o.UID, ResourceVersion: o.ResourceVersion})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	}
	return false, fmt.Errorf("delete reservation %s/%s: %w", l.s.namespace, o.Name, err)
}

// releaseReservation deletes the reservation of c while it is c's and held
// reports no other holder; a reservation that changed under the delete is
// read and judged again, whole (held on the pools as they are then), up to
// Backoff.Steps times. It returns the name deleted, "" when it was not (or no
// longer) c's to delete.
//
// The first attempt judges the reservation as the candidate was read (before
// the Lease, or the process's own copy): the delete's UID and resourceVersion
// preconditions make it delete only that very object, and whether another
// entry of the pod holds it is judged on pools listed under the Lease. A
// reservation that changed since fails the delete (409) and is read again.
func (l *Locked) releaseReservation(ctx context.Context, c candidate, held func(ctx context.Context, o *Reservation, fresh bool) (bool, error)) (string, error) {
	for attempt := 1; ; attempt++ {
		o := c.read
		if attempt > 1 || o == nil {
			var err error
			if o, err = l.Reservation(ctx, c.name); err != nil {
				return "", err
			}
		}
		if o == nil || !Owns(o, c.Allocation) {
			return "", nil
		}
		if h, err := held(ctx, o, attempt > 1); err != nil || h {
			return "", err
		}
		deleted, err := l.DeleteReservation(ctx, o)
		if err != nil || deleted {
			if deleted {
				return c.name, nil
			}
			return "", err
		}
		if attempt >= l.s.o.Backoff.Steps {
			return "", fmt.Errorf("delete reservation %s/%s: it kept changing under %d attempts", l.s.namespace, c.name, attempt)
		}
		l.s.retried.Add(1)
	}
}
