package sim

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/shim/fake"
)

// budget is how many seeds the test runs per whereabouts version
// (HARVESTER_IPAM_SIM_SEEDS): a fixed budget, so that `make test` stays
// within its time; `make sim` runs for as long as it is given.
func budget(t *testing.T) int {
	if v, err := strconv.Atoi(os.Getenv("HARVESTER_IPAM_SIM_SEEDS")); err == nil && v > 0 {
		return v
	}
	return 300
}

// The invariants hold in every schedule of the budget, on every version.
func TestSchedules(t *testing.T) {
	n := budget(t)
	for _, v := range []string{fake.V093, fake.V080, fake.V070} {
		t.Run("whereabouts "+v, func(t *testing.T) {
			start := time.Now()
			stats := map[string]int{}
			for seed := uint64(1); seed <= uint64(n); seed++ {
				res, err := Run(seed, DefaultOptions(v))
				if err != nil {
					t.Fatal(err)
				}
				for k, c := range res.Stats {
					stats[k] += c
				}
				if len(res.Violations) > 0 {
					t.Fatalf("seed %d: %v\nreplay: go run ./cmd/harvester-ipam-sim -seed %d -whereabouts %s -trace\n%s\n%s",
						seed, res.Violations, seed, v, res.Trace, res.State)
				}
			}
			t.Logf("%d schedules in %s: %v", n, time.Since(start).Round(time.Millisecond), stats)
		})
	}
}

// A seed replays exactly: the same trace, the same end.
func TestASeedReplays(t *testing.T) {
	a, err := Run(4242, DefaultOptions(fake.V070))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(4242, DefaultOptions(fake.V070))
	if err != nil {
		t.Fatal(err)
	}
	if a.Trace != b.Trace || a.State != b.State {
		t.Fatalf("seed 4242 played twice differently:\n%s\n---\n%s", a.Trace, b.Trace)
	}
	if len(a.Trace) < 200 {
		t.Fatalf("a trace of nothing: %q", a.Trace)
	}
}

// The checker is not blind: a world that frees a live attachment's entry
// behind everyone's back is caught, with the seed and the trace.
func TestTheCheckerCatchesAFreedLiveEntry(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.sabotage = true
	caught := 0
	for seed := uint64(1); seed <= 50; seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Violations) > 0 {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("50 schedules of a sabotaged world, no violation seen")
	}
}
