// Package conformance_test runs whereabouts' own end-to-end suites through
// harvester-ipam: make conformance.
package conformance_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/testcni"
	"github.com/harvester/harvester-ipam/testcni/conformance"
)

var rig *testcni.Rig

func TestMain(m *testing.M) {
	// whereabouts' suites are built before the rig goes offline (Isolate
	// runs the tests where no module can be fetched).
	root, err := os.Getwd()
	if err == nil {
		root, err = testcni.ModuleRoot(root)
	}
	if err == nil {
		err = ensureTools(root)
	}
	if err == nil {
		err = testcni.Isolate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	r, err := testcni.Start(ctx, testcni.Options{NoWebhook: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance: the rig did not start:", err)
		os.Exit(1)
	}
	rig = r
	code := m.Run()
	rig.Close()
	os.Exit(code)
}

// ensureTools builds whereabouts' suites with testcni/tools.sh when the
// cache lacks them (minutes, once a version).
func ensureTools(root string) error {
	script := filepath.Join(root, "testcni", "tools.sh")
	for _, v := range Versions() {
		out, err := exec.Command("bash", script, "paths").Output()
		if err != nil {
			return fmt.Errorf("%s paths: %w", script, err)
		}
		missing := false
		for _, tool := range []string{"whereabouts-e2e-" + v, "whereabouts-e2e-node-slice-" + v, "node-slice-controller-" + v, "macvlan"} {
			path := pathOf(string(out), tool)
			if st, err := os.Stat(path); path == "" || err != nil || !st.Mode().IsRegular() {
				missing = true
			}
		}
		if !missing {
			continue
		}
		fmt.Fprintf(os.Stderr, "conformance: building whereabouts %s's end-to-end suites from the Go module proxy (cached afterwards)\n", v)
		cmd := exec.Command("bash", script, "conformance-"+v)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s conformance-%s: %w", script, v, err)
		}
		cmd = exec.Command("bash", script, "cni-plugins")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s cni-plugins: %w", script, err)
		}
	}
	return nil
}

func pathOf(paths, tool string) string {
	for _, l := range strings.Split(paths, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && k == tool {
			return v
		}
	}
	return ""
}

// TestWhereaboutsConformance runs each version's suites on every side and
// fails where a harvester-ipam side fails a spec the baseline passes. A
// version's three clusters are up side by side, and run each spec in lock
// step: the three start it together and the next starts when all three are
// done and clean, so that every side meets every spec under the same load
// (a StatefulSet of 40 pods on one side never runs beside another side's
// single pod, which has 10 s to start). The versions run in turn.
func TestWhereaboutsConformance(t *testing.T) {
	logs := filepath.Join(rig.Root, "bin", "conformance")
	if err := os.RemoveAll(logs); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	var runs []conformance.Run
	for _, v := range Versions() {
		runs = append(runs, runVersion(t, v, logs)...)
	}
	rep := conformance.NewReport(runs)
	table := rep.Table()
	if err := os.WriteFile(filepath.Join(logs, "table.md"), []byte(table), 0o644); err != nil {
		t.Error(err)
	}
	fmt.Println(table)
	for _, l := range rep.Lines() {
		fmt.Println(l)
	}
	for _, r := range rep.Regressions() {
		t.Errorf("%s", r)
	}
	for _, r := range rep.Unexplained() {
		t.Errorf("%s", r)
	}
}

// runVersion brings version v's three clusters up and runs its suites'
// specs on them in lock step.
func runVersion(t *testing.T, v string, logs string) []conformance.Run {
	ctx := context.Background()
	var suites []conformance.Suite
	for _, s := range []conformance.Suite{
		{Name: "e2e", Version: v, Binary: rig.Tools["whereabouts-e2e-"+v]},
		{Name: "e2e_node_slice", Version: v, Binary: rig.Tools["whereabouts-e2e-node-slice-"+v]},
	} {
		if wanted(s.Name) {
			suites = append(suites, s)
		}
	}
	clusters := make([]*conformance.Cluster, len(conformance.Sides))
	errs := make([]error, len(conformance.Sides))
	var wg sync.WaitGroup
	for i, side := range conformance.Sides {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			clusters[i], errs[i] = conformance.Up(ctx, rig, clusterName(v, side), side, v)
			if errs[i] == nil {
				t.Logf("%s: cluster up in %s", clusterName(v, side), time.Since(start).Round(time.Second))
			}
		}()
	}
	wg.Wait()
	var out []conformance.Run
	for i, side := range conformance.Sides {
		if errs[i] != nil {
			t.Errorf("%s on %s: the cluster: %v", v, side, errs[i])
			out = append(out, failedAll(ctx, suites, side, errs[i])...)
			continue
		}
		defer clusters[i].Node.Close()
	}
	for _, s := range suites {
		specs, err := s.Specs(ctx)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		for _, sp := range specs {
			if !focused(sp.Text) {
				continue
			}
			results := lockStep(t, clusters, s, sp, logs)
			if why := lostRace(results); why != "" {
				// The spec's claim was not put to the test there: every
				// side runs it again, once, and the table says so.
				t.Logf("%s: %s; running it again on every side", sp.Text, why)
				results = lockStep(t, clusters, s, sp, logs)
				for _, r := range results {
					if r != nil {
						r.Again = why
					}
				}
			}
			if why := conformance.Windowed[v+" "+s.Name+" "+sp.Text]; why != "" && !conformance.AllPassed(results) {
				// Its claim is bounded by a window of the suite's own:
				// every side runs it again, alike, until each has passed
				// it once or Attempts runs are done.
				runs := [][]*conformance.Result{results}
				for len(runs) < conformance.Attempts && !conformance.AllPassed(conformance.Combine(runs, why)) {
					t.Logf("%s: failed on a side, a window of its own (%s); running it again on every side", sp.Text, why)
					runs = append(runs, lockStep(t, clusters, s, sp, logs))
				}
				results = conformance.Combine(runs, why)
			}
			for i, r := range results {
				if r != nil {
					out = append(out, conformance.Run{Suite: s, Side: conformance.Sides[i], Result: *r})
				}
			}
		}
	}
	for i, c := range clusters {
		if c != nil && conformance.Sides[i] != conformance.Baseline {
			cp, agent := c.Served()
			t.Logf("%s: harvester-ipam's checkpoints left on the node: %d; verbs its node agent served: %d", clusterName(v, conformance.Sides[i]), cp, agent)
		}
	}
	return out
}

