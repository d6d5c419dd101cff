package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/testcni"
	"github.com/harvester/harvester-ipam/wire"
)

// The node agent's section (BENCH_ONLY=agent): whereabouts alone, the exec
// path (harvester-ipam standing in for whereabouts, no agent) and the node
// agent (harvester-ipam standing in, its verbs served by an agent with
// whereabouts' allocator in-process), side by side in one run, on one API
// server, each side on pools of its own:
//
//   - one sandbox at a time, interleaved (every order of the sides);
//   - storms: 24 ADDs at once on one pool (one node), and 48 from three
//     simulated nodes, each with its own agent, all on one pool;
//   - the storm after a reboot: 24 (one node) and 48 (three nodes) ADDs at
//     once, of pods that each still hold the address of an earlier sandbox
//     (whereabouts alone hands it over; harvester-ipam releases it, its
//     reservation under whereabouts' Lease, and allocates again);
//   - the agent's memory once its informers hold a 10,000-entry pool and it
//     served ADDs on it;
//   - where the agent's verbs spend their time (the plugin's debug log,
//     written by the agent).
//
// It ends with the ratio lines: the agent and the exec path against
// whereabouts alone.

// agentNodes are the simulated nodes of the storms, each with its own agent.
var agentNodes = []string{"node-a", "node-b", "node-c"}

// benchRatio is one ratio line: a figure of the agent and of the exec path
// against whereabouts alone's.
type benchRatio struct {
	what            string
	agent, exec, wb time.Duration
	target          float64 // the agent's at most; 0: none
	failures, dupes int
	noExec          bool
}

// agentSides are the three sides of a part of the section, on ranges of
// their own: whereabouts alone, the exec path, and the agent (served by
// the agent of node k, chosen per call).
type agentSides struct {
	wb, exec, agent side
	agents          []*testcni.Agent
}

func (b *bencher) newAgentSides(agents []*testcni.Agent, rngWB, rngExec, rngAgent, ifname string) agentSides {
	// harvester-ipam's checkpoints on a disk, as a node's /var/lib/cni is
	// (the rig's own is a tmpfs, where an fsync costs nothing).
	cp := fmt.Sprintf(`,%q:{"checkpoint_dir":%q}`, conf.OptionsKey, b.checkpointDir())
	return agentSides{
		wb: side{name: "whereabouts " + b.wb, bin: b.rig.Tools["whereabouts-"+b.wb], typ: "whereabouts", path: b.rig.CNIDir(b.wb), rng: rngWB, ifname: ifname},
		exec: side{name: "exec path", bin: b.rig.PluginBinary(), typ: "whereabouts", path: b.rig.StandInDir(b.wb), rng: rngExec, ifname: ifname,
			env: []string{wire.EnvSocket + "=" + wire.NoAgent}, extra: cp},
		agent:  side{name: "agent", bin: b.rig.PluginBinary(), typ: "whereabouts", path: b.rig.StandInDir(b.wb), rng: rngAgent, ifname: ifname, extra: cp},
		agents: agents,
	}
}

// checkpointDir is where the agent section's harvester-ipam sides keep
// their checkpoints: under the rig's directory, on its disk.
func (b *bencher) checkpointDir() string { return filepath.Join(b.rig.Dir, "checkpoints") }

// onNode is the agent side served by the agent of node k.
func (s agentSides) onNode(k int) side {
	sd := s.agent
	a := s.agents[k%len(s.agents)]
	sd.env = []string{wire.EnvSocket + "=" + a.Socket}
	return sd
}

func (s agentSides) all() []side { return []side{s.wb, s.exec, s.onNode(0)} }

