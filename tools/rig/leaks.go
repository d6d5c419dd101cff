package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/harvester/harvester-ipam/testcni"
)

// The two sides of the leak scenarios are tenants of their own (pool
// namespaces pools-whereabouts and pools-harvester-ipam): the reconciler is
// pointed at harvester-ipam's only, and sees nothing of whereabouts alone.
const (
	aloneTenant = "whereabouts"
	shimTenant  = "harvester-ipam"
	// keptNode runs the scenarios' pods; removedNode is removed in scenario 4.
	keptNode    = "harvester-node-1"
	removedNode = "harvester-node-2"
)

// demoSide is one copy of the storage network: whereabouts v0.9.3 alone, or
// harvester-ipam delegating to it.
type demoSide struct {
	title  string
	ipam   string
	tenant *testcni.Tenant
	third  int // scenario k's range is 192.168.(third+k).0/27
}

type leaks struct {
	rig   *testcni.Rig
	sides [2]demoSide // alone, then harvester-ipam
}

// leakDemo runs the scenarios whereabouts v0.9.3 alone still leaks in, each
// on its own pair of pools, and returns their rows.
func leakDemo(ctx context.Context, rig *testcni.Rig) ([]row, error) {
	d := &leaks{rig: rig}
	for i, s := range []struct {
		name, ipam string
		third      int
	}{{aloneTenant, testcni.Alone, 100}, {shimTenant, testcni.StandIn, 200}} {
		t, err := rig.NewTenant(ctx, s.name)
		if err != nil {
			return nil, err
		}
		d.sides[i] = demoSide{title: sideTitle(s.ipam, testcni.V093), ipam: s.ipam, tenant: t, third: s.third}
	}
	for _, n := range []string{keptNode, removedNode} {
		if err := rig.CreateNode(ctx, n); err != nil {
			return nil, err
		}
	}
	// The reconciler reads the NADs too (for sizes); none name these pools.
	if err := rig.InstallNADCRD(ctx); err != nil {
		return nil, err
	}
	fmt.Printf("Two copies of Harvester's storage network, each a /27 with the first two addresses excluded (28 usable):\n"+
		"one whose IPAM is whereabouts %s alone (Harvester's current chart), pools in namespace %s;\n"+
		"one where harvester-ipam stands in for that same whereabouts (the NAD still names whereabouts, as Harvester\n"+
		"writes it; no NAD is edited), pools in namespace %s.\n"+
		"The pods are Longhorn's, in longhorn-system; each scenario has a pool of its own on each side.\n",
		testcni.V093, d.sides[0].tenant.PoolNamespace, d.sides[1].tenant.PoolNamespace)

	var rows []row
	for _, sc := range []func(context.Context) (row, error){
		d.crashLoop, d.legacyEntry, d.renamedInterface, d.delAfterNADGone, d.removedNode, d.swallowedDel,
	} {
		r, err := sc(ctx)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// network is scenario k's copy of the storage network on side sd, with
// ipam on whereabouts wb. The name is the side's and the scenario's, so that
// a second call rewrites the same network (the NAD edited, or upgraded).
func (d *leaks) network(sd demoSide, k int, ipam, wb string, swallowDel bool) (*testcni.Network, error) {
	p := fmt.Sprintf("192.168.%d", sd.third+k)
	return d.rig.AddNetwork(testcni.Network{
		Name: fmt.Sprintf("storagenetwork-%d-%s", k, sd.tenant.Name), IPAM: ipam, Whereabouts: wb, Tenant: sd.tenant,
		Range: p + ".0/27", Exclude: []string{p + ".1/32", p + ".2/32"}, SwallowDel: swallowDel,
	})
}

// crashLoop on v0.9.3: no leak on either side, since v0.8; it is here so
// that the table says what v0.9.3 fixed, not only what it did not.
func (d *leaks) crashLoop(ctx context.Context) (row, error) {
	r, err := crashLoop(ctx, d.rig, testcni.V093, d.sides[0].tenant, d.sides[1].tenant, "192.168.100", "192.168.200")
	r.name = "0. " + r.name
	return r, err
}

// legacyEntry: an entry v0.7.0 wrote (no ifname), its sandbox killed by a
// node reboot, then Harvester upgraded to v0.9.3 before the pod's next
// sandbox. Both sides name the pool after the range, so v0.9.3 reads the
// pool v0.7.0 wrote.
func (d *leaks) legacyEntry(ctx context.Context) (row, error) {
	r := row{delegate: testcni.V093, name: "1. v0.7.0 entry, node reboot, upgrade", aloneLeaks: true}
	pod := longhorn("instance-manager-0e4b1a7c")
	heading("1. an entry written before v0.8, after an upgrade: %s", pod.Ref())
	fmt.Printf("On Harvester's 2024 release whereabouts %s gave the pod's sandbox an address and wrote no ifname. The node\n"+
		"reboots (no DEL), Harvester is upgraded (whereabouts %s; on the other side harvester-ipam now stands in for it), and the\n"+
		"pod's next sandbox is ADDed. %s hands back an address only when podref AND ifname match.\n", testcni.V070, testcni.V093, testcni.V093)
	for i, sd := range d.sides {
		before, err := d.network(sd, 1, testcni.Alone, testcni.V070, false)
		if err != nil {
			return r, err
		}
		old, err := addSandbox(ctx, d.rig, before, pod, "lhnet1")
		if err != nil {
			return r, err
		}
		if err := old.Kill(); err != nil {
			return r, err
		}
		after, err := d.network(sd, 1, sd.ipam, testcni.V093, false)
		if err != nil {
			return r, err
		}
		cur, err := d.nextSandbox(ctx, after, old, pod, "lhnet1")
		if err != nil {
			return r, err
		}
		if err := d.finish(ctx, &r, i, after, []*testcni.Sandbox{cur}, pod); err != nil {
			return r, err
		}
		if err := markRunning(ctx, d.rig, sd.tenant, pod, cur); err != nil {
			return r, err
		}
	}
	return r, nil
}

// renamedInterface: the NAD's interface renamed; the pod's old sandbox
// died without DEL and its next one attaches under the new name.
func (d *leaks) renamedInterface(ctx context.Context) (row, error) {
	r := row{delegate: testcni.V093, name: "2. interface renamed lhnet1 -> lhnet2", aloneLeaks: true}
	pod := longhorn("backing-image-manager-5f3c")
	heading("2. an interface renamed: %s", pod.Ref())
	fmt.Println("The storage network's interface is renamed lhnet1 -> lhnet2; the pod's sandbox on lhnet1 died without DEL,\n" +
		"its next sandbox attaches as lhnet2. The old entry's ifname no longer matches.")
	for i, sd := range d.sides {
		n, err := d.network(sd, 2, sd.ipam, testcni.V093, false)
		if err != nil {
			return r, err
		}
		old, err := addSandbox(ctx, d.rig, n, pod, "lhnet1")
		if err != nil {
			return r, err
		}
		if err := old.Kill(); err != nil {
			return r, err
		}
		cur, err := d.nextSandbox(ctx, n, old, pod, "lhnet2")
		if err != nil {
			return r, err
		}
		if err := d.finish(ctx, &r, i, n, []*testcni.Sandbox{cur}, pod); err != nil {
			return r, err
		}
		if err := markRunning(ctx, d.rig, sd.tenant, pod, cur); err != nil {
			return r, err
		}
	}
	return r, nil
}

// delAfterNADGone: the storage network disabled (NAD deleted) and the pod
// deleted; its sandbox's DEL comes with the config as it is without the NAD.
func (d *leaks) delAfterNADGone(ctx context.Context) (row, error) {
	r := row{delegate: testcni.V093, name: "3. DEL after the NAD is gone", aloneLeaks: true}
	pod := longhorn("instance-manager-9d1b47c2")
	heading("3. a DEL after the NAD is gone: %s", pod.Ref())
	fmt.Println("The storage network is disabled: its NAD is deleted, then the pod. The sandbox's DEL comes with the config\n" +
		"as it is once the NAD is gone: the ipam object keeps only its type (no range, no flat file).")
	for i, sd := range d.sides {
		n, err := d.network(sd, 3, sd.ipam, testcni.V093, false)
		if err != nil {
			return r, err
		}
		s, err := addSandbox(ctx, d.rig, n, pod, "lhnet1")
		if err != nil {
			return r, err
		}
		if err := n.ForgetIPAM(); err != nil {
			return r, err
		}
		if err := d.delAndShow(ctx, &r, i, n, s); err != nil {
			return r, err
		}
	}
	fmt.Println("harvester-ipam found the pool in its checkpoint of the attachment. whereabouts alone has only this config,\n" +
		"which names no pool: the runtime's retries of the DEL fail the same way.")
	return r, nil
}

// removedNode: a node dies and is removed; its pods' DELs never run. Only
// the reconciler can release what they held.
func (d *leaks) removedNode(ctx context.Context) (row, error) {
	r := row{delegate: testcni.V093, name: "4. node removed (reconciler, --grace 0s)", aloneLeaks: true}
	pod := longhorn("instance-manager-e2a0c4d1")
	heading("4. a node removed: %s ran on %s", pod.Ref(), removedNode)
	fmt.Printf("The pod runs on %s; the node dies and is removed from the cluster. Its pods' DELs never run.\n", removedNode)
	nets := make([]*testcni.Network, len(d.sides))
	sbs := make([]*testcni.Sandbox, len(d.sides))
	for i, sd := range d.sides {
		n, err := d.network(sd, 4, sd.ipam, testcni.V093, false)
		if err != nil {
			return r, err
		}
		if sbs[i], err = addSandbox(ctx, d.rig, n, pod, "lhnet1"); err != nil {
			return r, err
		}
		nets[i] = n
	}
	if err := d.rig.CreatePod(ctx, pod, testcni.PodState{Node: removedNode, Phase: "Running", StatusIPs: []string{sbs[1].IP()}}); err != nil {
		return r, err
	}
	for _, s := range sbs {
		if err := s.Kill(); err != nil {
			return r, err
		}
	}
	if err := d.rig.DeleteNode(ctx, removedNode); err != nil {
		return r, err
	}
	shim := d.sides[1].tenant
	fmt.Printf("harvester-ipam-reconciler --namespace %s --grace 0s (the default grace is 10m; 0s only for the demo),\n"+
		"pointed at harvester-ipam's pools only; it judges every pool there, and releases what is stale:\n", shim.PoolNamespace)
	res, err := shim.Reconciler(ctx, "--grace", "0s")
	if err != nil {
		return r, fmt.Errorf("run the reconciler: %w", err)
	}
	fmt.Print(indent(res.Stdout + res.Stderr))
	if res.Exit != 0 {
		r.problems = append(r.problems, fmt.Sprintf("the reconciler exited %d", res.Exit))
	}
	fmt.Println("whereabouts alone: its IPAM binary has no pass of its own; whereabouts' separate ip-control-loop and\n" +
		"ip-reconciler are not run here.")
	for i := range d.sides {
		if err := d.finish(ctx, &r, i, nets[i], nil, pod); err != nil {
			return r, err
		}
	}
	return r, nil
}

// swallowedDel: whereabouts' DEL swallows its storage errors (a lease not
// had in time, a failed patch) and returns success; the runtime never
// retries. A wrapper stands in for the failure.
func (d *leaks) swallowedDel(ctx context.Context) (row, error) {
	r := row{delegate: testcni.V093, name: "5. DEL swallowed (a wrapper stands in)", aloneLeaks: true}
	pod := longhorn("backing-image-ds-47c2")
	heading("5. a DEL whose storage failure whereabouts swallows: %s", pod.Ref())
	fmt.Println("The pod is deleted and its DEL comes while whereabouts' storage fails: whereabouts logs the error and returns\n" +
		"success. A wrapper stands in for that failure: on both sides `whereabouts` DEL returns success and touches\n" +
		"nothing. harvester-ipam never hands DEL to whereabouts: it releases itself, and fails (error 11) if it cannot.")
	for i, sd := range d.sides {
		n, err := d.network(sd, 5, sd.ipam, testcni.V093, true)
		if err != nil {
			return r, err
		}
		s, err := addSandbox(ctx, d.rig, n, pod, "lhnet1")
		if err != nil {
			return r, err
		}
		if err := d.delAndShow(ctx, &r, i, n, s); err != nil {
			return r, err
		}
	}
	return r, nil
}

// nextSandbox ADDs the pod's next sandbox once the watch cache, which
// harvester-ipam's ADD reads first, shows the old one: a real sandbox comes
// seconds later, the rig's comes at once.
func (d *leaks) nextSandbox(ctx context.Context, n *testcni.Network, old *testcni.Sandbox, pod testcni.Pod, ifName string) (*testcni.Sandbox, error) {
	if err := n.WaitCached(ctx, old); err != nil {
		return nil, fmt.Errorf("wait for the old sandbox in the watch cache: %w", err)
	}
	return addSandbox(ctx, d.rig, n, pod, ifName)
}

// delAndShow DELs sandbox s (its pod deleted) and says what DEL answered and
// what the pool and the reservations hold after.
func (d *leaks) delAndShow(ctx context.Context, r *row, i int, n *testcni.Network, s *testcni.Sandbox) error {
	err := s.Del(ctx)
	fmt.Printf("%s: DEL answered %s\n", d.sides[i].title, answer(err))
	if i == 1 && err != nil {
		r.problems = append(r.problems, "harvester-ipam's DEL failed: "+answer(err))
	}
	return d.finish(ctx, r, i, n, nil, s.Pod)
}

// finish prints side i's pool and the pod's reservations, records the
// side's tally in r, and on harvester-ipam's side checks the invariants.
func (d *leaks) finish(ctx context.Context, r *row, i int, n *testcni.Network, live []*testcni.Sandbox, pod testcni.Pod) error {
	t, err := showPool(ctx, d.sides[i].title, n, []testcni.Pod{pod}, liveOf(live...))
	if err != nil {
		return err
	}
	orips, err := n.ORIPs(ctx)
	if err != nil {
		return err
	}
	var mine []string
	for _, o := range orips {
		if o.PodRef == pod.Ref() {
			mine = append(mine, o.Name)
		}
	}
	if len(mine) == 0 {
		mine = []string{"none"}
	}
	fmt.Printf("  reservations (ORIPs) of the pod: %s\n", strings.Join(mine, " "))
	if i == 0 {
		r.alone = t
		return nil
	}
	r.shimmed = t
	bad, err := verify(ctx, n, live, pod)
	r.problems = append(r.problems, bad...)
	return err
}

// answer says what a CNI verb answered, as the runtime sees it.
func answer(err error) string {
	var ce *testcni.CNIError
	switch {
	case err == nil:
		return "success (exit 0)"
	case errors.As(err, &ce):
		msg := strings.TrimSpace(ce.Stderr)
		if msg == "" {
			msg = strings.TrimSpace(ce.Stdout)
		}
		return fmt.Sprintf("an error (exit %d): %s", ce.Exit, lastLine(msg))
	default:
		return "an error: " + err.Error()
	}
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}