// lockStep runs one spec on every side's cluster at once and waits for all.
func lockStep(t *testing.T, clusters []*conformance.Cluster, s conformance.Suite, sp conformance.Spec, logs string) []*conformance.Result {
	results := make([]*conformance.Result, len(conformance.Sides))
	var wg sync.WaitGroup
	for i, c := range clusters {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := runSpec(t, c, s, sp, logs)
			results[i] = &r
		}()
	}
	wg.Wait()
	return results
}

// lostRace says which sides' runs failed by the suite's own write losing a
// race (conformance.LostItsOwnRace), "" when none did.
func lostRace(results []*conformance.Result) string {
	var sides []string
	for i, r := range results {
		if r != nil && conformance.LostItsOwnRace(*r) {
			sides = append(sides, string(conformance.Sides[i]))
		}
	}
	if len(sides) == 0 {
		return ""
	}
	return "the suite's own StatefulSet update conflicted on " + strings.Join(sides, ", ")
}

// runSpec runs one spec on one side's cluster, then cleans up after it.
func runSpec(t *testing.T, c *conformance.Cluster, s conformance.Suite, sp conformance.Spec, logs string) conformance.Result {
	ctx := context.Background()
	name := clusterName(c.Version, c.Side)
	dir := filepath.Join(logs, name, s.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return conformance.Result{Spec: sp, Outcome: conformance.Failed, Why: err.Error()}
	}
	r := s.Run(ctx, sp, c.Env(), dir, 25*time.Minute)
	if r.Outcome == conformance.Passed && c.Side != conformance.Baseline {
		// A harvester-ipam side that lost whereabouts' name would be
		// whereabouts alone passing.
		if in, err := c.StandsIn(); !in {
			r.Outcome, r.Why = conformance.Failed, fmt.Sprintf("harvester-ipam no longer at whereabouts' name after it (%v)", err)
		}
	}
	t.Logf("%s %s %s: %s in %s %s", name, s.Name, sp.Text, r.Outcome, r.Took.Round(time.Second), r.Why)
	if strings.HasPrefix(r.Why, "the focus ran") {
		t.Errorf("%s %s: the harness ran no spec or more than one for %q: %s", name, s.Name, sp.Text, r.Why)
	}
	if err := c.Clean(ctx); err != nil {
		t.Errorf("%s: %v", name, err)
	}
	// What the spec left in the pools, once its pods are gone: a leak shows
	// here before the next spec meets it.
	if r.Log == "" {
		return r
	}
	if err := c.DumpPools(ctx, strings.TrimSuffix(r.Log, ".log")+".pools"); err != nil {
		t.Logf("%s: %v", name, err)
	}
	return r
}

func clusterName(v string, side conformance.Side) string {
	return fmt.Sprintf("wb%s-%s", strings.ReplaceAll(strings.TrimPrefix(v, "v"), ".", ""), strings.ReplaceAll(string(side), " ", ""))
}

// failedAll is every spec of suites failed on side for one reason.
func failedAll(ctx context.Context, suites []conformance.Suite, side conformance.Side, why error) []conformance.Run {
	var out []conformance.Run
	for _, s := range suites {
		specs, _ := s.Specs(ctx)
		for _, sp := range specs {
			first, _, _ := strings.Cut(why.Error(), "\n")
			out = append(out, conformance.Run{Suite: s, Side: side, Result: conformance.Result{Spec: sp, Outcome: conformance.Failed, Why: "no cluster: " + first}})
		}
	}
	return out
}

// Versions are whereabouts' versions whose suites run (CONFORMANCE_VERSIONS,
// space-separated, else v0.9.4: make test's).
func Versions() []string {
	if v := strings.Fields(os.Getenv("CONFORMANCE_VERSIONS")); len(v) > 0 {
		return v
	}
	return []string{testcni.V094}
}

// wanted says whether a suite runs (CONFORMANCE_SUITES, space-separated,
// else both: e2e and e2e_node_slice).
func wanted(suite string) bool {
	want := strings.Fields(os.Getenv("CONFORMANCE_SUITES"))
	return len(want) == 0 || slices.Contains(want, suite)
}

// focused says whether a spec runs (CONFORMANCE_FOCUS, a regular expression
// its whole text must match, else every spec): to run one spec again on
// every side.
func focused(text string) bool {
	f := os.Getenv("CONFORMANCE_FOCUS")
	if f == "" {
		return true
	}
	ok, err := regexp.MatchString(f, text)
	return err == nil && ok
}
