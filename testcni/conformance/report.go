package conformance

import (
	"fmt"
	"sort"
	"strings"
)

// Run is one spec's result on one side.
type Run struct {
	Suite  Suite
	Side   Side
	Result Result
}

// Report is the specs x sides of every suite run.
type Report struct {
	runs []Run
}

// NewReport gathers runs.
func NewReport(runs []Run) Report { return Report{runs: runs} }

type suiteKey struct{ version, name string }

// bySuite: suite -> spec text -> side -> result, and each suite's specs in
// the order first seen.
func (r Report) bySuite() (map[suiteKey]map[string]map[Side]Result, map[suiteKey][]string, []suiteKey) {
	res := map[suiteKey]map[string]map[Side]Result{}
	order := map[suiteKey][]string{}
	var keys []suiteKey
	for _, run := range r.runs {
		k := suiteKey{run.Suite.Version, run.Suite.Name}
		if res[k] == nil {
			res[k] = map[string]map[Side]Result{}
			keys = append(keys, k)
		}
		if res[k][run.Result.Spec.Text] == nil {
			res[k][run.Result.Spec.Text] = map[Side]Result{}
			order[k] = append(order[k], run.Result.Spec.Text)
		}
		res[k][run.Result.Spec.Text][run.Side] = run.Result
	}
	sort.SliceStable(keys, func(i, j int) bool {
		if keys[i].version != keys[j].version {
			return keys[i].version > keys[j].version
		}
		return keys[i].name < keys[j].name
	})
	return res, order, keys
}

