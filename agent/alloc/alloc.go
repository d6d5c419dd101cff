// Package alloc allocates addresses in harvester-ipam's node agent as
// whereabouts' own ADD does, without whereabouts' cluster-wide Lease.
//
// whereabouts' pkg/allocate chooses each address (the lowest free offset
// outside the excludes, or the entry the pod already holds on that
// interface, v0.8.0 and later), and what is written is what whereabouts
// writes: the entry {id, podref, ifname} at the address's decimal offset, and
// the address's OverlappingRangeIPReservation. Two rules make that safe
// without the Lease:
//
//   - The pool is written only by a JSON patch that tests the resourceVersion
//     it was chosen on and that every added offset is still empty (whereabouts'
//     own rule; its correctness never rested on the Lease). A stale base, an
//     informer's copy included, fails the test and is read again fresh.
//   - The reservation's create is the commit point across pools (overlapping
//     ranges): an address whose reservation another pod holds is given up
//     (the entry removed by a guarded patch) and another chosen. Only taking
//     over a reservation the pod itself already holds, which whereabouts does
//     silently and a release may be deleting, is judged under the Lease; and
//     where another pool may hold the same addresses, the create itself is
//     made under the Lease, since whereabouts' ADD, which looks at the
//     reservation before it writes its entry and creates it after, fails
//     when one is made in between, and its DEL of the entry left then
//     deletes the reservation by name, the winner's.
//
// ADDs of one node waiting for the same pool are written together (group
// commit): each member is allocated in turn on the accumulated list, one
// patch writes them all, and each gets its own address or its own error.
package alloc

import (
	"context"
	"errors"
	"fmt"
	"net"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/batch"
)

// Options tune a Batcher; the zero value of each is its default.
type Options struct {
	// Rounds bounds the patches one group tries after conflicts (100, as
	// whereabouts' retries).
	Rounds int
	// Reserved, when set, tells of an address's reservation as last seen (an
	// informer's cache): a hint that skips an address another pod has
	// reserved before writing it. It never decides that an address is free.
	Reserved func(namespace, name string) *shim.Reservation
	// Pools, when set, are a namespace's pools as last seen (an informer's
	// cache) and whether they were listed: where another pool may hold a
	// pool's addresses (overlapping ranges), or the pools are not listed
	// yet, its reservations are created under whereabouts' Lease (see
	// reserveOne). Nil creates them without.
	Pools func(namespace string) ([]*shim.Pool, bool)
	// Follows, when set, says whether those pools are every pool of the
	// namespace that existed when a pool of it was written at
	// resourceVersion rv (the allocation's own patch), waiting a short
	// while for the informer to deliver it. Where it says no, the copy's
	// "no other pool shares this range" is not trusted: the reservation is
	// created under the Lease. Nil trusts a listed copy.
	Follows func(namespace, rv string) bool
	// AtStep, when set, is called at each step boundary ("alloc-after-patch",
	// ...): test builds and the simulation crash the agent there.
	AtStep func(step string)
	// Go and Wait, when set, run the allocator's concurrency under a
	// scheduler of the caller's (the simulation's, which runs one goroutine
	// at a time): Go starts f beside the caller (nil: a goroutine), Wait
	// returns once done is closed (nil: a receive).
	Go   func(f func())
	Wait func(done <-chan struct{})
}

// Batcher allocates for the ADDs of one node, the ADDs waiting for one pool
// at one moment in one patch (a group commit). It is safe for concurrent use.
type Batcher struct {
	o      Options
	queues batch.Queues[queueKey, *member]
}

// New is an allocator.
func New(o Options) *Batcher {
	if o.Rounds <= 0 {
		o.Rounds = 100
	}
	return &Batcher{o: o}
}

// Request is one attachment's ADD in the whereabouts config it was loaded
// with (CNI_ARGS applied: pod, static addresses).
type Request struct {
	// Store is the pool namespace's store.
	Store       *shim.Store
	IPAM        *wbtypes.IPAMConfig
	ContainerID string
	IfName      string
	// Recorded are the addresses the attachment's record already names:
	// an entry of the container without an ifname at one of them (an old
	// CRD pruned it) is the attachment's own, allocated by an earlier ask
	// of the same ADD, and is given again.
	Recorded []net.IP
	// Chosen, when set, is told each address before it is written (the
	// checkpoint records it, so that a DEL finds an entry without an ifname
	// that an old CRD pruned); an error fails the ADD before the write.
	Chosen func(ip net.IPNet) error
	// Unchosen, when set, is told an address told to Chosen that is not
	// (or no longer) written and is replaced by another choice: the
	// checkpoint forgets it.
	Unchosen func(ip net.IPNet) error
}

// Allocate allocates one address in each of the config's ranges, in order,
// as whereabouts' IPManagement does: a range that fails ends the ADD, and
// what earlier ranges allocated stays (whereabouts does not roll it back;
// the runtime's DEL releases it). The error of a full range is whereabouts'
// own text, in whereabouts' words ("error at storage engine: ...").
func (a *Batcher) Allocate(ctx context.Context, r Request) ([]net.IPNet, error) {
	if r.IPAM == nil || r.Store == nil {
		return nil, errors.New("allocate: no config or no store")
	}
	podRef := r.IPAM.GetPodRef()
	if r.IPAM.PodName == "" {
		// whereabouts' own refusal, word for word.
		return nil, fmt.Errorf("error at storage engine: IPAM client initialization error: no pod name")
	}
	var out []net.IPNet
	for _, rng := range r.IPAM.IPRanges {
		m := &member{
			ctx:         ctx,
			store:       r.Store,
			rng:         rng,
			pool:        names.Pool(rng.Range, r.IPAM.NetworkName),
			network:     r.IPAM.NetworkName,
			overlapping: r.IPAM.OverlappingRanges,
			containerID: r.ContainerID,
			podRef:      podRef,
			ifName:      r.IfName,
			recorded:    r.Recorded,
			chosen:      r.Chosen,
			unchosen:    r.Unchosen,
			done:        make(chan struct{}),
		}
		o := a.enqueue(m)
		if o.err != nil {
			return out, o.err
		}
		out = append(out, o.ip)
	}
	return out, nil
}

// outcome is what a member's ADD got in one range.
type outcome struct {
	ip  net.IPNet
	err error
}

// rangeFull wraps whereabouts' AssignmentError as its ADD reports it.
func rangeFull(err error) error {
	return fmt.Errorf("error at storage engine: %w", err)
}

// storeError is a failure to read or write the store: the runtime retries.
func storeError(what string, err error) error {
	return cnitypes.NewError(cnitypes.ErrTryAgainLater, fmt.Sprintf("%s: %v", what, err),
		"the Kubernetes API server holding the IPPools could not be reached or refused the write; the runtime retries")
}

func (a *Batcher) at(step string) {
	if a.o.AtStep != nil {
		a.o.AtStep(step)
	}
}

// goAside runs f beside the caller.
func (a *Batcher) goAside(f func()) {
	if a.o.Go != nil {
		a.o.Go(f)
		return
	}
	go f()
}

// wait returns once done is closed.
func (a *Batcher) wait(done <-chan struct{}) {
	if a.o.Wait != nil {
		a.o.Wait(done)
		return
	}
	<-done
}
