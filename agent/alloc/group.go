package alloc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/k8snetworkplumbingwg/whereabouts/pkg/allocate"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/iphelpers"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/batch"
)

// queueKey is one pool of one namespace: the unit of group commit.
type queueKey struct{ namespace, pool string }

// queue holds the members waiting for one pool. One worker at a time writes
// for it; members that arrive while it writes wait for its next round and
// go together.
type queue = batch.Queue[*member]

// member is one ADD's claim on one range.
type member struct {
	ctx         context.Context
	store       *shim.Store
	rng         wbtypes.RangeConfiguration
	pool        string
	network     string
	overlapping bool
	containerID string
	podRef      string
	ifName      string
	recorded    []net.IP
	chosen      func(net.IPNet) error
	unchosen    func(net.IPNet) error
	// pending is the address recorded for the member (chosen) and not
	// written, or written and given up: a next choice replaces it in the
	// record, so that the record names only what the pool may hold.
	pending *net.IPNet
	// skip are addresses found reserved by another pod (an overlapping
	// range): never chosen again by this member.
	skip []net.IP
	// done is closed once out is the member's outcome.
	done chan struct{}
	out  outcome
}

// enqueue waits until m is allocated or has failed.
func (a *Batcher) enqueue(m *member) outcome {
	q := a.queues.Of(queueKey{m.store.Namespace(), m.pool})
	if q.Push(m) {
		a.goAside(func() { a.work(q) })
	}
	a.wait(m.done)
	return m.out
}

// requeue puts m back for the next round (its address was taken elsewhere).
func (a *Batcher) requeue(q *queue, m *member) { q.Requeue(m) }

// work writes rounds for q until no member waits.
func (a *Batcher) work(q *queue) {
	for round := q.Take(nil); round != nil; round = q.Take(nil) {
		a.commit(q, round)
	}
}

// deliver ends a member's wait. Every member is delivered exactly once.
func deliver(m *member, ip net.IPNet, err error) {
	m.out = outcome{ip: ip, err: err}
	close(m.done)
}

// giveUp ends the wait of a member for which nothing was written: the
// address an earlier round chose for it (its patch conflicted) leaves its
// record first. Left there, the record would name an address the pool may
// give another interface of the sandbox (whereabouts v0.7.0's CRD prunes the
// ifname, so entries are told apart by the addresses recorded), and the
// attachment's DEL would release that interface's entry.
func giveUp(m *member, err error) {
	if m.pending != nil && m.unchosen != nil {
		if ferr := m.unchosen(*m.pending); ferr != nil {
			err = fmt.Errorf("%w; and %s, chosen and not written, stays in the record: %v", err, m.pending.IP, ferr)
		} else {
			m.pending = nil
		}
	}
	deliver(m, net.IPNet{}, err)
}

// live drops the members whose ADD gave up (its client went away, its
// timeout passed) before anything is written for them.
func live(batch []*member) []*member {
	out := batch[:0]
	for _, m := range batch {
		if err := m.ctx.Err(); err != nil {
			giveUp(m, fmt.Errorf("allocate in pool %s: %w", m.pool, err))
			continue
		}
		out = append(out, m)
	}
	return out
}

// choice is what one round chose for a member.
type choice struct {
	m      *member
	ip     net.IPNet
	offset string
	kind   kind
	// written is the resourceVersion of the pool as the round wrote it.
	written string
}

// kind is what a choice writes to the pool.
type kind int

const (
	// added: a new entry at a free offset.
	added kind = iota
	// rewritten: the pod's entry on this interface taken over with the new
	// container ID, as whereabouts v0.8.0 and later do.
	rewritten
	// held: the container's own entry already (an ADD run again): nothing to write.
	held
)

