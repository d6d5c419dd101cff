package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/testcni"
	"github.com/harvester/harvester-ipam/wire"
)

// The node agent's output against whereabouts', byte for byte, over
// generated configs: IPv4, IPv6 and dual stack; a range with host bits, a
// range "a-b/cidr", range_start and range_end; a top-level exclude beside
// ipRanges' own; network_name, gateway, routes, dns, static addresses and
// CNI_ARGS' IP and GATEWAY; overlapping ranges on and off; pre-existing
// entries and reservations; an ADD of the same pod and interface from a new
// container; a full range; DEL; each at CNI 0.3.1, 0.4.0, 1.0.0 and 1.1.0.
//
// Each case runs three times, on identical pools in three tenants (so in
// three pool namespaces): whereabouts alone (its binary), harvester-ipam's
// exec path (standing in, delegating to that binary) and harvester-ipam
// through its node agent (whereabouts' allocator in-process). What each
// verb printed (stdout, byte for byte), its exit code, and the pools and
// reservations it left must be the same, but for what parityDiff allows
// and says why.
func TestParityWithWhereabouts(t *testing.T) {
	t.Parallel()
	for _, wb := range testcni.Allocators {
		t.Run("whereabouts "+wb, func(t *testing.T) {
			t.Parallel()
			testParity(t, wb)
		})
	}
}

// parityStep is one verb of a case.
type parityStep struct {
	verb      string // ADD or DEL
	container string
	pod       string
	ifName    string // lhnet1 unless set
	args      string // more CNI_ARGS (IP=..., GATEWAY=...)
}

// paritySeed is a pool or a reservation that exists before a case runs.
type paritySeed struct {
	pool    *whereaboutsv1alpha1.IPPool
	orip    *whereaboutsv1alpha1.OverlappingRangeIPReservation
	comment string
}

type parityCase struct {
	name       string
	cniVersion string
	ipam       map[string]any // whereabouts' fields but type and configuration_path
	seeds      []paritySeed
	steps      []parityStep
	// reclaims says that harvester-ipam releases what the pod's earlier
	// sandboxes hold (its point) where whereabouts alone keeps it: on
	// another interface before whereabouts allocates, and, on whereabouts
	// v0.7.0, which hands nothing over, on the ADD's own interface once it
	// has allocated. What the pod gets may then differ from whereabouts
	// alone's. reclaims070 says so for whereabouts v0.7.0 only. (On the
	// ADD's own interface, whereabouts v0.8.0 and later hand the entry over
	// in the write that allocates, as alone.)
	reclaims, reclaims070 string
	// handOver070 says why, on whereabouts v0.7.0 only, harvester-ipam's
	// two paths may differ: an earlier sandbox's entry on the ADD's own
	// interface (one a v0.8.0 or later whereabouts wrote, on CRDs that keep
	// the ifname) is left for the allocation to hand over, which the node
	// agent's allocator does, as v0.8.0 and later do, and v0.7.0 does not:
	// it allocates another, and the exec path releases the earlier entry
	// after. The pod holds one address on either path.
	handOver070 string
}

// parityPaths are the three runs of a case.
const (
	pathAlone = "whereabouts alone"
	pathExec  = "exec path"
	pathAgent = "agent"
)

// parityCases generates the cases: each shape at each CNI version
// whereabouts answers (conf.SpecVersions: 0.1.0 to 1.1.0), on a range of
// its own.
func parityCases() []parityCase {
	var out []parityCase
	i := 0
	for _, v := range conf.SpecVersions().SupportedVersions() {
		for _, shape := range parityShapes {
			i++
			c := shape(fmt.Sprintf("10.%d.%d", 200+i/250, i%250), fmt.Sprintf("fd00:%x:%x", 200+i/250, i%250))
			c.cniVersion = v
			c.name = fmt.Sprintf("%s cni %s", c.name, v)
			out = append(out, c)
		}
	}
	return out
}

// two is the steps of two pods' ADDs, then the DEL of the second.
func two(extra ...parityStep) []parityStep {
	s := []parityStep{{verb: "ADD", container: "c1", pod: "im-a"}, {verb: "ADD", container: "c2", pod: "im-b"}}
	s = append(s, extra...)
	return append(s, parityStep{verb: "DEL", container: "c2", pod: "im-b"})
}

