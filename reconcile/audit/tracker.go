package audit

import (
	"sort"
	"time"
)

// DefaultGrace is how long a finding must last before it is open, for
// every kind but Headroom: longer than any ADD takes between its pool entry
// and Multus' network-status, any DEL between its reservation and its
// entry, any sandbox's re-creation.
const DefaultGrace = 30 * time.Second

// DefaultHeadroomGrace is Headroom's: an upgrade or a storm takes addresses
// for minutes, and a range short for that long is short.
const DefaultHeadroomGrace = 10 * time.Minute

// DefaultGraces are the graces of every kind.
func DefaultGraces() map[Kind]time.Duration {
	out := map[Kind]time.Duration{}
	for _, k := range Kinds {
		out[k] = DefaultGrace
	}
	out[Headroom] = DefaultHeadroomGrace
	return out
}

// Tracker keeps, between looks, when each finding was first seen. It is the
// reconciler's rule for leaks (seen twice, and for a grace) in memory: the
// audit writes nothing, so its sightings are not kept on the objects as the
// reconciler's are (shim/reconcile's sightings), and a restart sees each
// finding anew. The zero value is not usable: call NewTracker.
type Tracker struct {
	graces map[Kind]time.Duration
	seen   map[string]*sighting
}

type sighting struct {
	first time.Time
	looks int
	open  bool
	f     Finding
}

// NewTracker tracks findings with the given graces (a kind left out: its
// default).
func NewTracker(graces map[Kind]time.Duration) *Tracker {
	g := DefaultGraces()
	for k, d := range graces {
		g[k] = d
	}
	return &Tracker{graces: g, seen: map[string]*sighting{}}
}

// Grace is a kind's.
func (t *Tracker) Grace(k Kind) time.Duration { return t.graces[k] }

// Change is what a look changed.
type Change struct {
	// Open are every open finding, Opened those that opened at this look
	// (an Event each), Closed those open before that this look did not see.
	Open   []Open
	Opened []Open
	Closed []Finding
	// Pending counts the findings seen but not open yet; NextDue is when
	// the first of them is due (zero when none): look again then.
	Pending int
	NextDue time.Time
}

// Observe records one look's findings at now. A finding is open once it
// has been seen in two looks, the first at least its grace ago; one that a
// look does not see is forgotten (its grace starts again if it comes back).
func (t *Tracker) Observe(now time.Time, found []Finding) Change {
	var c Change
	keep := make(map[string]*sighting, len(found))
	for _, f := range found {
		k := f.Key()
		if _, dup := keep[k]; dup {
			continue
		}
		s := t.seen[k]
		if s == nil {
			s = &sighting{first: now}
		}
		s.looks++
		s.f = f
		due := s.first.Add(t.graces[f.Kind])
		switch {
		case s.looks >= 2 && !now.Before(due):
			o := Open{Finding: f, Since: s.first}
			c.Open = append(c.Open, o)
			if !s.open {
				c.Opened = append(c.Opened, o)
			}
			s.open = true
		default:
			c.Pending++
			if s.looks < 2 && !now.Before(due) {
				due = now // seen once, already old: the next look opens it
			}
			if c.NextDue.IsZero() || due.Before(c.NextDue) {
				c.NextDue = due
			}
		}
		keep[k] = s
	}
	for k, s := range t.seen {
		if _, ok := keep[k]; !ok && s.open {
			c.Closed = append(c.Closed, s.f)
		}
	}
	t.seen = keep
	sort.SliceStable(c.Closed, func(i, j int) bool { return c.Closed[i].Key() < c.Closed[j].Key() })
	return c
}
