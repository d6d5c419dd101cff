// Command harvester-ipam-sim runs harvester-ipam's deterministic simulation:
// schedules of the world's events, on each whereabouts version, for a time,
// or one seed again.
//
//	harvester-ipam-sim [-duration 1m | -seeds N] [-whereabouts v0.9.3,v0.8.0,v0.7.0] [-seed N -trace]
//
// -seeds N plays the seeds start to start+N-1, each on every version, and
// stops: the same schedules on every machine, however fast (make test and
// make sim's default); -duration plays new seeds for as long as it is given.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/testcni/sim"
)

func main() {
	duration := flag.Duration("duration", time.Minute, "how long to run schedules")
	versions := flag.String("whereabouts", strings.Join([]string{fake.V093, fake.V080, fake.V070}, ","), "whereabouts versions, in turn")
	seed := flag.Uint64("seed", 0, "replay this seed only (with -whereabouts naming one version)")
	start := flag.Uint64("start", 1, "the first seed")
	seeds := flag.Uint64("seeds", 0, "play this many seeds from -start, each on every version, then stop (0: for -duration)")
	showTrace := flag.Bool("trace", false, "print the trace of every schedule run (with -seed)")
	workers := flag.Int("workers", runtime.NumCPU(), "worker processes, running schedules side by side")
	steps := flag.Int("steps", 0, "events a schedule plays (0: the default); fewer find shorter traces")
	worker := flag.Int("worker", -1, "(internal) run as worker number N of -workers")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of a worker (-worker) to this file")
	wbReconciler := flag.Bool("wb-reconciler", false, "run whereabouts' own reconciler now and then (it frees live entries Multus' status does not name, alone too)")
	leftovers := flag.Bool("leftovers", true, "start with entries whereabouts v0.7.0 left in the storage pool (false: replay seeds found before they were modelled)")
	podController := flag.Bool("pod-controller", true, "run whereabouts' pod controller on pod deletions (false: replay seeds found before it was modelled)")
	agents := flag.Bool("agents", true, "run harvester-ipam's node agent on the first node, and on the second in half the schedules (false: replay seeds found before it was modelled)")
	withAudit := flag.Bool("audit", true, "run the audit beside the world and hold its verdicts to the model's ground truth (false: the schedules alone, a little faster)")
	agentGroups := flag.Bool("agent-groups", true, "run the agents' requests under one shim.Group each, as their main does, and roll the agents out (false: replay seeds found before they were modelled)")
	nadKinds := flag.Bool("nad-kinds", true, "add, in some schedules, the NADs whereabouts users make: range and ipRanges, dual stack, overlapping NADs with reservations off (false: replay seeds found before they were modelled)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "harvester-ipam-sim:", err)
			os.Exit(2)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	vs := strings.Split(*versions, ",")
	options := func(v string) sim.Options {
		o := sim.DefaultOptions(v)
		o.PodController = *podController
		o.WBReconciler = *wbReconciler
		o.Leftovers = *leftovers
		o.Agents = *agents
		o.AgentGroups = *agentGroups
		o.Audit = *withAudit
		o.NADKinds = *nadKinds
		if *steps > 0 {
			o.Steps = *steps
		}
		return o
	}
	if *seed != 0 {
		failed := false
		for _, v := range vs {
			res, err := sim.Run(*seed, options(v))
			if err != nil {
				fmt.Fprintln(os.Stderr, "harvester-ipam-sim:", err)
				os.Exit(2)
			}
			if *showTrace || len(res.Violations) > 0 {
				report(v, res)
			}
			failed = failed || len(res.Violations) > 0
			fmt.Printf("seed %d on whereabouts %s: %d violations\n", *seed, v, len(res.Violations))
		}
		if failed {
			os.Exit(1)
		}
		return
	}

	if *worker >= 0 {
		rc := runWorker(*worker, *workers, *start, *seeds, *duration, vs, options)
		pprof.StopCPUProfile()
		os.Exit(rc)
	}
	// Workers are processes: a delegating plugin reads the CNI environment
	// from its process, so one process runs one schedule at a time.
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-sim:", err)
		os.Exit(2)
	}
	results := make([]outcome, *workers)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < *workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := exec.Command(self, "-worker", fmt.Sprint(i), "-workers", fmt.Sprint(*workers), "-start", fmt.Sprint(*start), "-seeds", fmt.Sprint(*seeds),
				"-duration", duration.String(), "-whereabouts", *versions, "-steps", fmt.Sprint(*steps),
				"-pod-controller="+fmt.Sprint(*podController), "-wb-reconciler="+fmt.Sprint(*wbReconciler), "-leftovers="+fmt.Sprint(*leftovers), "-agents="+fmt.Sprint(*agents), "-agent-groups="+fmt.Sprint(*agentGroups), "-audit="+fmt.Sprint(*withAudit), "-nad-kinds="+fmt.Sprint(*nadKinds))
			cmd.Stderr = os.Stderr
			out, _ := cmd.Output()
			var o outcome
			for _, line := range strings.Split(string(out), "\n") {
				if rest, ok := strings.CutPrefix(line, "DONE "); ok {
					_ = json.Unmarshal([]byte(rest), &o)
					continue
				}
				if line != "" {
					mu.Lock()
					fmt.Println(line)
					mu.Unlock()
				}
			}
			results[i] = o
		}(i)
	}
	wg.Wait()
	var total, bad int64
	var last uint64
	per := map[string]int64{}
	stats := map[string]int64{}
	for _, o := range results {
		total += o.Schedules
		bad += o.Violations
		last = max(last, o.Last)
		for v, n := range o.PerVersion {
			per[v] += n
		}
		for k, n := range o.Stats {
			stats[k] += n
		}
	}
	// What the schedules did: the node agents' verbs (served, lost, fallen
	// back and why), the liveness checks, the kills, the audit's findings
	// (opened, true or false) and the inconsistencies it had to report.
	var keys []string
	for k := range stats {
		if strings.HasPrefix(k, "agent") || strings.HasPrefix(k, "lease") || strings.HasPrefix(k, "liveness") || strings.HasPrefix(k, "DEL checks") || strings.HasPrefix(k, "informer") || k == "crashes" || k == "failed ADDs" || k == "sandboxes" || strings.HasPrefix(k, "whereabouts'") || strings.HasPrefix(k, "audit") || strings.HasPrefix(k, "schedules with") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("  %s: %d\n", k, stats[k])
	}
	var parts []string
	for _, v := range vs {
		parts = append(parts, fmt.Sprintf("%s: %d", v, per[v]))
	}
	fmt.Printf("seeds from %d to %d, %d workers (%s)\n", *start, last, *workers, strings.Join(parts, ", "))
	fmt.Printf("%d schedules, %d violations\n", total, bad)
	if bad > 0 || total == 0 {
		os.Exit(1)
	}
}

