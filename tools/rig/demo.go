package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// demo shows, side by side on two copies of Harvester's storage network (a
// /27 with the first two addresses excluded), what whereabouts alone keeps
// and what harvester-ipam in front of the same whereabouts releases: first
// the leaks whereabouts v0.9.3 (Harvester's current chart) still has, then
// the crash loop and the node reboot of v0.7.0 (Harvester's 2024 releases).
// It closes with a summary table read from the pools, and fails when a
// scenario does not come out as the demo claims.
func demo(ctx context.Context, rig *testcni.Rig) error {
	var rows []row
	leaks, err := leakDemo(ctx, rig)
	rows = append(rows, leaks...)
	if err == nil {
		var r row
		r, err = crashLoop(ctx, rig, testcni.V070, rig.Default, rig.Default, "192.168.50", "192.168.60")
		rows = append(rows, r)
	}
	if err == nil {
		var r row
		r, err = rebootDemo(ctx, rig)
		rows = append(rows, r)
	}
	if err != nil {
		return err
	}
	return summary(rows)
}

// tally is what one side's pool holds of a scenario's pods once it is over.
type tally struct {
	held int // the pods' entries in the pool
	live int // of them, those a live sandbox of the pod uses
}

func (t tally) leaked() int { return t.held - t.live }

func (t tally) String() string { return fmt.Sprintf("%d / %d", t.held, t.leaked()) }

// row is one scenario of the summary.
type row struct {
	delegate       string // the whereabouts version both sides allocate with
	name           string
	alone, shimmed tally
	// aloneLeaks is the demo's claim about whereabouts alone here.
	aloneLeaks bool
	// problems are what the demo found wrong on harvester-ipam's side
	// beyond its tally (Network.Verify, a reservation left, an exit status).
	problems []string
}

// failures say where the scenario did not come out as the demo claims.
func (r row) failures() []string {
	var out []string
	if n := r.shimmed.leaked(); n != 0 {
		out = append(out, fmt.Sprintf("harvester-ipam -> whereabouts %s left %d address(es) that no live sandbox uses", r.delegate, n))
	}
	out = append(out, r.problems...)
	switch n := r.alone.leaked(); {
	case r.aloneLeaks && n == 0:
		out = append(out, fmt.Sprintf("whereabouts %s alone leaked nothing here, though the demo says it does", r.delegate))
	case !r.aloneLeaks && n != 0:
		out = append(out, fmt.Sprintf("whereabouts %s alone leaked %d here, though the demo says it does not", r.delegate, n))
	}
	return out
}

// tallyOf counts the entries of pods in allocs, and those whose container
// is one of live (container ID -> ifname; an entry without ifname, as
// whereabouts before v0.8 writes them, counts for its container).
func tallyOf(allocs []shim.Allocation, pods []testcni.Pod, live map[string]string) tally {
	var t tally
	for _, p := range pods {
		for _, a := range testcni.Of(allocs, p.Ref()) {
			t.held++
			if ifn, ok := live[a.ContainerID]; ok && (a.IfName == "" || a.IfName == ifn) {
				t.live++
			}
		}
	}
	return t
}

// liveOf indexes sandboxes by container ID, for tallyOf.
func liveOf(sbs ...*testcni.Sandbox) map[string]string {
	m := map[string]string{}
	for _, s := range sbs {
		m[s.ContainerID] = s.IfName
	}
	return m
}

// crashLoop crash-loops one Longhorn pod: each sandbox dies without its DEL,
// as when sandbox creation fails or the node reboots, and the next one is
// ADDed. aloneT and shimT are the tenants of the two sides' pools.
func crashLoop(ctx context.Context, rig *testcni.Rig, wb string, aloneT, shimT *testcni.Tenant, aloneNet, shimNet string) (row, error) {
	const sandboxes = 4
	r := row{delegate: wb, name: fmt.Sprintf("crash loop, %d sandboxes of one pod", sandboxes), aloneLeaks: wb == testcni.V070}
	pod := longhorn("instance-manager-6b77fd6b240ff0e6")
	heading("crash loop on whereabouts %s: %s gets %d sandboxes, each dies without its DEL", wb, pod.Ref(), sandboxes)
	if wb == testcni.V070 {
		fmt.Println("whereabouts v0.7.0 gives every new sandbox a new address; the old one stays.")
	} else {
		fmt.Printf("whereabouts %s gives a new sandbox of the same pod and interface the address it held (fixed in v0.8).\n", wb)
	}
	for i, sd := range []struct {
		ipam   string
		tenant *testcni.Tenant
		prefix string
		t      *tally
	}{{testcni.Alone, aloneT, aloneNet, &r.alone}, {testcni.StandIn, shimT, shimNet, &r.shimmed}} {
		n, err := rig.AddNetwork(testcni.Network{Name: fmt.Sprintf("crashloop-%s-%s", wb, sd.ipam), IPAM: sd.ipam, Whereabouts: wb,
			Tenant: sd.tenant, Range: sd.prefix + ".0/27", Exclude: []string{sd.prefix + ".1/32", sd.prefix + ".2/32"}})
		if err != nil {
			return r, err
		}
		var last *testcni.Sandbox
		for k := 0; k < sandboxes; k++ {
			if last != nil {
				if err := last.Kill(); err != nil {
					return r, err
				}
				// The next sandbox comes seconds later: harvester-ipam's ADD
				// first reads the watch cache, which by then shows the old entry.
				if err := n.WaitCached(ctx, last); err != nil {
					return r, fmt.Errorf("crash loop: %w", err)
				}
			}
			if last, err = addSandbox(ctx, rig, n, pod, "lhnet1"); err != nil {
				return r, err
			}
		}
		if *sd.t, err = showPool(ctx, sideTitle(sd.ipam, wb), n, []testcni.Pod{pod}, liveOf(last)); err != nil {
			return r, err
		}
		if i == 1 {
			if r.problems, err = verify(ctx, n, []*testcni.Sandbox{last}, pod); err != nil {
				return r, err
			}
		}
		if err := markRunning(ctx, rig, sd.tenant, pod, last); err != nil {
			return r, err
		}
	}
	return r, nil
}

