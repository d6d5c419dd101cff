package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
)

// The audit's checker (Options.Audit): the audit (package audit) looks at
// the simulated world as it would at a cluster (snapshot.go), its Tracker
// fed with the simulated time, and its verdicts are held to the model's
// ground truth (truth.go) at every look:
//
//   - no false alarm: a finding the Tracker opens must be one of the
//     inconsistencies the model knows the world has at that moment (a
//     fact); one that is not is a violation naming the finding;
//   - no miss: a fact present at every look since it arose must be among
//     the open findings at every look from its grace on, once two looks
//     saw it (the Tracker's rule; the checker looks when it is due: so
//     within the grace and one look); one that is not is a violation
//     naming the fact.
//
// Headroom is a figure, not an inconsistency of the addresses: an opened
// one is counted, not judged.
//
// A look happens as the Deployment's watch mode looks (reconcile/watch
// Auditor.Run): a second (lookSettle) after a change of what the audit or
// the ground truth reads (the world's fingerprint, taken after every step),
// so that a burst of changes is one look; and when a pending finding or a
// fact is due though nothing changed. The scheduler stops its clock for
// either (sched.lookAt). A look reads the world outside any actor and
// draws nothing from the schedule's random source: every story is the same
// with it and without, and the regression seeds play as they did.

// auditor is the checker of one schedule.
type auditor struct {
	w       *world
	tracker *audit.Tracker
	judge   func(audit.Snapshot, audit.Options) audit.Result
	// facts are the inconsistencies seen at the last look, by key, each
	// with its first sighting (at every look since).
	facts  map[string]*fact
	sig    uint64
	looked bool
	// pending is when the look after a change is (zero: none); due is when
	// a look must happen though nothing changed: a pending finding's or a
	// fact's grace ends.
	pending, due time.Time
	// nads are the NADs as last read, for the networks as they were then
	// (nadsOf).
	nads   []reconcile.NAD
	nadsOf string
	// order shuffles every list a look reads (NADs, pools, reservations,
	// pods), as an informer store's List returns them in an order that
	// changes from look to look (issue 44): a finding is a function of the
	// world, not of that order. nil: in the order the world keeps.
	order *rand.Rand
	// restarts, when set, restarts the API server now and then, from a
	// source of its own (issue 44): each informer the audit reads (the
	// NADs, pools, reservations, pods, nodes) then holds what it had until
	// it follows again, each on its own backoff, up to a minute, as
	// client-go's reflectors reconnect. The audit judges only while every
	// one follows (watch.Following: Auditor.Look judges nothing meanwhile;
	// what was open stays open, what was pending waits), and so does this
	// look, unless judgeBehind (a test's audit without that rule), which
	// judges the mix.
	restarts    *rand.Rand
	out         *outage
	judgeBehind bool
}

// outage is an API server restart the audit reads through: what each
// informer held when it stopped following, and when each follows again.
type outage struct {
	stale audit.Snapshot
	until map[string]time.Time
	end   time.Time // the last of until
}

// informerLists are the lists a look reads, each an informer of its own.
var informerLists = []string{"nads", "pools", "reservations", "pods", "nodes"}

// restartEvery is the chance of an API server restart at a look (one in
// restartEvery), when none is under way.
const restartEvery = 8

// through is the fresh snapshot as the audit's informers show it now, and
// whether one of them is behind: during an outage, a list whose informer
// has not followed again yet is the one it held.
func (au *auditor) through(now time.Time, fresh audit.Snapshot) (audit.Snapshot, bool) {
	if au.restarts == nil {
		return fresh, false
	}
	if au.out == nil {
		if au.restarts.IntN(restartEvery) != 0 {
			return fresh, false
		}
		o := &outage{stale: staleCopy(fresh), until: map[string]time.Time{}}
		for _, l := range informerLists {
			o.until[l] = now.Add(time.Duration(1+au.restarts.IntN(60_000)) * time.Millisecond)
			if o.until[l].After(o.end) {
				o.end = o.until[l]
			}
		}
		au.out = o
		au.w.stats["audit: API server restarts"]++
		au.w.tr.add("audit: the API server restarts; its informers follow again by %s", o.end.Format("15:04:05.000"))
	}
	o, mixed, behind := au.out, fresh, false
	for _, l := range informerLists {
		if !now.Before(o.until[l]) {
			continue
		}
		behind = true
		switch l {
		case "nads":
			mixed.NADs = o.stale.NADs
		case "pools":
			mixed.Pools = o.stale.Pools
		case "reservations":
			mixed.Reservations = o.stale.Reservations
		case "pods":
			mixed.Pods = o.stale.Pods
		case "nodes":
			mixed.Nodes = o.stale.Nodes
		}
	}
	if !behind {
		au.out = nil
		// What the audit now sees, it sees for the first time since the
		// outage as far as the checker holds it to a grace: a fact's
		// grace starts again at this look (the Tracker may open one it
		// saw before sooner, which is no false alarm).
		au.facts = map[string]*fact{}
	}
	return mixed, behind
}