func (b *bencher) agentSection(ctx context.Context, n int) error {
	var agents []*testcni.Agent
	for _, node := range agentNodes {
		a, err := b.rig.StartAgent(ctx, nil, testcni.AgentOptions{Name: node, Args: []string{"--checkpoint-dir", b.checkpointDir()}})
		if err != nil {
			return err
		}
		defer a.Kill()
		agents = append(agents, a)
	}
	fmt.Printf("## The node agent against whereabouts %s alone and the exec path\n\n", b.wb)
	fmt.Printf("The exec path is harvester-ipam standing in for whereabouts with no agent (it runs whereabouts' binary); the agent side is harvester-ipam standing in, its verbs served by a node agent (whereabouts' allocator in-process). Every side execs its binary as the runtime does (process start included). harvester-ipam's checkpoints are on the machine's disk (%s), as a node's /var/lib/cni is.\n\n", b.checkpointDir())

	// BENCH_AGENT_PARTS (comma-separated: latency, phases, storms, memory)
	// runs some parts only.
	parts := map[string]bool{}
	for _, p := range strings.Split(os.Getenv("BENCH_AGENT_PARTS"), ",") {
		if p != "" {
			parts[p] = true
		}
	}
	part := func(name string) bool { return len(parts) == 0 || parts[name] }
	var ratios []benchRatio
	if part("latency") {
		lat, err := b.agentLatency(ctx, agents, n)
		if err != nil {
			return err
		}
		ratios = append(ratios, lat...)
	}
	if part("phases") {
		if err := b.agentPhases(ctx, agents[0]); err != nil {
			return err
		}
	}
	if part("storms") {
		storms, err := b.agentStorms(ctx, agents)
		if err != nil {
			return err
		}
		ratios = append(ratios, storms...)
	}
	mem := int64(-1)
	if part("memory") {
		var err error
		if mem, err = b.agentMemory(ctx, agents[0]); err != nil {
			return err
		}
	}
	counts, err := agents[0].Requests(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("The agent of %s counted: %s.\n\n", agentNodes[0], countsLine(counts))

	fmt.Println("### Ratios (agent / whereabouts alone, exec path / whereabouts alone)")
	fmt.Println()
	for _, r := range ratios {
		line := fmt.Sprintf("ratio %s: agent/whereabouts %.2fx (%s / %s)", r.what, ratio(r.agent, r.wb), ms(r.agent), ms(r.wb))
		if !r.noExec {
			line += fmt.Sprintf(", exec/whereabouts %.2fx (%s)", ratio(r.exec, r.wb), ms(r.exec))
		}
		if r.target > 0 {
			verdict := "met"
			if ratio(r.agent, r.wb) > r.target || r.failures > 0 || r.dupes > 0 {
				verdict = "NOT met"
			}
			line += fmt.Sprintf("; target <= %.1fx: %s", r.target, verdict)
		}
		fmt.Println(line)
	}
	if mem >= 0 {
		verdict := "met"
		if mem > 64<<10 {
			verdict = "NOT met"
		}
		fmt.Printf("agent RSS with a 10,000-entry pool in its cache: %.1f MiB; target <= 64 MiB: %s\n", float64(mem)/1024, verdict)
	}
	fmt.Println()
	return nil
}

// agentLatency: one sandbox at a time, the sides interleaved.
func (b *bencher) agentLatency(ctx context.Context, agents []*testcni.Agent, n int) ([]benchRatio, error) {
	s := b.newAgentSides(agents, "10.243.0.0/16", "10.241.0.0/16", "10.242.0.0/16", "")
	sides := s.all()
	for i := range sides {
		sides[i].ifname = fmt.Sprintf("lhnet%d", i+1)
	}
	add := map[string][]time.Duration{}
	del := map[string][]time.Duration{}
	type sb struct{ id, pod string }
	var sbs []sb
	before, err := agents[0].Requests(ctx)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		x := sb{b.id(), fmt.Sprintf("agent-bench-%04d", i)}
		sbs = append(sbs, x)
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "ADD", x.id, x.pod)
			if err != nil {
				return nil, err
			}
			add[sd.name] = append(add[sd.name], m.Wall)
		}
	}
	for i, x := range sbs {
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "DEL", x.id, x.pod)
			if err != nil {
				return nil, err
			}
			del[sd.name] = append(del[sd.name], m.Wall)
		}
	}
	after, err := agents[0].Requests(ctx)
	if err != nil {
		return nil, err
	}
	served := after["ADD served"] - before["ADD served"] + after["DEL served"] - before["DEL served"]
	fmt.Printf("### One sandbox at a time (%d sandboxes a side, interleaved)\n\n", n)
	fmt.Printf("The agent served %d of its side's %d verbs.\n\n", served, 2*n)
	fmt.Printf("| | whereabouts %s alone | exec path | ratio | agent | ratio |\n", b.wb)
	fmt.Println("|---|---|---|---|---|---|")
	var out []benchRatio
	for _, v := range []struct {
		what string
		d    map[string][]time.Duration
	}{{"ADD", add}, {"DEL", del}} {
		for _, q := range []struct {
			name string
			at   func([]time.Duration) time.Duration
		}{{"median", median}, {"p95", p95}} {
			wv, ev, av := q.at(v.d[s.wb.name]), q.at(v.d[s.exec.name]), q.at(v.d[s.agent.name])
			fmt.Printf("| %s %s | %s | %s | %.2fx | %s | %.2fx |\n", v.what, q.name, ms(wv), ms(ev), ratio(ev, wv), ms(av), ratio(av, wv))
			if q.name == "median" {
				out = append(out, benchRatio{what: "one " + v.what + " at a time, median", agent: av, exec: ev, wb: wv, target: 0.5})
			}
		}
	}
	fmt.Println()
	if served != 2*n {
		return nil, fmt.Errorf("the agent served %d of %d verbs: %s", served, 2*n, agents[0].LogTail())
	}
	return out, nil
}