// parityShapes make a case on the /24 net4 (three octets) and the /64
// net6 (three groups).
var parityShapes = []func(net4, net6 string) parityCase{
	func(n4, _ string) parityCase {
		return parityCase{name: "range", ipam: map[string]any{"range": n4 + ".0/24"}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "range with host bits", ipam: map[string]any{"range": n4 + ".37/24"}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "range a-b/cidr", ipam: map[string]any{"range": n4 + ".10-" + n4 + ".20/24", "exclude": []string{n4 + ".10/32"}}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "range_start and range_end", ipam: map[string]any{"range": n4 + ".0/24", "range_start": n4 + ".50", "range_end": n4 + ".60"}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "top-level exclude", ipam: map[string]any{"range": n4 + ".0/24", "exclude": []string{n4 + ".0/30", n4 + ".5/32"}}, steps: two()}
	},
	func(n4, _ string) parityCase {
		// The top-level exclude applies to the top-level range only.
		return parityCase{name: "ipRanges' own exclude beside a top-level one", ipam: map[string]any{
			"ipRanges": []any{map[string]any{"range": n4 + ".0/24", "exclude": []string{n4 + ".1/32"}}},
			"exclude":  []string{n4 + ".2/32"}}, steps: two()}
	},
	func(n4, n6 string) parityCase {
		return parityCase{name: "dual stack", ipam: map[string]any{
			"ipRanges": []any{map[string]any{"range": n4 + ".0/24"}, map[string]any{"range": n6 + "::/64", "exclude": []string{n6 + "::1/128"}}}}, steps: two()}
	},
	func(n4, n6 string) parityCase {
		return parityCase{name: "IPv6, top-level range beside ipRanges", ipam: map[string]any{
			"range": n6 + "::/120", "exclude": []string{n6 + "::/126"}, "ipRanges": []any{map[string]any{"range": n4 + ".0/24"}}}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "network_name", ipam: map[string]any{"range": n4 + ".0/24", "network_name": "blue"}, steps: two()}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "gateway routes dns addresses", ipam: map[string]any{
			"range": n4 + ".0/24", "gateway": n4 + ".1", "exclude": []string{n4 + ".1/32"},
			"routes":    []any{map[string]any{"dst": "0.0.0.0/0"}, map[string]any{"dst": "192.168.0.0/16", "gw": n4 + ".254"}},
			"dns":       map[string]any{"nameservers": []string{n4 + ".53"}, "domain": "example.org", "search": []string{"a.example.org"}, "options": []string{"ndots:2"}},
			"addresses": []any{map[string]any{"address": n4 + ".200/24", "gateway": n4 + ".1"}},
		}, steps: two()}
	},
	func(n4, n6 string) parityCase {
		return parityCase{name: "CNI_ARGS IP and GATEWAY", ipam: map[string]any{"range": n4 + ".0/24"},
			steps: two(parityStep{verb: "ADD", container: "c3", pod: "im-c", args: "IP=" + n4 + ".201/24," + n6 + "::201/64;GATEWAY=" + n4 + ".1"})}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "overlapping ranges off", ipam: map[string]any{"range": n4 + ".0/24", "enable_overlapping_ranges": false}, steps: two()}
	},
	func(n4, _ string) parityCase {
		// Another pod's entries at .1 and .3, and its reservation of .2
		// (an overlapping range allocated it): the first free is .4.
		return parityCase{name: "pre-existing entries and reservations", ipam: map[string]any{"range": n4 + ".0/24"},
			seeds: []paritySeed{
				{pool: seedPool(n4+".0/24", "", map[string]whereaboutsv1alpha1.IPAllocation{
					"1": {ContainerID: "old1", PodRef: "longhorn-system/im-x", IfName: "lhnet1"},
					"3": {ContainerID: "old3", PodRef: "longhorn-system/im-y", IfName: "lhnet1"}})},
				{orip: seedORIP(n4+".1", "", "old1", "longhorn-system/im-x", "lhnet1")},
				{orip: seedORIP(n4+".2", "", "old2", "longhorn-system/im-z", "lhnet1")},
				{orip: seedORIP(n4+".3", "", "old3", "longhorn-system/im-y", "lhnet1")},
			}, steps: two()}
	},
	func(n4, _ string) parityCase {
		// The pod's earlier sandbox at .9, lower addresses free.
		return parityCase{name: "the pod's earlier sandbox's entry", ipam: map[string]any{"range": n4 + ".0/24"},
			seeds: []paritySeed{
				{pool: seedPool(n4+".0/24", "", map[string]whereaboutsv1alpha1.IPAllocation{
					"9": {ContainerID: "old9", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}})},
				{orip: seedORIP(n4+".9", "", "old9", "longhorn-system/im-a", "lhnet1")},
			}, steps: two(),
			reclaims070: "whereabouts v0.7.0 alone keeps the earlier sandbox's entry (.9) and allocates another (.1): the pod holds two; harvester-ipam releases .9 once v0.7.0 has allocated",
			handOver070: "on whereabouts v0.7.0 the node agent hands the pod its earlier sandbox's entry on lhnet1 (.9), as v0.8.0 and later do; the exec path's v0.7.0 allocates another (.1) and harvester-ipam then releases .9: one address either way"}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "ADD of the same pod and interface from a new container", ipam: map[string]any{"range": n4 + ".0/24"},
			steps:       two(parityStep{verb: "ADD", container: "c3", pod: "im-a"}, parityStep{verb: "DEL", container: "c1", pod: "im-a"}),
			reclaims070: "whereabouts v0.7.0 alone gives the new container a second address (.3) and keeps the first; harvester-ipam releases the first, and v0.7.0 then allocates it again (.1)"}
	},
	func(n4, _ string) parityCase {
		return parityCase{name: "a full range", ipam: map[string]any{"range": n4 + ".0/30"},
			steps: two(parityStep{verb: "ADD", container: "c3", pod: "im-c"}, parityStep{verb: "ADD", container: "c4", pod: "im-d"})}
	},
}

