package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/testcni"
)

// bencher measures harvester-ipam (delegating to whereabouts wb) against
// whereabouts wb alone, in one run, on the same API server, by exec'ing
// the IPAM binaries as the runtime does (process start included).
type bencher struct {
	rig   *testcni.Rig
	netns string
	wb    string // the delegate of the sections that compare one
	seq   int
	mu    sync.Mutex
}

// benchDelegates are the whereabouts versions the latency and large-pool
// sections run on: Harvester's, and the one before it.
var benchDelegates = []string{testcni.V093, testcni.V080}

type side struct {
	name  string
	bin   string
	typ   string // ipam.type
	path  string // CNI_PATH
	rng   string
	extra string // more ipam fields
	// ifname is the attachment's interface, lhnet1 unless set: the sides
	// of one section share sandboxes (container IDs), and one sandbox's
	// attachments have interfaces of their own.
	ifname string
	// env is more of the plugin's environment (its node agent's socket).
	env []string
}

func (b *bencher) sides(rngH, rngW string) (h, w side) {
	return side{name: "harvester-ipam", bin: b.rig.PluginBinary(), typ: "harvester-ipam", path: b.rig.CNIDir(b.wb), rng: rngH},
		side{name: "whereabouts " + b.wb, bin: b.rig.Tools["whereabouts-"+b.wb], typ: "whereabouts", path: b.rig.CNIDir(b.wb), rng: rngW}
}

// delegateRange is the /16 10.(base+2k+side).0.0 of the k-th delegate: every
// delegate's sections have pools of their own.
func delegateRange(base, k, side int) string {
	return fmt.Sprintf("10.%d.0.0/16", base+2*k+side)
}

// conf is the side's network config, a network of its own name, as each of
// a sandbox's attachments is.
func (s side) conf(flat string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":%q,"type":"bridge","ipam":{"type":%q,"range":%q,"configuration_path":%q%s}}`, s.network(), s.typ, s.rng, flat, s.extra))
}

// network is the side's name as a CNI network name ([a-zA-Z0-9_.-]).
func (s side) network() string {
	return "bench-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, s.name)
}

// call runs one verb of one sandbox (container id) of pod, timed.
func (b *bencher) call(ctx context.Context, s side, verb, id, pod string) (testcni.Measured, error) {
	return b.exec(ctx, testcni.Exec, s, verb, id, pod)
}

// peak is call sampling the process's peak RSS instead: not a latency.
func (b *bencher) peak(ctx context.Context, s side, verb, id, pod string) (testcni.Measured, error) {
	return b.exec(ctx, testcni.ExecPeak, s, verb, id, pod)
}

func (b *bencher) exec(ctx context.Context, run func(context.Context, string, []string, []byte) (testcni.Measured, error), s side, verb, id, pod string) (testcni.Measured, error) {
	ifname := s.ifname
	if ifname == "" {
		ifname = "lhnet1"
	}
	env := []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + b.netns, "CNI_IFNAME=" + ifname,
		"CNI_PATH=" + s.path, "CNI_ARGS=IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=" + pod}
	env = append(env, s.env...)
	m, err := run(ctx, s.bin, env, s.conf(b.rig.FlatFile))
	if err == nil && m.Exit != 0 {
		err = fmt.Errorf("%s %s %s: exit %d: %s %s", s.name, verb, id, m.Exit, m.Stdout, lastLine(m.Stderr))
	}
	return m, err
}

func (b *bencher) id() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	return fmt.Sprintf("bench%08d", b.seq)
}