// agentPhases: where the agent's verbs spend their time, as the plugin's
// debug log (written by the agent) times each step.
func (b *bencher) agentPhases(ctx context.Context, a *testcni.Agent) error {
	const runs = 20
	s := b.newAgentSides([]*testcni.Agent{a}, "10.236.0.0/24", "10.237.0.0/24", "10.238.0.0/24", "lhnet1")
	sd := s.onNode(0)
	logFile := filepath.Join(b.rig.Dir, "bench-agent-phases.log")
	sd.extra += fmt.Sprintf(`,"log_level":"debug","log_file":%q`, logFile)
	st, err := b.timeSteps(ctx, sd, runs, "agent-phases", logFile)
	if err != nil {
		return err
	}
	served, err := agentSteps(a.Log, st.ids)
	if err != nil {
		return err
	}
	fmt.Printf("### Where the agent's verbs spend their time (the plugin's debug log, written by the agent, and the agent's own log of each request; medians of %d)\n\n", runs)
	for _, verb := range []string{"ADD", "DEL"} {
		parts, sum, wall := st.medians(verb)
		fmt.Printf("    %s: %s; %s in the verb's steps of a plugin process's %s\n", verb, parts, ms(sum), ms(wall))
	}
	for _, verb := range []string{"ADD", "DEL"} {
		var parts []string
		for _, st := range []string{"read", "admit", "go", "verb", "answer"} {
			parts = append(parts, fmt.Sprintf("%s %s", st, ms(median(served[verb][st]))))
		}
		fmt.Printf("    %s in the agent: %s; %s from the connection to the answer\n", verb, strings.Join(parts, ", "), ms(median(served[verb]["all"])))
	}
	fmt.Println()
	return nil
}

var servedRE = regexp.MustCompile(`(ADD|DEL) (\S+)/\S+: served in (\S+) \((.*)\)`)

// agentSteps reads the steps of the requests of container ids from an
// agent's log (--log-requests): by verb, by step ("all": the whole).
func agentSteps(logFile string, ids []string) (map[string]map[string][]time.Duration, error) {
	b, err := os.ReadFile(logFile)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	out := map[string]map[string][]time.Duration{"ADD": {}, "DEL": {}}
	for _, line := range strings.Split(string(b), "\n") {
		m := servedRE.FindStringSubmatch(line)
		if m == nil || !want[m[2]] {
			continue
		}
		all, err := time.ParseDuration(m[3])
		if err != nil {
			return nil, err
		}
		out[m[1]]["all"] = append(out[m[1]]["all"], all)
		for _, part := range strings.Split(m[4], ", ") {
			name, ds, _ := strings.Cut(part, " ")
			d, err := time.ParseDuration(ds)
			if err != nil {
				return nil, fmt.Errorf("%s in %q: %w", ds, line, err)
			}
			out[m[1]][name] = append(out[m[1]][name], d)
		}
	}
	if len(out["ADD"]["all"]) != len(ids) || len(out["DEL"]["all"]) != len(ids) {
		return nil, fmt.Errorf("the agent's log %s has %d ADDs and %d DELs of %d sandboxes served", logFile, len(out["ADD"]["all"]), len(out["DEL"]["all"]), len(ids))
	}
	return out, nil
}