// staleCopy is s held by the informers: copies the world's later writes
// do not reach.
func staleCopy(s audit.Snapshot) audit.Snapshot {
	c := s
	c.NADs = append([]reconcile.NAD(nil), s.NADs...)
	c.Pools = make([]shim.Pool, len(s.Pools))
	for i := range s.Pools {
		c.Pools[i] = *s.Pools[i].DeepCopy()
	}
	c.Reservations = make([]shim.Reservation, len(s.Reservations))
	for i := range s.Reservations {
		c.Reservations[i] = *s.Reservations[i].DeepCopy()
	}
	c.Pods = make([]*corev1.Pod, len(s.Pods))
	for i, p := range s.Pods {
		c.Pods[i] = p.DeepCopy()
	}
	return c
}

// lookSettle is how long after a change the look is: the watch mode's
// settle (reconcile/watch setup).
const lookSettle = time.Second

func newAuditor(w *world) *auditor {
	au := &auditor{w: w, tracker: audit.NewTracker(nil), judge: audit.Judge, facts: map[string]*fact{}}
	if w.o.auditJudge != nil {
		au.judge = w.o.auditJudge
	}
	return au
}

// nextLook is when the scheduler must stop its clock for a look (zero:
// none is due).
func (au *auditor) nextLook() time.Time {
	if au.pending.IsZero() || !au.due.IsZero() && au.due.Before(au.pending) {
		return au.due
	}
	return au.pending
}

// look judges the world once, if it changed or a look is due, and returns
// what the audit got wrong.
func (au *auditor) look() []string {
	w := au.w
	now := w.s.now
	if sig := w.fingerprint(); !au.looked || sig != au.sig {
		au.looked, au.sig = true, sig
		if au.pending.IsZero() {
			au.pending = now.Add(lookSettle)
		}
	}
	if !reached(now, au.pending) && !reached(now, au.due) {
		return nil
	}
	au.pending = time.Time{}
	w.stats["audit: looks"]++
	snap := w.snapshot(au.nadsNow())
	seen, behind := au.through(now, snap)
	if behind && !au.judgeBehind {
		// Judge nothing, as Auditor.Look: look again when every informer
		// follows (the source pokes the audit then).
		w.stats["audit: looks while an informer is behind, not judged"]++
		au.due = au.out.end
		return nil
	}
	if behind {
		w.stats["audit: looks while an informer is behind, judged"]++
	}
	ch := au.tracker.Observe(now, au.judge(au.shuffled(seen), audit.Options{}).Findings)
	facts := w.facts(snap)
	for k, f := range facts {
		f.looks = 1
		if old := au.facts[k]; old != nil {
			f.since, f.reported, f.looks = old.since, old.reported, old.looks+1
			continue
		}
		f.since = now
		w.stats["audit: inconsistencies it must report: "+string(f.kind)]++
	}
	au.facts = facts
	var bad []string
	for _, o := range ch.Opened {
		bad = append(bad, au.opened(o, facts)...)
	}
	au.due = ch.NextDue
	if reached(now, au.due) {
		// Seen once, already past its grace: the next look opens it, as
		// the watch mode's comes (a settle later).
		au.due = now.Add(lookSettle)
	}
	for _, k := range sortedKeys(facts) {
		f := facts[k]
		due := f.since.Add(au.tracker.Grace(f.kind))
		if f.looks < 2 && !now.Before(due) {
			due = now.Add(lookSettle) // the Tracker's second look
		}
		if now.Before(due) {
			if au.due.IsZero() || due.Before(au.due) {
				au.due = due
			}
			continue
		}
		if reported(ch.Open, f) {
			if !f.reported {
				f.reported = true
				w.stats["audit: inconsistencies reported within the grace: "+string(f.kind)]++
			}
			continue
		}
		bad = append(bad, fmt.Sprintf("the audit missed %s, true since %s (%s ago, its grace %s): %s",
			f, f.since.Format("15:04:05.000"), now.Sub(f.since), au.tracker.Grace(f.kind), f.what))
	}
	return bad
}

// shuffled is s with each list in another order, in slices of its own.
func (au *auditor) shuffled(s audit.Snapshot) audit.Snapshot {
	if au.order == nil {
		return s
	}
	r := au.order
	s.NADs = append([]reconcile.NAD(nil), s.NADs...)
	s.Pools = append([]shim.Pool(nil), s.Pools...)
	s.Reservations = append([]shim.Reservation(nil), s.Reservations...)
	s.Pods = append([]*corev1.Pod(nil), s.Pods...)
	r.Shuffle(len(s.NADs), func(i, j int) { s.NADs[i], s.NADs[j] = s.NADs[j], s.NADs[i] })
	r.Shuffle(len(s.Pools), func(i, j int) { s.Pools[i], s.Pools[j] = s.Pools[j], s.Pools[i] })
	r.Shuffle(len(s.Reservations), func(i, j int) { s.Reservations[i], s.Reservations[j] = s.Reservations[j], s.Reservations[i] })
	r.Shuffle(len(s.Pods), func(i, j int) { s.Pods[i], s.Pods[j] = s.Pods[j], s.Pods[i] })
	return s
}