func bench(ctx context.Context, rig *testcni.Rig) error {
	n := envInt("BENCH_SANDBOXES", 100)
	sb, err := rig.NewSandbox(nil, testcni.Pod{}, "lhnet1")
	if err != nil {
		return err
	}
	b := &bencher{rig: rig, netns: sb.Path, wb: testcni.V093}
	host, _ := os.Hostname()
	fmt.Printf("# harvester-ipam bench\n\n%s, %d CPUs, %s; %s; kube-apiserver v1.37.0 and etcd v3.6.16 on loopback; %d sandboxes\n\n",
		host, runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02"), n)

	// BENCH_ONLY (comma-separated section names) runs some sections only.
	only := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("BENCH_ONLY"), ",") {
		if s != "" {
			only[s] = true
		}
	}
	run := func(section string) bool { return len(only) == 0 || only[section] }
	for k, wb := range benchDelegates {
		b.wb = wb
		if run("latency") {
			if err := b.latency(ctx, n, k); err != nil {
				return err
			}
		}
	}
	b.wb = testcni.V093
	if run("phases") {
		if err := b.phases(ctx); err != nil {
			return err
		}
	}
	if run("node") {
		if err := b.node(ctx); err != nil {
			return err
		}
	}
	if run("agent") {
		if err := b.agentSection(ctx, n); err != nil {
			return err
		}
	}
	if run("storm") {
		if err := b.storm(ctx); err != nil {
			return err
		}
	}
	for k, wb := range benchDelegates {
		b.wb = wb
		if run("large") {
			if err := b.largePool(ctx, k); err != nil {
				return err
			}
		}
	}
	if run("reconciler") {
		if err := b.reconciler(ctx); err != nil {
			return err
		}
	}
	if run("audit") {
		return b.auditWatch(ctx)
	}
	return nil
}

// phases: where harvester-ipam's time goes in an ADD and a DEL, as its own
// debug log times each step (on whereabouts v0.9.3, a small pool).
func (b *bencher) phases(ctx context.Context) error {
	const runs = 30
	h, _ := b.sides("10.206.0.0/24", "10.207.0.0/24")
	logFile := filepath.Join(b.rig.Dir, "bench-phases.log")
	h.extra = fmt.Sprintf(`,"log_level":"debug","log_file":%q`, logFile)
	st, err := b.timeSteps(ctx, h, runs, "phases", logFile)
	if err != nil {
		return err
	}
	fmt.Printf("## Where harvester-ipam's time goes (its debug log's steps, medians of %d, on whereabouts %s)\n\n", runs, b.wb)
	for _, verb := range []string{"ADD", "DEL"} {
		parts, sum, wall := st.medians(verb)
		fmt.Printf("    %s: %s; %s in steps of a process's %s\n", verb, parts, ms(sum), ms(wall))
	}
	fmt.Println()
	return nil
}

// stepTimes are the times of an ADD and a DEL of runs sandboxes, as the
// plugin's debug log times each step, by verb and step ("wall": the whole
// process), the steps in the log's order, and the sandboxes' container IDs.
type stepTimes struct {
	times map[string]map[string][]time.Duration
	steps map[string][]string
	ids   []string
}

// timeSteps runs ADD then DEL of runs sandboxes on s, one at a time, and
// reads each verb's steps from the debug log logFile.
func (b *bencher) timeSteps(ctx context.Context, s side, runs int, label, logFile string) (stepTimes, error) {
	st := stepTimes{times: map[string]map[string][]time.Duration{"ADD": {}, "DEL": {}}, steps: map[string][]string{}}
	for _, verb := range []string{"ADD", "DEL"} {
		for i := 0; i < runs; i++ {
			id := b.id()
			if verb == "ADD" {
				st.ids = append(st.ids, id)
			} else {
				id = st.ids[i]
			}
			m, err := b.call(ctx, s, verb, id, fmt.Sprintf("%s-%02d", label, i))
			if err != nil {
				return st, err
			}
			st.times[verb]["wall"] = append(st.times[verb]["wall"], m.Wall)
			parts, err := stepsOf(logFile, verb, id)
			if err != nil {
				return st, err
			}
			for _, p := range parts {
				if i == 0 {
					st.steps[verb] = append(st.steps[verb], p.name)
				}
				st.times[verb][p.name] = append(st.times[verb][p.name], p.d)
			}
		}
	}
	return st, nil
}

// medians are verb's steps with their medians ("config 0.1 ms, ..."), their
// sum, and the process's median.
func (st stepTimes) medians(verb string) (string, time.Duration, time.Duration) {
	var parts []string
	var sum time.Duration
	for _, name := range st.steps[verb] {
		d := median(st.times[verb][name])
		sum += d
		parts = append(parts, fmt.Sprintf("%s %s", name, ms(d)))
	}
	return strings.Join(parts, ", "), sum, median(st.times[verb]["wall"])
}

