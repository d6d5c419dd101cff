package model

import (
	"flag"
	"fmt"
	"testing"
	"time"
)

var sample = flag.Int("model.sample", 0, "explore each scenario with this many random runs instead of every interleaving")

// Every interleaving of every scenario keeps SAFETY.md's invariants, and
// ends in the one right state.
func TestModel(t *testing.T) {
	start := time.Now()
	runs, windows := 0, 0
	for _, s := range Scenarios() {
		var r Result
		if *sample > 0 {
			r = Explore(s, *sample, 1)
		} else {
			r = Explore(s, 0, 0)
		}
		runs += r.Runs
		windows += r.Windows
		if r.Violations > 0 {
			t.Errorf("%s: %d of %d runs break an invariant; the first (choices %v):\n%s", s, r.Violations, r.Runs, r.FirstPath, r.Trace())
		}
	}
	t.Logf("%d scenarios, %d runs, %d through the no-exchange window, in %s", len(Scenarios()), runs, windows, time.Since(start).Round(time.Millisecond))
	fmt.Println()
}