// markRunning creates the pod object, Running on the node that stays, with
// Multus' network-status naming sandbox s's address, when t is the tenant
// the reconciler looks at: it judges pods by their objects, as in a cluster.
func markRunning(ctx context.Context, rig *testcni.Rig, t *testcni.Tenant, pod testcni.Pod, s *testcni.Sandbox) error {
	if t.Name != shimTenant {
		return nil
	}
	return rig.CreatePod(ctx, pod, testcni.PodState{Node: keptNode, Phase: "Running", StatusIPs: []string{s.IP()}})
}

// addSandbox creates a sandbox of pod on n and ADDs it.
func addSandbox(ctx context.Context, rig *testcni.Rig, n *testcni.Network, pod testcni.Pod, ifName string) (*testcni.Sandbox, error) {
	s, err := rig.NewSandbox(n, pod, ifName)
	if err != nil {
		return nil, err
	}
	if err := s.Add(ctx); err != nil {
		return nil, fmt.Errorf("ADD of %s on %s (%s -> whereabouts %s): %w", pod.Ref(), n.Name, n.IPAM, n.Whereabouts, err)
	}
	return s, nil
}

// showPool prints one side's pool and returns its tally for pods.
func showPool(ctx context.Context, title string, n *testcni.Network, pods []testcni.Pod, live map[string]string) (tally, error) {
	allocs, err := n.Allocations(ctx)
	if err != nil {
		return tally{}, err
	}
	t := tallyOf(allocs, pods, live)
	table := testcni.Table(allocs)
	if len(allocs) == 0 {
		table = "  (no entries)\n"
	}
	fmt.Printf("%s (pool %s/%s): holds %d, leaked %d, %d of 28 usable left\n%s",
		title, n.Tenant.PoolNamespace, n.PoolName(), t.held, t.leaked(), 28-len(allocs), table)
	return t, nil
}

// verify checks harvester-ipam's side against the invariants of docs/invariants.md.
func verify(ctx context.Context, n *testcni.Network, live []*testcni.Sandbox, pods ...testcni.Pod) ([]string, error) {
	bad, err := n.Verify(ctx, live, pods)
	if err != nil {
		return nil, fmt.Errorf("verify pool %s: %w", n.PoolName(), err)
	}
	return bad, nil
}

func sideTitle(ipam, wb string) string {
	switch ipam {
	case testcni.Alone:
		return "whereabouts " + wb + " alone"
	case testcni.Named:
		return "harvester-ipam (named in the NAD) -> whereabouts " + wb
	}
	return "harvester-ipam standing in for whereabouts " + wb
}

func longhorn(name string) testcni.Pod { return testcni.Pod{Namespace: "longhorn-system", Name: name} }

func heading(format string, a ...any) {
	fmt.Printf("\n== "+format+" ==\n", a...)
}

// summary prints one row per scenario, grouped by whereabouts version, and
// fails when a scenario did not come out as claimed.
func summary(rows []row) error {
	heading("summary: HELD / LEAKED, per scenario: the addresses its pods hold in the pool at the end / of them, those no live sandbox uses")
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	var failed []string
	last := ""
	for _, r := range rows {
		if r.delegate != last {
			if last != "" {
				fmt.Fprintln(w, "\t\t")
			}
			fmt.Fprintf(w, "SCENARIO\tWHEREABOUTS %s ALONE\tHARVESTER-IPAM IN ITS PLACE\n", r.delegate)
			last = r.delegate
		}
		verdict := ""
		if f := r.failures(); len(f) > 0 {
			verdict = "   <- NOT AS CLAIMED"
			for _, x := range f {
				failed = append(failed, r.name+": "+x)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s%s\n", r.name, r.alone, r.shimmed, verdict)
	}
	w.Flush()
	// The blank row between the versions keeps one set of columns; its padding goes.
	for _, line := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		fmt.Println(strings.TrimRight(line, " "))
	}
	if len(failed) > 0 {
		fmt.Printf("\nTHE DEMO'S CLAIM DOES NOT HOLD in %d point(s):\n  %s\n", len(failed), strings.Join(failed, "\n  "))
		return errors.New("the demo did not come out as claimed (see above)")
	}
	fmt.Println("\nEvery scenario came out as claimed: harvester-ipam left no address that no live sandbox uses.")
	return nil
}