// reached says whether a time set is now or past.
func reached(now, t time.Time) bool { return !t.IsZero() && !now.Before(t) }

// nadsNow are the NADs, read again only when a network changed.
func (au *auditor) nadsNow() []reconcile.NAD {
	var b strings.Builder
	for _, n := range au.w.nets {
		fmt.Fprintf(&b, "%s=%v,", n.name, n.deleted)
	}
	if b.String() != au.nadsOf || au.nads == nil {
		au.nads, au.nadsOf = au.w.auditNADs(), b.String()
	}
	return au.nads
}

// opened judges a finding the Tracker opened at this look.
func (au *auditor) opened(o audit.Open, facts map[string]*fact) []string {
	w := au.w
	w.tr.add("audit: opened %s %s %s %v", o.Kind, o.Network, o.Address, o.Pods)
	if o.Kind == audit.Headroom {
		w.stats["audit: findings opened, not judged: Headroom"]++
		return nil
	}
	for _, k := range sortedKeys(facts) {
		if facts[k].matches(o.Finding) {
			w.stats["audit: findings opened, true: "+string(o.Kind)]++
			return nil
		}
	}
	w.stats["audit: findings opened, false: "+string(o.Kind)]++
	return []string{fmt.Sprintf("the audit opened a finding the world does not bear out (no such inconsistency in the model): %s on %s, pool %s, address %q, pods %v, seen since %s: %s",
		o.Kind, o.Network, o.Pool, o.Address, o.Pods, o.Since.Format("15:04:05.000"), o.Message)}
}

// reported says whether an open finding is the fact's.
func reported(open []audit.Open, f *fact) bool {
	for _, o := range open {
		if f.matches(o.Finding) {
			return true
		}
	}
	return false
}

// fact is an inconsistency the model knows the world has, which the audit
// is right to report.
type fact struct {
	kind    audit.Kind
	network string // the NAD (namespace/name), for MissingAddress
	pods    []string
	addr    string
	// key identifies it across looks; it changes where the audit's key
	// changes (another holder, another container): then its grace starts
	// again, as the audit's does.
	key  string
	what string
	// since is its first sighting, looks how many looks saw it since;
	// reported: an open finding matched it.
	since    time.Time
	looks    int
	reported bool
}

func (f *fact) String() string {
	return fmt.Sprintf("%s of %v at %q", f.kind, f.pods, f.addr)
}

// matches says whether a finding reports f: the same kind, pods and
// address (a finding may name more pods than the model's fact).
func (f *fact) matches(x audit.Finding) bool {
	if x.Kind != f.kind || len(x.Pods) == 0 {
		return false
	}
	switch f.kind {
	case audit.SharedAddress:
		n := 0
		for _, p := range f.pods {
			if contains(x.Pods, p) {
				n++
			}
		}
		return x.Address == f.addr && n >= 2
	case audit.MissingAddress:
		return x.Pods[0] == f.pods[0] && x.Network == f.network
	case audit.PodPoolMismatch:
		return x.Pods[0] == f.pods[0] && (f.addr == "" || x.Address == f.addr)
	case audit.EntryReservationMismatch:
		return x.Address == f.addr && contains(x.Pods, f.pods[0])
	}
	return false
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// fingerprint sums what the snapshot and the ground truth read: the API's
// latest revision of pools and reservations, the NADs, the nodes, every
// pod's and every sandbox's state. Equal fingerprints, equal looks.
func (w *world) fingerprint() uint64 {
	h := uint64(14695981039346656037)
	mix := func(v uint64) { h = (h ^ v) * 1099511628211 }
	str := func(s string) uint64 {
		g := uint64(14695981039346656037)
		for i := 0; i < len(s); i++ {
			g = (g ^ uint64(s[i])) * 1099511628211
		}
		return g
	}
	mixs := func(s string) { mix(str(s)) }
	mix(uint64(w.rev))
	for _, n := range w.nets {
		mix(b2u(n.deleted))
	}
	for _, n := range w.nodes {
		mix(b2u(n.exists))
	}
	for _, p := range w.all {
		mix(uint64(p.uid))
		mix(b2u(p.exists) | b2u(p.deletedGracefully)<<1 | b2u(p.current != nil)<<2 | b2u(p.statusOf != nil)<<3)
		if p.current != nil {
			mixs(p.current.id)
		}
		if p.statusOf != nil {
			mixs(p.statusOf.id)
		}
		// The interfaces in any order: a sum of each one's.
		var sum uint64
		for ifn, n := range p.nets {
			sum += str(ifn) ^ str(n.name)*31 ^ str(strings.Join(p.status[ifn], ","))*961
		}
		mix(sum)
	}
	for _, sb := range w.sbs {
		mix(uint64(sb.state) | b2u(sb.netns)<<3)
		for _, att := range sb.atts {
			mix(b2u(att.ips != nil) | b2u(att.delStarted)<<1 | b2u(att.freedByWhereabouts)<<2 | b2u(att.podControllerFreed)<<3)
		}
	}
	return h
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
