package conformance

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// A dry run as ginkgo v1.16 prints it with -ginkgo.v (the shape of
// whereabouts' suites' own).
const dryRun = `Running Suite: whereabouts-e2e
==============================
Random Seed: 1796158104
Will run 2 of 2 specs

Whereabouts functionality Test setup Single pod tests 
  allocates a single pod with a single interface
  github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:100
•
------------------------------
Whereabouts functionality Test setup stateful set tests regular sized network stateful sets scale up / down 
  scale up then down 5 replicas
  github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:407
•
Ran 2 of 2 Specs in 0.004 seconds
SUCCESS! -- 0 Passed | 0 Failed | 0 Pending | 0 Skipped
PASS
`

func TestParseSpecs(t *testing.T) {
	specs, err := parseSpecs([]byte(dryRun))
	if err != nil {
		t.Fatal(err)
	}
	want := []Spec{
		{"Whereabouts functionality Test setup Single pod tests allocates a single pod with a single interface", "github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:100"},
		{"Whereabouts functionality Test setup stateful set tests regular sized network stateful sets scale up / down scale up then down 5 replicas", "github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:407"},
	}
	if len(specs) != len(want) {
		t.Fatalf("got %d specs %q, want %d", len(specs), specs, len(want))
	}
	for i := range want {
		if specs[i] != want[i] {
			t.Errorf("spec %d: got %q, want %q", i, specs[i], want[i])
		}
	}
	// A dry run that lists fewer specs than it says it would run is an error,
	// not a shorter suite.
	short := strings.Replace(dryRun, "Will run 2 of 2", "Will run 3 of 3", 1)
	if _, err := parseSpecs([]byte(short)); err == nil {
		t.Error("a dry run of 3 specs read as 2: want an error")
	}
	if _, err := parseSpecs([]byte("no specs here\n")); err == nil {
		t.Error("no spec read: want an error")
	}
}

func TestJudge(t *testing.T) {
	pass := "Ran 1 of 20 Specs in 12.3 seconds\nSUCCESS! -- 1 Passed | 0 Failed | 0 Pending | 19 Skipped\nPASS\n"
	fail := `• Failure [10.2 seconds]
Whereabouts functionality
/go/pkg/mod/github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:46
  Test setup
  /go/pkg/mod/github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:47
      allocates a single pod with a single interface [It]
      /go/pkg/mod/github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:100

      Unexpected error:
          timed out waiting for the condition
      occurred

      /go/pkg/mod/github.com/k8snetworkplumbingwg/whereabouts@v0.9.4/e2e/e2e_test.go:108
------------------------------
Ran 1 of 20 Specs in 10.2 seconds
FAIL! -- 0 Passed | 1 Failed | 0 Pending | 19 Skipped
`
	for _, c := range []struct {
		name     string
		out      string
		err, ctx error
		want     Outcome
		why      string
	}{
		{name: "passed", out: pass, want: Passed},
		{name: "exit code fails it", out: pass, err: errors.New("exit status 1"), want: Failed},
		{name: "failed", out: fail, err: errors.New("exit status 1"), want: Failed, why: "Unexpected error: timed out waiting for the condition occurred"},
		{name: "the focus ran none", out: "Ran 0 of 20 Specs in 0 seconds\nSUCCESS! -- 0 Passed | 0 Failed | 0 Pending | 20 Skipped\n", want: Failed, why: "ran 0 specs"},
		{name: "the focus ran two", out: "Ran 2 of 20 Specs in 1 seconds\nSUCCESS! -- 2 Passed | 0 Failed | 0 Pending | 18 Skipped\n", want: Failed, why: "ran 2 specs"},
		{name: "no summary", out: "panic: boom\n", err: errors.New("exit status 2"), want: Failed, why: "no ginkgo summary"},
		{name: "timed out", out: pass, ctx: errors.New("context deadline exceeded"), want: Failed, why: "did not finish"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, why := judge([]byte(c.out), c.err, c.ctx)
			if got != c.want || !strings.Contains(why, c.why) {
				t.Errorf("got %s (%q), want %s with %q", got, why, c.want, c.why)
			}
		})
	}
}

func TestReport(t *testing.T) {
	s := Suite{Name: "e2e", Version: "v0.9.4"}
	a, b := Spec{Text: "Whereabouts a"}, Spec{Text: "Whereabouts b"}
	res := func(sp Spec, o Outcome) Result { return Result{Spec: sp, Outcome: o, Why: "why", Took: time.Second} }
	rep := NewReport([]Run{
		{s, Baseline, res(a, Passed)}, {s, Baseline, res(b, Failed)},
		{s, ExecPath, res(a, Passed)}, {s, ExecPath, res(b, Passed)},
		{s, Agent, res(a, Failed)}, {s, Agent, res(b, Failed)},
	})
	if got, want := rep.Lines(), []string{"conformance: whereabouts v0.9.4 e2e: baseline 1/2, exec path 2/2, agent 0/2"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines: got %q, want %q", got, want)
	}
	regs := rep.Regressions()
	if len(regs) != 1 || !strings.Contains(regs[0], `"Whereabouts a" passed on the baseline and failed on agent`) {
		t.Errorf("regressions: got %q, want the one of a on the agent side", regs)
	}
	if table := rep.Table(); !strings.Contains(table, "| functionality") && !strings.Contains(table, "| a | passed (1s) | passed (1s) | **failed**: why |") {
		t.Errorf("table:\n%s", table)
	}
}