type step struct {
	name string
	d    time.Duration
}

var stepsRE = regexp.MustCompile(`(ADD|DEL) (\S+): took (.*)$`)

// stepsOf reads every step the debug log timed for verb of id.
func stepsOf(logFile, verb, id string) ([]step, error) {
	b, err := os.ReadFile(logFile)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		m := stepsRE.FindStringSubmatch(line)
		if m == nil || m[1] != verb || m[2] != id {
			continue
		}
		var out []step
		for _, part := range strings.Split(m[3], ", ") {
			name, ds, ok := strings.Cut(part, " ")
			if !ok {
				continue
			}
			d, err := time.ParseDuration(ds)
			if err != nil {
				return nil, fmt.Errorf("%s in %q: %w", ds, line, err)
			}
			out = append(out, step{name, d})
		}
		return out, nil
	}
	return nil, fmt.Errorf("no step times for %s %s in %s", verb, id, logFile)
}

// latency: ADD then DEL of n sandboxes, one at a time, the sides
// interleaved: harvester-ipam, whereabouts alone, and the floor (a plugin
// that does nothing but delegate, built from testcni/passthrough).
func (b *bencher) latency(ctx context.Context, n, k int) error {
	h, w := b.sides(delegateRange(210, k, 0), delegateRange(210, k, 1))
	f, err := b.floor(ctx, delegateRange(230, k, 0))
	if err != nil {
		return err
	}
	// harvester-ipam standing in: the config names whereabouts, CNI_PATH
	// has harvester-ipam at that name and the real one beside it.
	st := side{name: "stand-in", bin: b.rig.PluginBinary(), typ: "whereabouts", path: b.rig.StandInDir(b.wb), rng: delegateRange(250, k, 0)}
	sides := []side{h, st, w, f}
	for i := range sides {
		sides[i].ifname = fmt.Sprintf("lhnet%d", i+1)
	}
	add := map[string][]time.Duration{}
	del := map[string][]time.Duration{}
	type sb struct{ id, pod string }
	var sbs []sb
	for i := 0; i < n; i++ {
		s := sb{b.id(), fmt.Sprintf("instance-manager-%04d", i)}
		sbs = append(sbs, s)
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "ADD", s.id, s.pod)
			if err != nil {
				return err
			}
			add[sd.name] = append(add[sd.name], m.Wall)
		}
	}
	for i, s := range sbs {
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "DEL", s.id, s.pod)
			if err != nil {
				return err
			}
			del[sd.name] = append(del[sd.name], m.Wall)
		}
	}
	// The process alone: exec, runtime, package init, one line out.
	start := map[string][]time.Duration{}
	for i := 0; i < n; i++ {
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "VERSION", "", "")
			if err != nil {
				return err
			}
			start[sd.name] = append(start[sd.name], m.Wall)
		}
	}
	// Peak memory in runs of its own, since sampling /proc slows the process
	// it samples: the ADD and DEL of up to 24 more sandboxes a side.
	rss := map[string][]int64{}
	for i := 0; i < min(n, 24); i++ {
		s := sb{b.id(), fmt.Sprintf("memory-%04d", i)}
		for _, verb := range []string{"ADD", "DEL"} {
			for _, sd := range order(i, sides...) {
				m, err := b.peak(ctx, sd, verb, s.id, s.pod)
				if err != nil {
					return err
				}
				rss[sd.name] = append(rss[sd.name], m.PeakRSS)
			}
		}
	}
	fmt.Printf("## One sandbox at a time, on whereabouts %s (%d sandboxes, process start included)\n\n", b.wb, n)
	fmt.Printf("| | harvester-ipam -> whereabouts %s (named in the NAD) | ratio | harvester-ipam standing in for whereabouts %s | ratio | whereabouts %s alone | the floor: passthrough -> whereabouts | its ratio |\n", b.wb, b.wb, b.wb)
	fmt.Println("|---|---|---|---|---|---|---|---|")
	row := func(what string, v map[string][]time.Duration) {
		for _, q := range []struct {
			name string
			at   func([]time.Duration) time.Duration
		}{{"median", median}, {"p95", p95}} {
			hv, sv, wv, fv := q.at(v[h.name]), q.at(v[st.name]), q.at(v[w.name]), q.at(v[f.name])
			fmt.Printf("| %s %s | %s | %.2fx | %s | %.2fx | %s | %s | %.2fx |\n", what, q.name, ms(hv), ratio(hv, wv), ms(sv), ratio(sv, wv), ms(wv), ms(fv), ratio(fv, wv))
		}
	}
	row("ADD", add)
	row("DEL", del)
	row("process start (VERSION)", start)
	for _, q := range []struct {
		name string
		at   func([]int64) int64
	}{{"max", maxInt}, {"median", medianInt}} {
		hv, sv, wv, fv := q.at(rss[h.name]), q.at(rss[st.name]), q.at(rss[w.name]), q.at(rss[f.name])
		fmt.Printf("| peak RSS of the plugin process (%s) | %.1f MiB | %.2fx | %.1f MiB | %.2fx | %.1f MiB | %.1f MiB | %.2fx |\n", q.name,
			float64(hv)/1024, float64(hv)/float64(wv), float64(sv)/1024, float64(sv)/float64(wv), float64(wv)/1024, float64(fv)/1024, float64(fv)/float64(wv))
	}
	fmt.Println()
	return nil
}