// runWorker runs seeds start+i, start+i+n, ... on every version until the
// deadline, or (seeds > 0) up to start+seeds-1, printing each violation and
// then a DONE line with its counts.
func runWorker(i, n int, start, seeds uint64, d time.Duration, vs []string, options func(string) sim.Options) int {
	deadline := time.Now().Add(d)
	more := func(seed uint64) bool {
		if seeds > 0 {
			return seed < start+seeds
		}
		return time.Now().Before(deadline)
	}
	o := outcome{PerVersion: map[string]int64{}, Stats: map[string]int64{}}
	for seed := start + uint64(i); more(seed); seed += uint64(n) {
		for _, v := range vs {
			res, err := sim.Run(seed, options(v))
			if err != nil {
				fmt.Fprintln(os.Stderr, "harvester-ipam-sim:", err)
				return 2
			}
			o.Schedules++
			o.PerVersion[v]++
			for k, n := range res.Stats {
				o.Stats[k] += int64(n)
			}
			if len(res.Violations) > 0 {
				o.Violations++
				report(v, res)
			}
		}
		o.Last = seed
	}
	b, _ := json.Marshal(o)
	fmt.Printf("DONE %s\n", b)
	return 0
}

// outcome is what a worker did.
type outcome struct {
	Schedules  int64            `json:"schedules"`
	Violations int64            `json:"violations"`
	Last       uint64           `json:"last"`
	PerVersion map[string]int64 `json:"perVersion"`
	// Stats sum the schedules' counts (sim.Result.Stats).
	Stats map[string]int64 `json:"stats"`
}

func report(v string, res sim.Result) {
	fmt.Printf("=== seed %d on whereabouts %s: %d violations\n", res.Seed, v, len(res.Violations))
	for _, x := range res.Violations {
		fmt.Printf("VIOLATION: %s\n", x)
	}
	fmt.Printf("--- trace (replay: harvester-ipam-sim -seed %d -whereabouts %s -steps %d -trace)\n%s\n--- state\n%s\n", res.Seed, v, res.Steps, res.Trace, res.State)
}
