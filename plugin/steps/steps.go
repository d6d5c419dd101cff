// Package steps times the steps of one verb for its log line ("config
// 0.1ms, client 0.2ms, ..."): where a slow ADD or DEL spends its time, in
// the plugin's debug log and the node agent's request log alike. The bench
// reads those lines.
package steps

import (
	"strings"
	"time"
)

// Timer marks the end of each step; the zero value is not usable: New.
type Timer struct {
	last  time.Time
	parts []string
	now   func() time.Time
}

// New is a timer whose first step starts at start.
func New(start time.Time) *Timer { return &Timer{last: start, now: time.Now} }

// WithClock is a timer on the clock now (a test's), starting now().
func WithClock(now func() time.Time) *Timer { return &Timer{last: now(), now: now} }

// Mark ends step at this moment. A nil timer marks nothing.
func (t *Timer) Mark(step string) {
	if t == nil {
		return
	}
	now := t.now()
	t.parts = append(t.parts, step+" "+now.Sub(t.last).Round(10*time.Microsecond).String())
	t.last = now
}

// String is the steps so far, each with how long it took.
func (t *Timer) String() string {
	if t == nil {
		return ""
	}
	return strings.Join(t.parts, ", ")
}