// stormKind is one kind of storm: how many ADDs, over how many nodes, and
// whether each pod holds an earlier sandbox's address (a reboot).
type stormKind struct {
	name   string
	pods   int
	nodes  int
	reboot bool
	target float64
}

// stormResult is one side's storm in one round.
type stormResult struct {
	took     time.Duration
	failures int
	dupes    int
	median   time.Duration // of one ADD in it
	// served counts the storm's ADDs the agents served (the agent's side):
	// the others went to the exec path.
	served int
}

// servedADDs is the ADDs the agents have served so far (their metrics); -1
// on a metrics read that fails, which the table then shows.
func servedADDs(ctx context.Context, agents []*testcni.Agent) int {
	n := 0
	for _, a := range agents {
		got, err := a.Requests(ctx)
		if err != nil {
			return -1
		}
		n += got["ADD served"]
	}
	return n
}

// agentMemory: the agent's RSS once its informers hold a 10,000-entry pool
// and it served ADDs on that pool. It returns the RSS in KiB.
func (b *bencher) agentMemory(ctx context.Context, a *testcni.Agent) (int64, error) {
	const size, adds = 10000, 20
	before, _, err := a.Memory()
	if err != nil {
		return 0, err
	}
	s := b.newAgentSides([]*testcni.Agent{a}, "", "", "10.100.0.0/16", "lhnet1")
	pool := names.Pool(s.agent.rng, "")
	if err := b.fill(ctx, pool, s.agent.rng, size); err != nil {
		return 0, err
	}
	// The informer holds it once the agent's ADD is chosen on it: the first
	// ADD may have read it from the API server.
	retried := 0
	for i := 0; i < adds; i++ {
		// A write of the whole pool may take longer than a call's 10 s on a
		// loaded machine: the runtime would retry; so does the bench, counted.
		for {
			_, err := b.call(ctx, s.onNode(0), "ADD", b.id(), fmt.Sprintf("memory-%02d", i))
			if err == nil {
				break
			}
			if retried++; retried > 3 {
				return 0, fmt.Errorf("%w\nthe agent's log, last lines:\n%s", err, a.LogTail())
			}
		}
	}
	m, err := a.MemoryDetail()
	if err != nil {
		return 0, err
	}
	rss, hwm := m["VmRSS"], m["VmHWM"]
	p, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Get(ctx, pool, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	fmt.Printf("### The agent's memory\n\n")
	fmt.Printf("| | RSS | peak RSS |\n|---|---|---|\n")
	fmt.Printf("| the agent of %s after the sections above | %.1f MiB | |\n", agentNodes[0], float64(before)/1024)
	fmt.Printf("| the same, its informers holding a pool of %d entries, after %d ADDs on it | %.1f MiB | %.1f MiB |\n\n", len(p.Spec.Allocations), adds, float64(rss)/1024, float64(hwm)/1024)
	fmt.Printf("Of its RSS: %.1f MiB anonymous (the heap, stacks), %.1f MiB of its binary and other files. ADDs retried after a timeout: %d.\n\n",
		float64(m["RssAnon"])/1024, float64(m["RssFile"]+m["RssShmem"])/1024, retried)
	return rss, nil
}

// countsLine is an agent's request counts, in a fixed order.
func countsLine(c map[string]int) string {
	var keys []string
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+" "+strconv.Itoa(c[k]))
	}
	return strings.Join(parts, ", ")
}
