package alloc

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// reserveTimeout bounds the reservation of one written address. It runs on a
// context of its own: once the entry is written, its reservation is made even
// if the ADD's client went away, so that no entry is left without one. Two
// minutes, as whereabouts' own ADD waits for its Lease: under contention for
// the Lease the agent gives up no sooner than the exec path would.
const reserveTimeout = 2 * time.Minute

// reserve creates the reservation of each written address, all at once. An
// address another pod has reserved (an overlapping range allocated it) is
// given up: its entry removed, and the member allocated again without it.
func (a *Batcher) reserve(q *queue, chosen []choice) {
	var dones []chan struct{}
	for _, c := range chosen {
		if !c.m.overlapping {
			deliver(c.m, c.ip, nil)
			continue
		}
		done := make(chan struct{})
		dones = append(dones, done)
		a.goAside(func() {
			defer close(done)
			a.reserveOne(q, c)
		})
	}
	for _, done := range dones {
		a.wait(done)
	}
}

func (a *Batcher) reserveOne(q *queue, c choice) {
	m := c.m
	ctx, cancel := context.WithTimeout(context.Background(), reserveTimeout)
	defer cancel()
	name := names.Reservation(c.ip.IP, m.network)
	spec := shim.ReservationSpec{ContainerID: m.containerID, PodRef: m.podRef, IfName: m.ifName}
	var existing *shim.Reservation
	var err error
	if a.shared(m, c.written) {
		err = m.store.Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
			if err := l.Keep(ctx); err != nil {
				return err
			}
			existing, err = m.store.Reserve(ctx, name, spec)
			return err
		})
	} else {
		existing, err = m.store.Reserve(ctx, name, spec)
	}
	a.at("alloc-after-reserve")
	switch {
	case err != nil:
		// The entry stays, recorded: the runtime's DEL (or the reconciler)
		// releases it, as after whereabouts' own failed ADD.
		deliver(m, net.IPNet{}, storeError(fmt.Sprintf("reserve %s in %s", c.ip.IP, m.store.Namespace()), err))
	case existing == nil:
		deliver(m, c.ip, nil)
	case existing.Spec.PodRef == m.podRef:
		// The pod's own reservation (whereabouts keeps it as it is). A
		// release of an earlier sandbox may be deleting it: judge under the
		// Lease, where every release judges.
		if err := a.keepOwn(ctx, m, name, spec); err != nil {
			deliver(m, net.IPNet{}, storeError(fmt.Sprintf("reserve %s in %s", c.ip.IP, m.store.Namespace()), err))
			return
		}
		a.at("alloc-after-keep-own")
		deliver(m, c.ip, nil)
	default:
		// Another pod's: the address is taken in an overlapping range.
		if err := a.giveUp(ctx, c); err != nil {
			deliver(m, net.IPNet{}, storeError(fmt.Sprintf("give up %s, reserved by %s", c.ip.IP, existing.Spec.PodRef), err))
			return
		}
		a.at("alloc-after-give-up")
		ip := c.ip
		m.pending = &ip // recorded, no longer written
		m.skip = append(m.skip, c.ip.IP)
		a.requeue(q, m)
	}
}

// shared says whether another pool may hold m's addresses under m's network
// name (an overlapping range, a node slice), as the pools were last seen; an
// unlisted namespace may, and so may one whose copy has not yet shown the
// pool as written at rv (the allocation's own patch): a pool created before
// that patch may be missing from it.
func (a *Batcher) shared(m *member, rv string) bool {
	if a.o.Pools == nil {
		return false
	}
	pools, listed := a.o.Pools(m.store.Namespace())
	if !listed {
		return true
	}
	if a.o.Follows != nil && !a.o.Follows(m.store.Namespace(), rv) {
		return true
	}
	_, mine, err := net.ParseCIDR(m.rng.Range)
	if err != nil {
		return true
	}
	for _, p := range pools {
		if p.Name == m.pool || !names.MayHoldReservationsOf(p.Name, p.Spec.Range, m.network) {
			continue
		}
		_, theirs, err := net.ParseCIDR(p.Spec.Range)
		if err != nil || theirs.Contains(mine.IP) || mine.Contains(theirs.IP) {
			return true
		}
	}
	return false
}

// keepOwn makes sure the pod's reservation of an address stays: under the
// Lease, it is read again and created if a release deleted it meanwhile. One
// that names an earlier container of the pod is kept as it is, as whereabouts
// keeps it: it is the pod's, and the new sandbox's DEL releases it with the
// entry (shim.Owns).
func (a *Batcher) keepOwn(ctx context.Context, m *member, name string, spec shim.ReservationSpec) error {
	return m.store.Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
		o, err := l.Reservation(ctx, name)
		if err != nil {
			return err
		}
		if o == nil {
			o, err = m.store.Reserve(ctx, name, spec)
			if err != nil || o == nil {
				return err
			}
		}
		if o.Spec.PodRef != m.podRef {
			return fmt.Errorf("reservation %s/%s went to %s", m.store.Namespace(), name, o.Spec.PodRef)
		}
		return nil
	})
}

// giveUp removes the member's entry at an address it could not reserve, if
// the entry is still its own: its container and pod, with the ifname it
// wrote or none (whereabouts v0.7.0's CRD prunes the ifname as the entry is
// stored). Planned on a fresh read; removed while it is still as read.
func (a *Batcher) giveUp(ctx context.Context, c choice) error {
	m := c.m
	own := func(p *shim.Pool) []string {
		e, ok := p.Spec.Allocations[c.offset]
		if ok && e.ContainerID == m.containerID && e.PodRef == m.podRef && (e.IfName == m.ifName || e.IfName == "") {
			return []string{c.offset}
		}
		return nil
	}
	plan, err := m.store.Plan(ctx, m.pool, m.network, own)
	if err != nil {
		return err
	}
	_, err = m.store.RemoveAllocations(ctx, plan)
	return err
}