// commit allocates batch in one pool: choose on the pool as last seen, write
// every choice in one guarded patch, re-read fresh and choose again on a
// conflict; then reserve each address.
func (a *Batcher) commit(q *queue, batch []*member) {
	store, pool, rng := batch[0].store, batch[0].pool, batch[0].rng.Range
	ctx := context.Background() // the group's own; each member's is checked before each write
	base, err := store.CachedPool(ctx, pool)
	if err == nil && base == nil {
		base, err = store.EnsurePool(ctx, pool, rng)
	}
	var chosen []choice
	// maybeWritten: the last patch failed in a way that does not say it
	// was not applied (a timeout): its choices stay in the records.
	maybeWritten := false
	for round := 1; err == nil; round++ {
		batch = live(batch)
		if len(batch) == 0 {
			return
		}
		var failed []failure
		var later []*member
		chosen, failed, later = a.choose(base, batch)
		for _, f := range failed {
			batch = without(batch, f.m)
			giveUp(f.m, f.err)
		}
		for _, m := range later {
			batch = without(batch, m)
			a.requeue(q, m)
		}
		if len(chosen) == 0 {
			return
		}
		var as []shim.Assignment
		for _, c := range chosen {
			if c.kind == held {
				continue
			}
			as = append(as, shim.Assignment{Offset: c.offset, Rewrite: c.kind == rewritten,
				Entry: shim.IPAllocation{ContainerID: c.m.containerID, PodRef: c.m.podRef, IfName: c.m.ifName}})
		}
		a.at("alloc-before-patch")
		var written *shim.Pool
		written, err = store.Assign(ctx, base, as)
		if err == nil {
			for i := range chosen {
				chosen[i].written = written.ResourceVersion
				chosen[i].m.pending = nil
			}
			a.at("alloc-after-patch")
			break
		}
		if shim.IsGone(err) && round < a.o.Rounds {
			// The pool was deleted under the copy: whereabouts never fails
			// an ADD for a pool that does not exist; it creates it.
			base, err = store.EnsurePool(ctx, pool, rng)
			chosen = nil
			continue
		}
		if !shim.IsConflict(err) && !shim.IsGone(err) {
			maybeWritten = true
		}
		if !shim.IsConflict(err) || round >= a.o.Rounds {
			break
		}
		// Someone else wrote the pool: read it fresh (never the cache again:
		// it may still lag) and choose again.
		if err = store.Pause(ctx, backoff(round)); err != nil {
			break
		}
		base, err = store.EnsurePool(ctx, pool, rng)
		chosen = nil
	}
	if err != nil {
		err = storeError(fmt.Sprintf("allocate in pool %s/%s", store.Namespace(), pool), err)
		for _, m := range batch {
			if maybeWritten {
				deliver(m, net.IPNet{}, err)
			} else {
				giveUp(m, err)
			}
		}
		return
	}
	a.reserve(q, chosen)
}

// backoff is the pause before round+1: short, since the group waits, and
// jittered by nothing: the conflicting writer is already done.
func backoff(round int) time.Duration {
	d := time.Duration(round) * 5 * time.Millisecond
	if d > 100*time.Millisecond {
		d = 100 * time.Millisecond
	}
	return d
}

type failure struct {
	m   *member
	err error
}