func seedPool(rng, network string, allocs map[string]whereaboutsv1alpha1.IPAllocation) *whereaboutsv1alpha1.IPPool {
	name := strings.NewReplacer("/", "-", ":", "-").Replace(rng)
	if network != "" {
		name = network + "-" + name
	}
	return &whereaboutsv1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}
}

func seedORIP(ip, network, id, podRef, ifName string) *whereaboutsv1alpha1.OverlappingRangeIPReservation {
	name := strings.ReplaceAll(ip, ":", "-")
	if network != "" {
		name = network + "-" + name
	}
	return &whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{ContainerID: id, PodRef: podRef, IfName: ifName}}
}

// parityRun is what one path did in one case.
type parityRun struct {
	outs  []testcni.Run // each step's stdout and exit (stderr for the log)
	pools map[string]whereaboutsv1alpha1.IPPoolSpec
	orips map[string]whereaboutsv1alpha1.OverlappingRangeIPReservationSpec
}

func testParity(t *testing.T, wb string) {
	tenants := map[string]*env{}
	for _, p := range []string{pathAlone, pathExec, pathAgent} {
		path := execPath
		if p == pathAgent {
			path = agentPath
		}
		tenants[p] = newEnvOn(t, wb, path)
	}
	netns := filepath.Join(t.TempDir(), "netns")
	require.NoError(t, os.WriteFile(netns, nil, 0o600))

	cases := parityCases()
	var mu sync.Mutex
	allowedSeen := map[string]int{}
	adds, dels := 0, 0
	for _, pc := range cases {
		for _, s := range pc.steps {
			if s.verb == "ADD" {
				adds++
			} else {
				dels++
			}
		}
	}
	t.Run("cases", func(t *testing.T) {
		for _, pc := range cases {
			t.Run(pc.name, func(t *testing.T) {
				t.Parallel()
				cc := ctx(t) // a case's own: all of them take longer than one
				runs := map[string]*parityRun{}
				var wg sync.WaitGroup
				for p, e := range tenants {
					for _, s := range pc.seeds {
						seed(t, e, s)
					}
					r := &parityRun{}
					runs[p] = r
					wg.Add(1)
					go func() {
						defer wg.Done()
						r.outs = runSteps(cc, t, wb, p, e, pc, netns)
					}()
				}
				wg.Wait()
				for p, e := range tenants {
					runs[p].pools, runs[p].orips = poolsOf(t, e)
				}
				for _, d := range parityDiff(wb, pc, runs) {
					if d.allowed != "" {
						t.Logf("%s: %s differs, as it may: %s", d.paths, d.what, d.allowed)
						mu.Lock()
						allowedSeen[d.allowed]++
						mu.Unlock()
						continue
					}
					t.Errorf("%s: %s differs:\n%s", d.paths, d.what, d.detail)
				}
			})
		}
	})
	// Every verb went through the agent: none declined, none lost, none
	// left to the plugin. Its log has a line a request.
	a := tenants[pathAgent].Agent
	got, err := a.Requests(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, adds, got["ADD served"]+got["ADD failed"], "the agent answered every ADD itself (counts: %v)", got)
	assert.Equal(t, dels, got["DEL served"]+got["DEL failed"], "the agent answered every DEL itself (counts: %v)", got)
	log, err := os.ReadFile(a.Log)
	require.NoError(t, err)
	var missing []string
	for _, pc := range cases {
		for _, s := range pc.steps {
			line := fmt.Sprintf("%s %s/lhnet1: ", s.verb, stepID(pathAgent, pc, s))
			if !strings.Contains(string(log), line+"served") && !strings.Contains(string(log), line+"failed") {
				missing = append(missing, line)
			}
		}
	}
	assert.Empty(t, missing, "verbs the agent did not answer itself")
	for k, n := range allowedSeen {
		t.Logf("a difference that may be, seen %d times: %s", n, k)
	}
}

