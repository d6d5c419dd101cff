package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestTracker: a finding opens only once seen in two looks, the first at
// least its grace ago; a moment in flight (seen once, or gone by the next
// look) never opens; a change of hands starts the grace again.
func TestTracker(t *testing.T) {
	missing := Finding{Kind: MissingAddress, Network: storage, Pods: []string{"ns/p"}, detail: "uid-1"}
	recreated := missing
	recreated.detail = "uid-2"
	head := Finding{Kind: Headroom, Network: storage}
	type look struct {
		at     time.Duration // after t0
		found  []Finding
		open   int
		opened int
		closed int
		due    time.Duration // NextDue after t0; -1: none
	}
	tests := []struct {
		name  string
		looks []look
	}{
		{name: "seen twice, past the grace: open once", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 10 * time.Second, found: []Finding{missing}, due: 30 * time.Second},
			{at: 30 * time.Second, found: []Finding{missing}, open: 1, opened: 1, due: -1},
			{at: 40 * time.Second, found: []Finding{missing}, open: 1, due: -1},
			{at: 50 * time.Second, closed: 1, due: -1},
		}},
		{name: "false alarm: seen once (an ADD between its entry and its network-status)", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 31 * time.Second, due: -1},
			{at: 62 * time.Second, due: -1},
		}},
		{name: "false alarm: seen twice within the grace, then gone (a DEL under way)", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 29 * time.Second, found: []Finding{missing}, due: 30 * time.Second},
			{at: 31 * time.Second, due: -1},
		}},
		{name: "false alarm: a gap resets the grace", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 20 * time.Second, due: -1},
			{at: 40 * time.Second, found: []Finding{missing}, due: 70 * time.Second},
			{at: 50 * time.Second, found: []Finding{missing}, due: 70 * time.Second},
		}},
		{name: "a change of hands starts again", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 40 * time.Second, found: []Finding{recreated}, due: 70 * time.Second},
			{at: 70 * time.Second, found: []Finding{recreated}, open: 1, opened: 1, due: -1},
		}},
		{name: "two looks at one instant: due at the grace, not before", looks: []look{
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
			{at: 0, found: []Finding{missing}, due: 30 * time.Second},
		}},
		{name: "headroom's grace is its own", looks: []look{
			{at: 0, found: []Finding{head}, due: DefaultHeadroomGrace},
			{at: time.Minute, found: []Finding{head}, due: DefaultHeadroomGrace},
			{at: DefaultHeadroomGrace, found: []Finding{head}, open: 1, opened: 1, due: -1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(nil)
			for i, l := range tt.looks {
				c := tr.Observe(t0.Add(l.at), l.found)
				assert.Len(t, c.Open, l.open, "look %d", i)
				assert.Len(t, c.Opened, l.opened, "look %d", i)
				assert.Len(t, c.Closed, l.closed, "look %d", i)
				if l.due < 0 {
					assert.True(t, c.NextDue.IsZero(), "look %d: nothing due, not %s", i, c.NextDue)
				} else {
					assert.Equal(t, t0.Add(l.due), c.NextDue, "look %d", i)
				}
				assert.Equal(t, len(l.found)-l.open, c.Pending, "look %d", i)
			}
		})
	}
}

func TestTrackerGraces(t *testing.T) {
	tr := NewTracker(map[Kind]time.Duration{MissingAddress: time.Second})
	assert.Equal(t, time.Second, tr.Grace(MissingAddress))
	assert.Equal(t, DefaultGrace, tr.Grace(SharedAddress))
	assert.Equal(t, DefaultHeadroomGrace, tr.Grace(Headroom))
	f := Finding{Kind: MissingAddress, Pods: []string{"a/b"}}
	tr.Observe(t0, []Finding{f})
	c := tr.Observe(t0.Add(time.Second), []Finding{f, f})
	assert.Len(t, c.Opened, 1, "a duplicate in one look counts once")
	assert.Equal(t, t0, c.Open[0].Since)
}

// TestTrackerNeedsTwoLooks: even with no grace, one look opens nothing.
func TestTrackerNeedsTwoLooks(t *testing.T) {
	tr := NewTracker(map[Kind]time.Duration{SharedAddress: 0})
	f := Finding{Kind: SharedAddress, Address: "10.0.0.1", Pods: []string{"a/b", "a/c"}}
	c := tr.Observe(t0, []Finding{f})
	assert.Empty(t, c.Open)
	assert.Equal(t, t0, c.NextDue, "due at once: look again")
	c = tr.Observe(t0, []Finding{f})
	assert.Len(t, c.Opened, 1)
}