func TestUnexplainedBaselineFailures(t *testing.T) {
	s := Suite{Name: "e2e", Version: "v0.9.4"}
	listed := "Whereabouts functionality Test setup Pod cleanup controller verifies that the pod cleanup controller deletes an orphaned allocation"
	res := func(text string, o Outcome) Result { return Result{Spec: Spec{Text: text}, Outcome: o, Why: "why"} }
	rep := NewReport([]Run{
		{s, Baseline, res(listed, Failed)}, {s, Baseline, res("Whereabouts other", Failed)}, {s, Baseline, res("Whereabouts fine", Passed)},
	})
	got := rep.Unexplained()
	if len(got) != 1 || !strings.Contains(got[0], `"Whereabouts other" failed on the baseline, and no reason is listed`) {
		t.Errorf("got %q, want the unlisted failure alone", got)
	}
}

// A run whose failure is the suite's own StatefulSet update refused as a
// conflict lost its own race (the spec runs again); any other failure, and
// a pass, did not.
func TestLostItsOwnRace(t *testing.T) {
	dir := t.TempDir()
	conflict := dir + "/conflict.log"
	// As ginkgo v1 printed it on the rig (whereabouts v0.9.4, scale up then down 10 replicas).
	if err := os.WriteFile(conflict, []byte(`• Failure [42.031 seconds]
Whereabouts functionality
  e2e_test.go:46

          Expected success, but got an error:
              <*errors.StatusError | 0x1da2d5af0aa0>: 
              Operation cannot be fulfilled on statefulsets.apps "web": the object has been modified; please apply your changes to the latest version and try again

`), 0o644); err != nil {
		t.Fatal(err)
	}
	other := dir + "/other.log"
	if err := os.WriteFile(other, []byte("• Failure [3.0 seconds]\nx\n\n  Timed out after 3.001s.\n  Expected <bool>: false to be true\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    Result
		want bool
	}{
		{"the suite's update refused, clipped from Why", Result{Outcome: Failed, Why: "Expected success, but got an error: <*errors.StatusError | 0x1da2d5af0aa0>: ...", Log: conflict}, true},
		{"the suite's update refused, in Why", Result{Outcome: Failed, Why: `Operation cannot be fulfilled on statefulsets.apps "web"`}, true},
		{"an assertion failed", Result{Outcome: Failed, Why: "Timed out after 3.001s.", Log: other}, false},
		{"no log", Result{Outcome: Failed, Why: "did not finish", Log: dir + "/none.log"}, false},
		{"passed", Result{Outcome: Passed, Log: conflict}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := LostItsOwnRace(tt.r); got != tt.want {
				t.Errorf("LostItsOwnRace = %v, want %v", got, tt.want)
			}
		})
	}
}

// A windowed spec's runs: a side passes with its first pass, told the run;
// a side that passes in none fails, told how many it failed.
func TestCombine(t *testing.T) {
	pass := &Result{Outcome: Passed}
	fail := &Result{Outcome: Failed, Why: "Timed out after 3.000s"}
	got := Combine([][]*Result{{fail, pass, fail}, {pass, pass, fail}}, "a window")
	if got[0].Outcome != Passed || got[0].Again != "passed in run 2 of 2 (a window)" {
		t.Errorf("the baseline: %+v, want passed in run 2", got[0])
	}
	if got[1].Outcome != Passed || got[1].Again != "" {
		t.Errorf("the exec path: %+v, want passed at once", got[1])
	}
	if got[2].Outcome != Failed || got[2].Why != "failed in all 2 runs: Timed out after 3.000s" {
		t.Errorf("the agent: %+v, want failed in both", got[2])
	}
	if AllPassed(got) || !AllPassed(got[:2]) {
		t.Error("AllPassed")
	}
	one := Combine([][]*Result{{fail, nil, pass}}, "w")
	if one[0].Why != "Timed out after 3.000s" || one[1] != nil {
		t.Errorf("one run: %+v %+v", one[0], one[1])
	}
	rep := NewReport([]Run{{Suite{Name: "e2e", Version: "v0.9.4"}, Baseline, *got[0]}})
	if !strings.Contains(rep.Table(), "ran again: passed in run 2 of 2") {
		t.Errorf("table:\n%s", rep.Table())
	}
}