// seed creates a seed in e's pool namespace.
func seed(t *testing.T, e *env, s paritySeed) {
	t.Helper()
	wbc := rig.WB.WhereaboutsV1alpha1()
	if s.pool != nil {
		p := s.pool.DeepCopy()
		_, err := wbc.IPPools(e.PoolNamespace).Create(ctx(t), p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	if s.orip != nil {
		o := s.orip.DeepCopy()
		_, err := wbc.OverlappingRangeIPReservations(e.PoolNamespace).Create(ctx(t), o, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// runSteps runs a case's verbs on one path, in order: the IPAM binary at
// whereabouts' name, exec'd as a main plugin delegates to it.
func runSteps(c context.Context, t *testing.T, wb, path string, e *env, pc parityCase, netns string) []testcni.Run {
	ipam := map[string]any{"type": "whereabouts", "configuration_path": e.FlatFile}
	for k, v := range pc.ipam {
		ipam[k] = v
	}
	stdin, err := json.Marshal(map[string]any{"cniVersion": pc.cniVersion, "name": "parity", "type": "bridge", "ipam": ipam})
	if err != nil {
		panic(err)
	}
	cniPath := rig.IPAMPath(wb, path != pathAlone)
	agentEnv := wire.EnvSocket + "=" + wire.NoAgent
	if path == pathAgent {
		agentEnv = wire.EnvSocket + "=" + e.Agent.Socket
	}
	// Container IDs are unique on a node, and the exec path and the agent
	// share the node's checkpoint directory: each path's own, the same
	// once normalized (containerID).
	var out []testcni.Run
	for _, s := range pc.steps {
		id := stepID(path, pc, s)
		ifName := s.ifName
		if ifName == "" {
			ifName = "lhnet1"
		}
		// The pods' namespace is the same string in the three tenants: the
		// podrefs compare as they are.
		args := fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s", s.pod, id)
		if s.args != "" {
			args += ";" + s.args
		}
		cmd := exec.CommandContext(c, filepath.Join(cniPath, "whereabouts"))
		cmd.Env = append(os.Environ(), "CNI_COMMAND="+s.verb, "CNI_CONTAINERID="+id, "CNI_NETNS="+netns,
			"CNI_IFNAME="+ifName, "CNI_ARGS="+args, "CNI_PATH="+cniPath, agentEnv)
		cmd.Stdin = bytes.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		// What differs by tenant: its pool namespace and the IDs.
		norm := strings.NewReplacer(e.PoolNamespace, "<pool namespace>", id, s.container)
		r := testcni.Run{Stdout: norm.Replace(stdout.String()), Stderr: stderr.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.Exit = ee.ExitCode()
		} else if err != nil {
			r.Exit, r.Stderr = -1, err.Error()
		}
		out = append(out, r)
	}
	return out
}

// stepID is the container ID of a step on a path: unique on the node.
func stepID(path string, pc parityCase, s parityStep) string {
	tag := map[string]string{pathAlone: "alone", pathExec: "exec", pathAgent: "agent"}[path]
	return s.container + "-" + tag + "-" + strings.NewReplacer(" ", "-", "/", "-", "'", "", ",", "").Replace(pc.name)
}

// poolsOf reads every pool's spec and every reservation's spec of e.
func poolsOf(t *testing.T, e *env) (map[string]whereaboutsv1alpha1.IPPoolSpec, map[string]whereaboutsv1alpha1.OverlappingRangeIPReservationSpec) {
	t.Helper()
	wbc := rig.WB.WhereaboutsV1alpha1()
	pools, err := wbc.IPPools(e.PoolNamespace).List(ctx(t), metav1.ListOptions{})
	require.NoError(t, err)
	orips, err := wbc.OverlappingRangeIPReservations(e.PoolNamespace).List(ctx(t), metav1.ListOptions{})
	require.NoError(t, err)
	ps := map[string]whereaboutsv1alpha1.IPPoolSpec{}
	for _, p := range pools.Items {
		ps[p.Name] = p.Spec
	}
	rs := map[string]whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{}
	for _, o := range orips.Items {
		rs[o.Name] = o.Spec
	}
	return ps, rs
}

// parityDifference is one way two paths differ in a case.
type parityDifference struct {
	paths, what, detail string
	// allowed, when set, says why the difference is what it should be.
	allowed string
}

// parityDiff compares the agent with the exec path, and the exec path with
// whereabouts alone. Pools and reservations of all cases share each
// tenant's namespace: each case compares its own (its ranges' pools, the
// reservations of its addresses).
func parityDiff(wb string, pc parityCase, runs map[string]*parityRun) []parityDifference {
	var out []parityDifference
	alone, execp, agent := runs[pathAlone], runs[pathExec], runs[pathAgent]
	for _, pair := range []struct {
		a, b string
		x, y *parityRun
	}{{pathExec, pathAgent, execp, agent}, {pathAlone, pathExec, alone, execp}} {
		paths := pair.a + " / " + pair.b
		why := pc.reclaims
		if wb == testcni.V070 && pc.reclaims070 != "" {
			why = pc.reclaims070
		}
		reclaim := pair.a == pathAlone && why != ""
		if pair.b == pathAgent && wb == testcni.V070 && pc.handOver070 != "" {
			reclaim, why = true, pc.handOver070
		}
		for i := range pc.steps {
			x, y := pair.x.outs[i], pair.y.outs[i]
			step := fmt.Sprintf("step %d (%s %s of %s)", i+1, pc.steps[i].verb, pc.steps[i].container, pc.steps[i].pod)
			if x.Exit != y.Exit || x.Stdout != y.Stdout {
				d := parityDifference{paths: paths, what: step + "'s output",
					detail: fmt.Sprintf("  %s: exit %d, stdout %q\n    stderr %q\n  %s: exit %d, stdout %q\n    stderr %q", pair.a, x.Exit, x.Stdout, lastLine(x.Stderr), pair.b, y.Exit, y.Stdout, lastLine(y.Stderr))}
				if reclaim {
					d.allowed = why
				} else if pair.a == pathAlone && explains(x.Stdout, y.Stdout) {
					d.allowed = "harvester-ipam explains a full range: the same error code, whereabouts' message within its own, which counts the pool's stale entries and says what releases them"
				}
				out = append(out, d)
			}
		}
		// whereabouts v0.7.0 writes no ifname, in an entry or a
		// reservation; the agent writes what v0.8.0 and later write.
		noIfName := wb == testcni.V070 && pair.b == pathAgent
		const v070 = "whereabouts v0.7.0 writes entries and reservations without an ifname (it has none in its types); the agent writes {id, podref, ifname} as v0.8.0 and later do. v0.7.0 reads the entry by its id and podref (its DEL matches the container ID only), and its own CRDs prune the ifname (TestTheAgentOnEachVersionsOwnCRDs)"
		xp, yp := casePools(pc, pair.x.pools, false), casePools(pc, pair.y.pools, false)
		if fmt.Sprint(xp) != fmt.Sprint(yp) {
			d := parityDifference{paths: paths, what: "the pools", detail: fmt.Sprintf("  %s: %v\n  %s: %v", pair.a, xp, pair.b, yp)}
			if reclaim {
				d.allowed = why
			} else if noIfName && fmt.Sprint(casePools(pc, pair.x.pools, true)) == fmt.Sprint(casePools(pc, pair.y.pools, true)) {
				d.allowed = v070
			}
			out = append(out, d)
		}
		xo, yo := caseORIPs(pc, pair.x.orips, pair.b == pathAgent, false), caseORIPs(pc, pair.y.orips, pair.b == pathAgent, false)
		if fmt.Sprint(xo) != fmt.Sprint(yo) {
			d := parityDifference{paths: paths, what: "the reservations", detail: fmt.Sprintf("  %s: %v\n  %s: %v", pair.a, xo, pair.b, yo)}
			if reclaim {
				d.allowed = why
			} else if noIfName && fmt.Sprint(caseORIPs(pc, pair.x.orips, true, true)) == fmt.Sprint(caseORIPs(pc, pair.y.orips, true, true)) {
				d.allowed = v070
			}
			out = append(out, d)
		}
	}
	return out
}

// casePools are the entries of the pools whose range is one of pc's, as
// "pool/offset: id podref ifname", sorted; without the ifname when
// noIfName.
func casePools(pc parityCase, pools map[string]whereaboutsv1alpha1.IPPoolSpec, noIfName bool) []string {
	var out []string
	for name, p := range pools {
		if !pc.owns(p.Range) {
			continue
		}
		out = append(out, name+" "+p.Range)
		for off, a := range p.Allocations {
			if noIfName {
				a.IfName = "-"
			}
			out = append(out, fmt.Sprintf("%s/%s: %s %s %s", name, off, containerID(a.ContainerID), a.PodRef, a.IfName))
		}
	}
	sort.Strings(out)
	return out
}

// caseORIPs are the reservations of pc's addresses, as "name: containerid
// podref ifname", sorted; without the containerid when noID (the agent
// writes it, whereabouts v0.8.0 and later do not), without the ifname when
// noIfName.
func caseORIPs(pc parityCase, orips map[string]whereaboutsv1alpha1.OverlappingRangeIPReservationSpec, noID, noIfName bool) []string {
	var out []string
	for name, o := range orips {
		if !pc.owns(name) {
			continue
		}
		id := containerID(o.ContainerID)
		if noID {
			id = "-"
		}
		if noIfName {
			o.IfName = "-"
		}
		out = append(out, fmt.Sprintf("%s: %s %s %s", name, id, o.PodRef, o.IfName))
	}
	sort.Strings(out)
	return out
}

// owns says whether a range or a reservation's name is of pc's addresses:
// each case has a /24 and a /64 of its own, and these are in its ipam.
func (pc parityCase) owns(s string) bool {
	b, _ := json.Marshal(pc.ipam)
	for _, prefix := range casePrefixes(string(b)) {
		if strings.HasPrefix(strings.TrimPrefix(s, "blue-"), prefix) {
			return true
		}
	}
	return false
}

// casePrefixes are the /24's first three octets (with a dot) and the /64's
// first three groups (with a dash, as names spell a colon) of a config.
func casePrefixes(conf string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(conf, func(r rune) bool { return strings.ContainsRune("\",[]-/{}", r) }) {
		if n := strings.Count(f, "."); n == 3 && strings.HasPrefix(f, "10.2") {
			parts := strings.SplitN(f, ".", 4)
			out = append(out, strings.Join(parts[:3], ".")+".")
		}
		if strings.HasPrefix(f, "fd00:") {
			parts := strings.SplitN(f, ":", 4)
			if len(parts) == 4 {
				out = append(out, strings.Join(parts[:3], "-")+"-", strings.Join(parts[:3], ":")+":")
			}
		}
	}
	return out
}

// containerID is a step's container ("c1") of a path's own ID
// ("c1-exec-..."); a seed's as it is.
func containerID(id string) string {
	c, _, _ := strings.Cut(id, "-")
	return c
}

// explains says whether harvester-ipam's error (b) is whereabouts' own (a)
// explained: the same code, a's message within b's, and b's details say
// what to do.
func explains(a, b string) bool {
	var ea, eb struct {
		Code    int    `json:"code"`
		Msg     string `json:"msg"`
		Details string `json:"details"`
	}
	if json.Unmarshal([]byte(a), &ea) != nil || json.Unmarshal([]byte(b), &eb) != nil {
		return false
	}
	return ea.Code != 0 && ea.Code == eb.Code && ea.Msg != "" && strings.Contains(eb.Msg, ea.Msg) &&
		strings.Contains(eb.Msg, "stale") && strings.Contains(eb.Details, "harvester-ipam-reconciler")
}