// Table is a Markdown table a suite: each spec's outcome on each side, with
// why it failed.
func (r Report) Table() string {
	res, order, keys := r.bySuite()
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "### whereabouts %s %s\n\n| spec | %s | %s | %s |\n|---|---|---|---|\n", k.version, k.name, Sides[0], Sides[1], Sides[2])
		for _, spec := range order[k] {
			fmt.Fprintf(&b, "| %s |", strings.TrimPrefix(spec, "Whereabouts "))
			for _, side := range Sides {
				got, ok := res[k][spec][side]
				switch {
				case !ok:
					b.WriteString(" not run |")
				case got.Outcome == Passed:
					if got.Again != "" {
						fmt.Fprintf(&b, " passed (%ds; ran again: %s) |", int(got.Took.Seconds()), strings.ReplaceAll(got.Again, "|", "\\|"))
					} else {
						fmt.Fprintf(&b, " passed (%ds) |", int(got.Took.Seconds()))
					}
				default:
					fmt.Fprintf(&b, " **failed**: %s |", strings.ReplaceAll(got.Why, "|", "\\|"))
				}
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Lines are the closing lines, one a suite and version:
// "conformance: whereabouts v0.9.4 e2e: baseline 17/19, exec path 17/19, agent 17/19".
func (r Report) Lines() []string {
	res, order, keys := r.bySuite()
	var out []string
	for _, k := range keys {
		var parts []string
		for _, side := range Sides {
			passed, ran := 0, 0
			for _, spec := range order[k] {
				if got, ok := res[k][spec][side]; ok {
					ran++
					if got.Outcome == Passed {
						passed++
					}
				}
			}
			if ran > 0 {
				parts = append(parts, fmt.Sprintf("%s %d/%d", side, passed, len(order[k])))
			}
		}
		out = append(out, fmt.Sprintf("conformance: whereabouts %s %s: %s", k.version, k.name, strings.Join(parts, ", ")))
	}
	return out
}

// Regressions are the specs the baseline passed and a harvester-ipam side
// did not (not run counts as not passed).
func (r Report) Regressions() []string {
	res, order, keys := r.bySuite()
	var out []string
	for _, k := range keys {
		for _, spec := range order[k] {
			base, ok := res[k][spec][Baseline]
			if !ok || base.Outcome != Passed {
				continue
			}
			for _, side := range Sides[1:] {
				got, ok := res[k][spec][side]
				switch {
				case !ok:
					out = append(out, fmt.Sprintf("whereabouts %s %s: %q passed on the baseline and did not run on %s", k.version, k.name, spec, side))
				case got.Outcome != Passed:
					out = append(out, fmt.Sprintf("whereabouts %s %s: %q passed on the baseline and failed on %s: %s (its log: %s)", k.version, k.name, spec, side, got.Why, got.Log))
				}
			}
		}
	}
	return out
}

// OnTheBaseline are the specs that may fail on the baseline in this rig,
// with the reason found: the rig's, not the product's. A baseline failure
// not listed here fails the run. The key is "version suite spec".
var OnTheBaseline = map[string]string{
	"v0.9.4 e2e Whereabouts functionality Test setup Pod cleanup controller verifies that the pod cleanup controller deletes an orphaned allocation": "" +
		"whereabouts' DEL frees the first entry of the attachment (pkg/allocate DeallocateIP) and leaves the duplicate the spec planted to its pod " +
		"controller (ip-control-loop), which the spec gives 3 s after the pod is gone: on the rig's loaded 2-core machine it took longer " +
		"(harvester-ipam's DEL frees every entry of the attachment, at once)",
	"v0.9.3 e2e Whereabouts functionality Test setup Pod cleanup controller verifies that the pod cleanup controller deletes an orphaned allocation": "" +
		"as v0.9.4's: whereabouts' DEL frees one entry, its pod controller the duplicate, given 3 s",
}

// Unexplained are the baseline's failures OnTheBaseline does not list.
func (r Report) Unexplained() []string {
	res, order, keys := r.bySuite()
	var out []string
	for _, k := range keys {
		for _, spec := range order[k] {
			base, ok := res[k][spec][Baseline]
			if !ok || base.Outcome == Passed {
				continue
			}
			if why := OnTheBaseline[k.version+" "+k.name+" "+spec]; why == "" {
				out = append(out, fmt.Sprintf("whereabouts %s %s: %q failed on the baseline, and no reason is listed for it: %s (its log: %s)", k.version, k.name, spec, base.Why, base.Log))
			}
		}
	}
	return out
}

// Windowed are the specs whose claim the suite bounds by a window of its
// own, short beside what a loaded 2-core rig takes, each with it. The key
// is "version suite spec". One that fails on any side runs again on every
// side, in lock step, up to Attempts runs in all, until every side has
// passed it once (Combine): as a flake attempt, given to every side alike.
// A harvester-ipam side that never passes it, where the baseline does,
// still fails the run; so does a baseline that never passes it.
var Windowed = map[string]string{
	"v0.9.4 e2e Whereabouts functionality Test setup stateful set tests network with very few IPs deleting a pod from the statefulset can recover from an exhausted IP pool": exhaustedWindow,
	"v0.9.3 e2e Whereabouts functionality Test setup stateful set tests network with very few IPs deleting a pod from the statefulset can recover from an exhausted IP pool": exhaustedWindow,
	"v0.9.4 e2e_node_slice Whereabouts node slice functionality Test setup Replicaset tests node slice allocates each IP pool entry with a unique pod IP":                    nodeSliceWindow,
	"v0.9.3 e2e_node_slice Whereabouts node slice functionality Test setup Replicaset tests node slice allocates each IP pool entry with a unique pod IP":                    nodeSliceWindow,
}

const (
	exhaustedWindow = "the spec deletes a StatefulSet's pod with a grace period of 0 and gives its next sandbox 3 s to hold the pod's entry again " +
		"(e2e_test.go: Eventually 3 s): whereabouts alone failed it at load (clean run of 5b0731e)"
	nodeSliceWindow = "the spec deletes the NAD and gives the garbage collector 1 s to delete its NodeSlicePool (expected not found nodeslice); " +
		"node slices are whereabouts' own on every side (the plugin hands them on, the agent is never asked)"
)

// Attempts bounds the runs of a Windowed spec.
const Attempts = 3

// Combine is each side's result over the runs of one spec (runs[k][side],
// nil: not run there): its first pass, told how many runs it took, or else
// its last failure, told how many it failed.
func Combine(runs [][]*Result, why string) []*Result {
	if len(runs) == 0 {
		return nil
	}
	out := make([]*Result, len(runs[0]))
	for side := range out {
		var last *Result
		for k, run := range runs {
			r := run[side]
			if r == nil {
				continue
			}
			c := *r
			last = &c
			if r.Outcome == Passed {
				if k > 0 {
					c.Again = fmt.Sprintf("passed in run %d of %d (%s)", k+1, len(runs), why)
				}
				break
			}
		}
		if last != nil && last.Outcome != Passed && len(runs) > 1 {
			last.Why = fmt.Sprintf("failed in all %d runs: %s", len(runs), last.Why)
		}
		out[side] = last
	}
	return out
}

// AllPassed says whether every side that ran passed.
func AllPassed(rs []*Result) bool {
	for _, r := range rs {
		if r != nil && r.Outcome != Passed {
			return false
		}
	}
	return true
}