// choose runs whereabouts' allocator for each member in turn on the pool's
// entries plus what the members before it chose. A member whose range is
// full fails alone; one whose checkpoint cannot record its address too. A
// member that would take over an entry another member of this round adds
// (two sandboxes of one pod at once, which the kubelet never makes) waits
// for the next round.
func (a *Batcher) choose(base *shim.Pool, batch []*member) (chosen []choice, failed []failure, later []*member) {
	first, _, err := net.ParseCIDR(base.Spec.Range)
	if err != nil {
		for _, m := range batch {
			failed = append(failed, failure{m, fmt.Errorf("pool %s has range %q: %w", base.Name, base.Spec.Range, err)})
		}
		return nil, failed, nil
	}
	list := reservations(base.Spec.Allocations, first)
	for _, m := range batch {
		// The pool as it is written on (the patch tests this version) is
		// where the ADD's "no earlier sandbox" is decided: its reclaim may
		// have looked at a copy that was behind.
		if earlier := shim.EarlierSandboxes(m.podRef, m.containerID, m.ifName)(base); len(earlier) > 0 {
			failed = append(failed, failure{m, fmt.Errorf("allocate in pool %s/%s for %s: %w (offsets %s)",
				base.Namespace, base.Name, m.podRef, shim.ErrEarlierSandbox, strings.Join(earlier, ", "))})
			continue
		}
		if c, ok := ownPruned(base, first, m); ok {
			chosen = append(chosen, c)
			continue
		}
		c, err := a.chooseOne(base, first, list, m)
		if err != nil {
			failed = append(failed, failure{m, err})
			continue
		}
		switch c.kind {
		case added:
			if m.chosen != nil {
				if err := a.replacePending(m, c.ip); err != nil {
					failed = append(failed, failure{m, err})
					continue
				}
				if err := m.chosen(c.ip); err != nil {
					failed = append(failed, failure{m, fmt.Errorf("record %s before writing it: %w", c.ip.IP, err)})
					continue
				}
				ip := c.ip
				m.pending = &ip
			}
			list = append(list, wbtypes.IPReservation{IP: c.ip.IP, ContainerID: m.containerID, PodRef: m.podRef, IfName: m.ifName})
		case rewritten:
			if _, inBase := base.Spec.Allocations[c.offset]; !inBase {
				later = append(later, m)
				continue
			}
			for i := range list {
				if list[i].IP.Equal(c.ip.IP) {
					list[i].ContainerID = m.containerID
				}
			}
		}
		chosen = append(chosen, c)
	}
	return chosen, failed, later
}

// ownPruned finds the attachment's own entry that whereabouts' allocator
// cannot see as its own: one of the container without an ifname (an old
// CRD pruned it) at an address the attachment's record names, written by an
// earlier ask of the same ADD. It is held: given again, nothing written.
func ownPruned(base *shim.Pool, first net.IP, m *member) (choice, bool) {
	if len(m.recorded) == 0 {
		return choice{}, false
	}
	_, rng, err := net.ParseCIDR(m.rng.Range)
	if err != nil {
		return choice{}, false
	}
	for _, off := range shim.FindAttachment(base, m.containerID, m.ifName, m.recorded, nil).Offsets {
		if base.Spec.Allocations[off].IfName != "" {
			continue // whereabouts' allocator sees it
		}
		ip, err := shim.OffsetIP(first, off)
		if err != nil || !rng.Contains(ip) {
			continue
		}
		return choice{m: m, ip: net.IPNet{IP: ip, Mask: rng.Mask}, offset: off, kind: held}, true
	}
	return choice{}, false
}

// replacePending takes the member's pending address out of its record when
// it now chooses another: a choice a conflict made the round give up (its
// patch wrote nothing), or an address given up to another pod's
// reservation. Left there, the record would name an address the pool gives
// another interface of the sandbox (whereabouts v0.7.0's CRD prunes the
// ifname, so entries are told apart by the addresses recorded), and a
// release of this one would take it.
func (a *Batcher) replacePending(m *member, ip net.IPNet) error {
	if m.pending == nil || m.pending.IP.Equal(ip.IP) || m.unchosen == nil {
		return nil
	}
	if err := m.unchosen(*m.pending); err != nil {
		return fmt.Errorf("take %s, not written, out of the record: %w", m.pending.IP, err)
	}
	m.pending = nil
	return nil
}

