package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// whereabouts' ip-control-loop runs on every node beside harvester-ipam, and
// its NADs name whereabouts (harvester-ipam stands in for the binary), so
// its pod controller acts on the same pools. Modelled as its source reads
// (pkg/controlloop/pod.go):
//
//   - on a pod's deletion, as its informer delivers it (the last object, so
//     the network-status of then), for each non-default interface of that
//     status: the NAD from its informer (gone: the item fails, is retried
//     three times, rate-limited, then dropped), the pool from its informer (a
//     cached read), and for each entry whose podref is the pod: a fresh GET
//     of the pod (a pod of that name exists again: skip the entry), then
//     whereabouts' own deallocation of the entry's container ID and ifname,
//     under its Lease, on a fresh read (fake.Whereabouts.Del on v0.9.3);
//   - v0.8.0 and v0.7.0 build that deallocation without the container ID (and
//     without the pool's namespace): it matches no entry and releases
//     nothing, so the model runs no pod controller for them.
//
// The pod controller is a process: it can crash (its queue is lost with
// it; the informer's next list does not deliver deletions again) and its
// requests see the API server's faults.
//
// A force-deleted pod's sandbox is still being stopped when the deletion
// reaches the pod controller: its interface keeps the address until its DEL.
// The pod controller frees that entry all the same (whereabouts alone does
// too), so from then on the attachment is not counted live: the address may
// be handed to another pod while the old interface still has it, a hazard of
// whereabouts' own that the trace and the stats name.

// podDeleted hands a pod's deletion to the pod controller.
func (w *world) podDeleted(p *pod) {
	if !w.o.PodController || w.o.Whereabouts != fake.V093 {
		return
	}
	// The informer's copy: the pod's interfaces and network-status then.
	status := map[string][]string{}
	nets := map[string]*network{}
	for ifn, ips := range p.status {
		status[ifn], nets[ifn] = ips, p.nets[ifn]
	}
	w.s.spawn("ip-control-loop "+p.name, func(a *actor) {
		a.sleep(time.Duration(1+w.s.pick(500)) * time.Millisecond) // the watch's delivery
		for attempt := 0; ; attempt++ {
			err := w.collectPod(a, p, status, nets)
			if a.killed {
				return
			}
			if err == nil {
				return
			}
			w.tr.add("ip-control-loop: %s: %v", p.ref(), err)
			if attempt >= 3 { // requeued while NumRequeues <= maxRetries (2): then dropped, with an Event
				return
			}
			a.sleep(time.Duration(5<<attempt) * time.Millisecond) // the workqueue's backoff
		}
	})
}

// collectPod is garbageCollectPodIPs of one deleted pod.
func (w *world) collectPod(a *actor, p *pod, status map[string][]string, nets map[string]*network) error {
	ctx := context.Background()
	for _, ifn := range sortedKeys(status) {
		n := nets[ifn]
		if n == nil || n.deleted {
			return fmt.Errorf("failed to get network-attachment-definition for iface %s: not found", ifn)
		}
		// Every pool of the NAD's ranges first, from its informer.
		var pools []*shim.Pool
		for _, name := range n.pools() {
			pool, err := w.api.GetPool(ctx, poolNS, name, shim.Cache)
			if err != nil {
				return fmt.Errorf("failed to get the IPPool data: %w", err)
			}
			if pool == nil {
				return fmt.Errorf("failed to get the IPPool data: %s not found", name)
			}
			pools = append(pools, pool)
		}
		for _, pool := range pools {
			if err := w.collectIn(a, p, n, pool); err != nil || a.killed {
				return err
			}
		}
	}
	return nil
}

// collectIn releases, in one pool of n, the entries of the deleted pod p:
// each by whereabouts' own deallocation of its container and ifname over
// every range of the NAD (which stops at the first range without the
// container's entry).
func (w *world) collectIn(a *actor, p *pod, n *network, pool *shim.Pool) error {
	ctx := context.Background()
	c := cluster{w}
	wb := &fake.Whereabouts{API: w.api, Version: w.o.Whereabouts, Namespace: poolNS, Options: w.options(""), Pick: w.s.pick}
	for _, off := range sortedKeys(pool.Spec.Allocations) {
		e := pool.Spec.Allocations[off]
		if e.PodRef != p.ref() && !w.o.podControllerFreesAll {
			continue
		}
		np, err := c.Pod(ctx, p.ns, p.name)
		if err != nil {
			return fmt.Errorf("failed to get pod to verify allocation: %w", err)
		}
		if np != nil {
			continue // a pod of that name again: not its to release
		}
		w.freesStopping(p, e, pool.Name)
		a.whereabouts = w.attachmentOf(e.ContainerID, e.IfName, pool.Name)
		wb.Del(ctx, n.request(e.ContainerID, e.IfName, p.ref()))
		a.whereabouts = nil
		if a.killed {
			return nil
		}
		w.tr.add("ip-control-loop: deallocated %s/%s of %s (%s) in %s", e.ContainerID, e.IfName, e.PodRef, off, pool.Name)
		w.stats["pod controller releases"]++
	}
	return nil
}

// freesStopping marks the attachment whose entry e in pool the pod
// controller is about to free while its sandbox is still being stopped.
// The pod is gone from the API, but a force-deleted pod's sandbox may
// still be being stopped, its interface up: whereabouts releases its
// address all the same, whereabouts alone as beside harvester-ipam.
// Counted and traced, not the product's to keep.
func (w *world) freesStopping(p *pod, e shim.IPAllocation, pool string) {
	for _, sb := range w.sbs {
		if sb.pod != p || sb.id != e.ContainerID || sb.state != sbDead || !sb.netns {
			continue
		}
		for _, att := range sb.atts {
			if att.ifname == e.IfName && att.net.hasPool(pool) && att.ips != nil && !att.delStarted && !att.podControllerFreed {
				att.podControllerFreed = true
				w.tr.add("ip-control-loop: %s is still being stopped: its entry is whereabouts' pod controller's to free now", att)
				w.stats["pod controller frees a stopping sandbox"]++
			}
		}
	}
}

// request is whereabouts' request of an attachment of n: its config's
// ranges, network_name and enable_overlapping_ranges.
func (n *network) request(containerID, ifName, podRef string) fake.Request {
	r := fake.Request{ContainerID: containerID, IfName: ifName, PodRef: podRef, Range: n.rng, Exclude: n.exclude,
		NetworkName: n.netName, NoOverlapping: n.noOverlap}
	for _, m := range n.more {
		r.IPRanges = append(r.IPRanges, fake.Range{Range: m.cidr, Exclude: m.exclude})
	}
	return r
}
