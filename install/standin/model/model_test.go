package model

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var (
	sample = flag.Int("model.sample", 300, "runs of each scenario, each with random choices (seeded): what make test runs")
	all    = flag.Bool("model.all", false, "every interleaving of each scenario instead (make model: about an hour on 2 cores)")
)

// Every scenario keeps SAFETY.md's invariants at every step, and ends in the
// one right state: in make test, -model.sample random interleavings of each
// (the same ones every run); with -model.all, every one within the bounds.
func TestModel(t *testing.T) {
	start := time.Now()
	runs, windows := 0, 0
	// go test -failfast (a mutation run) stops at the first scenario that
	// breaks an invariant.
	failfast := false
	if f := flag.Lookup("test.failfast"); f != nil {
		failfast = f.Value.String() == "true"
	}
	for _, s := range Scenarios() {
		var r Result
		if *all {
			r = Explore(s, 0, 0)
		} else {
			r = Explore(s, *sample, 1)
		}
		runs += r.Runs
		windows += r.Windows
		if r.Violations > 0 {
			t.Errorf("%s: %d of %d runs break an invariant; the first (choices %v):\n%s", s, r.Violations, r.Runs, r.FirstPath, r.Trace())
			if failfast {
				t.FailNow()
			}
		}
	}
	t.Logf("%d scenarios, %d runs, %d through the no-exchange window, in %s", len(Scenarios()), runs, windows, time.Since(start).Round(time.Millisecond))
}

var (
	only  = flag.String("model.only", "", "explore only scenarios whose description contains this")
	first = flag.Bool("model.first", false, "stop each scenario at its first violation")
)

// TestModelEach prints each scenario's runs and time (go test -run TestModelEach -v -timeout 0).
func TestModelEach(t *testing.T) {
	if *only == "" {
		t.Skip("-model.only selects the scenarios")
	}
	StopAtFirst = *first
	for _, s := range Scenarios() {
		if !strings.Contains(s.String(), *only) && *only != "all" {
			continue
		}
		start := time.Now()
		r := Explore(s, 0, 0)
		fmt.Printf("%-75s %8d runs %6d windows %6d violations %s\n", s, r.Runs, r.Windows, r.Violations, time.Since(start).Round(time.Millisecond))
		if r.Violations > 0 {
			t.Errorf("%s (choices %v):\n%s", s, r.FirstPath, r.Trace())
		}
	}
}

var replay = flag.String("model.replay", "", "replay one run: the scenario as printed, then its choices: 'start / op / cp cp / fs' 0,1,2")

// TestReplay prints one run's trace (go test -run TestReplay -v -model.replay '...' -model.choices 0,1).
func TestReplay(t *testing.T) {
	if *replay == "" {
		t.Skip("-model.replay names the run")
	}
	desc, choices, _ := strings.Cut(*replay, "@")
	var prefix []int
	for _, c := range strings.Split(choices, ",") {
		if c = strings.TrimSpace(c); c != "" {
			var v int
			fmt.Sscan(c, &v)
			prefix = append(prefix, v)
		}
	}
	for _, s := range Scenarios() {
		if s.String() == strings.TrimSpace(desc) {
			w := Run(s, &chooser{prefix: prefix})
			fmt.Println(strings.Join(w.trace, "\n"))
			return
		}
	}
	t.Fatalf("no scenario %q", desc)
}