// floor is the passthrough side: testcni/passthrough, built once per run,
// with a CNI_PATH of its own per delegate that holds that whereabouts.
func (b *bencher) floor(ctx context.Context, rng string) (side, error) {
	bin := filepath.Join(b.rig.Dir, "passthrough")
	if _, err := os.Stat(bin); err != nil {
		if err := b.rig.BuildCommand(ctx, "./testcni/passthrough", bin, ""); err != nil {
			return side{}, err
		}
	}
	dir := filepath.Join(b.rig.Dir, "floor-"+b.wb)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return side{}, err
	}
	wb := filepath.Join(dir, "whereabouts")
	if err := os.Symlink(b.rig.Tools["whereabouts-"+b.wb], wb); err != nil && !os.IsExist(err) {
		return side{}, err
	}
	return side{name: "passthrough", bin: bin, typ: "passthrough", path: dir, rng: rng}, nil
}

// storm: 20 pods at once, each recreated 5 times without DEL.
func (b *bencher) storm(ctx context.Context) error {
	const pods, sandboxes = 20, 5
	h, w := b.sides("10.202.0.0/24", "10.203.0.0/24")
	h.name = "harvester-ipam -> " + b.wb
	w7 := side{name: "whereabouts v0.7.0", bin: b.rig.Tools["whereabouts-v0.7.0"], typ: "whereabouts", path: b.rig.CNIDir(testcni.V070), rng: "10.204.0.0/24"}
	h7 := side{name: "harvester-ipam -> v0.7.0", bin: b.rig.PluginBinary(), typ: "harvester-ipam", path: b.rig.CNIDir(testcni.V070), rng: "10.205.0.0/24"}
	fmt.Printf("## Crash-loop storm: %d pods at once, each recreated %d times without DEL\n\n", pods, sandboxes)
	fmt.Println("| | wall time | allocations held at the end | pods |")
	fmt.Println("|---|---|---|---|")
	for _, sd := range []side{h, w, h7, w7} {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, pods)
		for p := 0; p < pods; p++ {
			wg.Add(1)
			go func(p int) {
				defer wg.Done()
				for s := 0; s < sandboxes; s++ {
					if _, err := b.call(ctx, sd, "ADD", b.id(), fmt.Sprintf("storm-%02d", p)); err != nil {
						errs <- err
						return
					}
				}
			}(p)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return err
		}
		took := time.Since(start)
		pool, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Get(ctx, names.Pool(sd.rng, ""), metav1.GetOptions{})
		if err != nil {
			return err
		}
		fmt.Printf("| %s | %s | %d | %d |\n", sd.name, took.Round(10*time.Millisecond), len(pool.Spec.Allocations), pods)
	}
	fmt.Println()
	return nil
}
