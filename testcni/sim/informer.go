package sim

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// The agent's informers, as client-go's reflector and shared informer
// deliver to the handlers agent/cache installs (cache.Objects.Watch): what
// the API server's watch can do, and nothing it cannot.
//
//   - One watch per resource (pools, reservations), each in the order of the
//     resourceVersions: a watch never reorders one resource's events, but
//     the two are independent, so a reservation may be seen before the pool
//     entry written just before it, or long after.
//   - Late: every event comes after a latency, now and then a long one (a
//     slow watch, an agent starved of CPU); the agent's own writes' answers
//     (cache.API) reach the copy first, and the older events arrive after.
//   - Lost: a watch breaks (the API server restarts, a timeout, 410 Gone)
//     and the events meanwhile are never delivered as such: after a backoff
//     the reflector lists again and replaces its store. The list is served
//     at a resourceVersion no older than the last one the informer saw, but
//     it may be older than the agent's own last write (the watch cache
//     lags): an old state delivered after a newer one, which SawPool's
//     resourceVersion guard must ignore. Objects the list lacks are
//     delivered as deletions of the informer's last state of them
//     (DeletedFinalStateUnknown, with that old resourceVersion).
//   - Duplicated: a relist delivers every object again, most at the version
//     already delivered.
//   - A deletion's event carries the object's last state at the
//     resourceVersion of the deletion, as the API server's watch sends it.
//
// The first list of a new agent may be served behind the latest too (a
// list at resourceVersion 0 is the watch cache's).

// change is one write the API server made, for the watches.
func (w *world) change(c fake.Change) {
	if c.Namespace != poolNS || (c.Resource != fake.Pools && c.Resource != fake.Reservations) {
		return
	}
	w.feed[c.Resource] = append(w.feed[c.Resource], c)
	w.rev = max(w.rev, c.Rev)
	if c.Resource == fake.Pools {
		p, _ := c.Object.(*shim.Pool)
		if a := w.s.cur; a != nil && a.adding != nil && p != nil {
			// An agent's patch applied: the entries it added, as written.
			for off, e := range a.adding {
				if _, ok := p.Spec.Allocations[off]; ok {
					w.agentWrote[c.Name+"/"+off] = e
				}
			}
			a.adding = nil
		}
		// An entry an agent wrote, once removed, is no longer its.
		for k := range w.agentWrote {
			if pool, off, _ := strings.Cut(k, "/"); pool == c.Name {
				if p == nil {
					delete(w.agentWrote, k)
				} else if _, ok := p.Spec.Allocations[off]; !ok {
					delete(w.agentWrote, k)
				}
			}
		}
	}
}

// informer is one agent's informer of one resource.
type informer struct {
	ag       *agentProc
	resource string
	// known is the informer's store: by name, the object last delivered.
	known map[string]any
	// next is the next event of the feed its watch delivers.
	next int
	// rv is the resourceVersion it has seen up to.
	rv int
}

func (inf *informer) run(a *actor) {
	w := inf.ag.w
	inf.list(a, true)
	for {
		a.waitFor(func() bool { return inf.next < len(w.feed[inf.resource]) })
		lat := time.Duration(w.s.pick(3)) * time.Millisecond
		if !w.quiet && w.o.Agents && w.s.chance(0.1) {
			lat = time.Duration(50+w.s.pick(2000)) * time.Millisecond
		}
		a.sleep(lat)
		if !w.quiet && w.o.Agents && w.s.chance(0.03) {
			undelivered := len(w.feed[inf.resource]) - inf.next
			backoff := time.Duration(200+w.s.pick(3000)) * time.Millisecond
			w.tr.add("the watch of %s breaks (%d events undelivered); it lists again in %s", inf.resource, undelivered, backoff)
			w.stats["informer: watches broken"]++
			inf.ag.broken++
			a.sleep(backoff)
			inf.list(a, false)
			inf.ag.broken--
			continue
		}
		inf.deliver(w.feed[inf.resource][inf.next])
		inf.next++
	}
}

// list is the reflector's list (retried with its backoff while the API
// server fails it) and the store's replacement by what it returned.
func (inf *informer) list(a *actor, first bool) {
	w := inf.ag.w
	for backoff := 800 * time.Millisecond; ; backoff = min(2*backoff, 30*time.Second) {
		var err error
		if inf.resource == fake.Pools {
			_, _, err = w.api.ListPools(context.Background(), poolNS, shim.Page{})
		} else {
			_, _, err = w.api.ListReservations(context.Background(), poolNS, shim.Page{})
		}
		if err == nil {
			break
		}
		a.sleep(backoff)
	}
	lo := inf.rv
	if first && !w.quiet {
		lo = max(0, w.rev-w.s.pick(5))
	}
	at := w.rev
	if !w.quiet && at > lo {
		at = lo + w.s.pick(at-lo+1)
	}
	listed := w.stateAt(inf.resource, at)
	w.stats["informer: lists"]++
	if at < w.rev {
		w.stats["informer: lists behind the latest"]++
	}
	for _, name := range sortedKeys(listed) {
		inf.known[name] = listed[name]
		inf.saw(listed[name])
	}
	for _, name := range sortedKeys(inf.known) {
		if _, ok := listed[name]; !ok {
			// DeletedFinalStateUnknown: the last state it knew.
			inf.gone(name, rvOf(inf.known[name]))
			delete(inf.known, name)
		}
	}
	feed := w.feed[inf.resource]
	inf.next = sort.Search(len(feed), func(i int) bool { return feed[i].Rev > at })
	inf.rv = at
	if inf.resource == fake.Pools {
		inf.ag.objs.Listed(poolNS)
	}
}

// deliver hands one watch event to the handlers.
func (inf *informer) deliver(c fake.Change) {
	inf.rv = c.Rev
	if c.Object != nil {
		inf.known[c.Name] = c.Object
		inf.saw(c.Object)
		return
	}
	delete(inf.known, c.Name)
	inf.gone(c.Name, strconv.Itoa(c.Rev))
}

// saw is the add and update handlers: a copy, as a watch decodes it.
func (inf *informer) saw(obj any) {
	switch o := obj.(type) {
	case *shim.Pool:
		inf.ag.objs.SawPool(o.DeepCopy())
		inf.ag.objs.WatchedPool(o.Namespace, o.ResourceVersion)
	case *shim.Reservation:
		inf.ag.objs.SawReservation(o.DeepCopy())
	}
}

// gone is the delete handler.
func (inf *informer) gone(name, rv string) {
	if inf.resource == fake.Pools {
		inf.ag.objs.GonePool(poolNS, name, rv)
		inf.ag.objs.WatchedPool(poolNS, rv)
	} else {
		inf.ag.objs.GoneReservation(poolNS, name, rv)
	}
}

// stateAt is a resource's objects as they were at resourceVersion rv.
func (w *world) stateAt(resource string, rv int) map[string]any {
	out := map[string]any{}
	for _, c := range w.feed[resource] {
		if c.Rev > rv {
			break
		}
		if c.Object == nil {
			delete(out, c.Name)
		} else {
			out[c.Name] = c.Object
		}
	}
	return out
}

func rvOf(obj any) string {
	switch o := obj.(type) {
	case *shim.Pool:
		return o.ResourceVersion
	case *shim.Reservation:
		return o.ResourceVersion
	}
	return ""
}