// chooseOne runs whereabouts' allocator for m on list, which it leaves as
// it was. Addresses m must skip, and those the cache shows reserved by
// another pod, are placeholders for this member's choice only. The cache
// never decides that an address is taken: before the range is reported
// full, what it excluded is read fresh, and an address no other pod holds
// is chosen again.
func (a *Batcher) chooseOne(base *shim.Pool, first net.IP, list []wbtypes.IPReservation, m *member) (choice, error) {
	extra := make([]wbtypes.IPReservation, 0, len(m.skip))
	for _, ip := range m.skip {
		extra = append(extra, wbtypes.IPReservation{IP: ip, IsAllocated: true})
	}
	var hinted []net.IP          // excluded on the cache's word
	checked := map[string]bool{} // read fresh: no other pod's
	for {
		try := append(append(make([]wbtypes.IPReservation, 0, len(list)+len(extra)+1), list...), extra...)
		ipnet, updated, err := allocate.AssignIP(m.rng, try, m.containerID, m.podRef, m.ifName)
		if err != nil {
			if len(hinted) == 0 {
				return choice{}, rangeFull(err)
			}
			free, ferr := a.notReservedElsewhere(base.Namespace, m, hinted)
			if ferr != nil {
				return choice{}, ferr
			}
			if len(free) == 0 {
				return choice{}, rangeFull(err)
			}
			for _, ip := range free {
				checked[ip.String()] = true
			}
			extra, hinted = withoutIPs(extra, free), nil
			continue
		}
		off, err := offsetOf(ipnet.IP, first)
		if err != nil {
			return choice{}, err
		}
		if len(updated) == len(try) {
			// The pod's entry on this interface already: whereabouts hands it over.
			k := rewritten
			if e, ok := base.Spec.Allocations[off]; ok && e.ContainerID == m.containerID {
				k = held
			}
			return choice{m: m, ip: ipnet, offset: off, kind: k}, nil
		}
		if m.overlapping && !checked[ipnet.IP.String()] && a.reservedElsewhere(base.Namespace, m, ipnet.IP) {
			extra = append(extra, wbtypes.IPReservation{IP: ipnet.IP, IsAllocated: true})
			hinted = append(hinted, ipnet.IP)
			continue
		}
		return choice{m: m, ip: ipnet, offset: off, kind: added}, nil
	}
}

// notReservedElsewhere are the addresses of ips whose reservation, read
// fresh, no other pod holds.
func (a *Batcher) notReservedElsewhere(namespace string, m *member, ips []net.IP) ([]net.IP, error) {
	var free []net.IP
	for _, ip := range ips {
		o, err := m.store.Reservation(m.ctx, names.Reservation(ip, m.network))
		if err != nil {
			return nil, storeError(fmt.Sprintf("read the reservation of %s in %s", ip, namespace), err)
		}
		if o == nil || o.Spec.PodRef == m.podRef {
			free = append(free, ip)
		}
	}
	return free, nil
}

// withoutIPs is rs less the placeholders of ips.
func withoutIPs(rs []wbtypes.IPReservation, ips []net.IP) []wbtypes.IPReservation {
	out := rs[:0:0]
	for _, r := range rs {
		if !slices.ContainsFunc(ips, r.IP.Equal) {
			out = append(out, r)
		}
	}
	return out
}

// reservedElsewhere says whether the cache shows ip reserved by another pod.
func (a *Batcher) reservedElsewhere(namespace string, m *member, ip net.IP) bool {
	if a.o.Reserved == nil {
		return false
	}
	o := a.o.Reserved(namespace, names.Reservation(ip, m.network))
	return o != nil && o.Spec.PodRef != m.podRef
}

// reservations is a pool's entries as whereabouts' allocator takes them.
// Offsets that are not decimal numbers are skipped, as whereabouts does.
func reservations(allocs map[string]shim.IPAllocation, first net.IP) []wbtypes.IPReservation {
	out := make([]wbtypes.IPReservation, 0, len(allocs)+8)
	offs := make([]string, 0, len(allocs))
	for off := range allocs {
		offs = append(offs, off)
	}
	sort.Strings(offs) // a fixed order: the same pool, the same choices
	for _, off := range offs {
		n, err := strconv.ParseInt(off, 10, 64)
		if err != nil {
			continue
		}
		a := allocs[off]
		out = append(out, wbtypes.IPReservation{IP: iphelpers.IPAddOffset(first, uint64(n)), ContainerID: a.ContainerID, PodRef: a.PodRef, IfName: a.IfName})
	}
	return out
}

// offsetOf is the decimal offset whereabouts stores ip at.
func offsetOf(ip, first net.IP) (string, error) {
	n, err := iphelpers.IPGetOffset(ip, first)
	if err != nil {
		return "", err
	}
	return strconv.FormatUint(n, 10), nil
}

func without(batch []*member, m *member) []*member {
	out := batch[:0]
	for _, x := range batch {
		if x != m {
			out = append(out, x)
		}
	}
	return out
}
