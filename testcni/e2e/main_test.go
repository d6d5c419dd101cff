// Package e2e proves harvester-ipam where users meet it: a real API server,
// the real whereabouts and bridge plugins, cnitool and network namespaces.
//
// Most tests run once per whereabouts version (testcni.Delegates), side by
// side, each in a tenant of its own (its pool namespace, kubeconfig, flat
// file and pod namespace). Tests that stop the API server run alone, first.
package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// rig is shared by the tests of this package: each test has networks of its own.
var rig *testcni.Rig

func TestMain(m *testing.M) {
	if err := testcni.Isolate(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	r, err := testcni.Start(ctx, testcni.Options{Crashpoints: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: the rig did not start:", err)
		os.Exit(1)
	}
	rig = r
	code := m.Run()
	rig.Close()
	os.Exit(code)
}

var subnet, tenants atomic.Int32

// env is one test on one whereabouts version, in a tenant of its own.
type env struct {
	*testcni.Tenant
	// R is the rig whose API server holds the tenant: the package's rig,
	// or a cluster of its own (Rig.StartCRDCluster).
	R *testcni.Rig
	// WB is the whereabouts version harvester-ipam delegates to.
	WB string
	// Agent, when set, is the tenant's node agent: e.network's networks
	// hand every verb to it.
	Agent *testcni.Agent
}

// The ways a test's verbs are served, for onEach and inTurn: by the plugin
// alone, or through a node agent of the tenant's (which does what the
// plugin would, in-process, and leaves it every verb it does not take).
const (
	execPath  = "exec"
	agentPath = "agent"
)

// pathsEnv chooses the paths onEach and inTurn run each test on: a comma-
// separated list of execPath and agentPath (both unless set), so that every
// scenario written for the plugin runs through the agent too, as a matrix;
// HARVESTER_IPAM_E2E_PATHS=exec go test ./testcni/e2e runs the plugin alone.
const pathsEnv = "HARVESTER_IPAM_E2E_PATHS"

func paths(t *testing.T) []string {
	v := os.Getenv(pathsEnv)
	if v == "" {
		return []string{execPath, agentPath}
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		switch p = strings.TrimSpace(p); p {
		case execPath, agentPath:
			out = append(out, p)
		default:
			t.Fatalf("%s=%q: %q is neither %s nor %s", pathsEnv, v, p, execPath, agentPath)
		}
	}
	return out
}

// subtest names a test's run on a version and a path: the plugin alone
// keeps the names of before.
func subtest(wb, path string) string {
	if path == agentPath {
		return "whereabouts " + wb + " via the agent"
	}
	return "whereabouts " + wb
}

// onEachDelegate runs f once per whereabouts version, side by side with each
// other and with every other test that runs so: call it from a test that
// stops nothing shared (the API server, say).
func onEachDelegate(t *testing.T, f func(t *testing.T, e *env)) {
	onEach(t, testcni.Delegates, f)
}

// onEachAllocator is onEachDelegate on testcni.Allocators: for tests of
// harvester-ipam under load or crashes, which v0.9.4 would run with v0.9.3's
// allocator and DEL.
func onEachAllocator(t *testing.T, f func(t *testing.T, e *env)) {
	onEach(t, testcni.Allocators, f)
}

// onEachAllocatorExecOnly is onEachAllocator on the exec path alone, for a
// test whose subject the agent never serves; why says what it is.
func onEachAllocatorExecOnly(t *testing.T, why string, f func(t *testing.T, e *env)) {
	t.Parallel()
	if slices.Contains(paths(t), agentPath) {
		t.Logf("not through the agent: %s", why)
	}
	for _, v := range testcni.Allocators {
		t.Run(subtest(v, execPath), func(t *testing.T) {
			t.Parallel()
			f(t, newEnvOn(t, v, execPath))
		})
	}
}

// onEach runs f on each version of versions on each path. Through the
// agent, on testcni.Allocators only: the agent allocates and releases with
// whereabouts' allocator in-process, the same on every version, and a
// version matters to it only where its binary does something else (the
// plugin's fallback runs that binary; whereabouts alone beside it). v0.9.4's
// binary allocates and releases as v0.9.3's, so on v0.9.4 the agent path
// would repeat v0.9.3's.
func onEach(t *testing.T, versions []string, f func(t *testing.T, e *env)) {
	t.Parallel()
	for _, path := range paths(t) {
		for _, v := range versions {
			if path == agentPath && !slices.Contains(testcni.Allocators, v) {
				continue
			}
			t.Run(subtest(v, path), func(t *testing.T) {
				t.Parallel()
				f(t, newEnvOn(t, v, path))
			})
		}
	}
}

// inTurn runs f once per whereabouts allocator (testcni.Allocators), one
// after the other, while no other test runs: for tests that stop the API
// server.
func inTurn(t *testing.T, f func(t *testing.T, e *env)) {
	for _, path := range paths(t) {
		for _, v := range testcni.Allocators {
			t.Run(subtest(v, path), func(t *testing.T) { f(t, newEnvOn(t, v, path)) })
		}
	}
}

func newEnv(t *testing.T, wb string) *env { return newEnvOn(t, wb, execPath) }

// newEnvOn is an env whose verbs are served on path: with agentPath, a node
// agent of the tenant's runs for the test.
func newEnvOn(t *testing.T, wb, path string) *env { return newEnvIn(t, rig, wb, path) }

// newEnvIn is newEnvOn in r, the package's rig or a cluster of its own.
func newEnvIn(t *testing.T, r *testcni.Rig, wb, path string) *env {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", tenants.Add(1), strings.ReplaceAll(strings.TrimPrefix(wb, "v"), ".", ""))
	// Under whereabouts' own RBAC: the plugin and whereabouts as
	// whereabouts' ServiceAccount, the agent as the chart's.
	tn, err := r.NewTenantWith(ctx(t), name, testcni.TenantOptions{RBAC: true})
	require.NoError(t, err)
	t.Cleanup(tn.Remove)
	e := &env{Tenant: tn, R: r, WB: wb}
	if path == agentPath {
		e.Agent = startAgent(t, tn)
	}
	return e
}

// startAgent starts a node agent for a tenant's pools, stopped with the
// test; its log is shown when the test fails.
func startAgent(t *testing.T, tn *testcni.Tenant) *testcni.Agent {
	t.Helper()
	return startAgentWith(t, tn, testcni.AgentOptions{})
}

// startAgentWith starts a node agent of o for tn, killed when t ends.
func startAgentWith(t *testing.T, tn *testcni.Tenant, o testcni.AgentOptions) *testcni.Agent {
	t.Helper()
	a, err := tn.Rig().StartAgent(ctx(t), tn, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the node agent's log (%s), last lines:\n%s", a.Log, a.LogTail())
		}
		_ = a.Resume()
		a.Kill()
	})
	return a
}

// bridge is a bridge name of this env's own (a test's, its version's and
// its path's), at most 15 bytes: prefix at most 5.
func (e *env) bridge(prefix string) string {
	b := prefix + "-" + strings.ReplaceAll(strings.TrimPrefix(e.WB, "v"), ".", "")
	if e.Agent != nil {
		b += "-a"
	}
	return b
}

// network adds a network of this env's tenant and delegate, with a /24 of
// its own unless n says otherwise.
func (e *env) network(t *testing.T, n testcni.Network) *testcni.Network {
	t.Helper()
	if n.Tenant == nil {
		n.Tenant = e.Tenant
	}
	if n.Whereabouts == "" {
		n.Whereabouts = e.WB
	}
	if n.Agent == nil {
		n.Agent = e.Agent
	}
	return networkIn(t, e.R, n)
}

// network adds a network with a /24 of its own (in the default tenant unless
// n names one), so that tests never share a pool.
func network(t *testing.T, n testcni.Network) *testcni.Network { return networkIn(t, rig, n) }

// networkIn is network in r.
func networkIn(t *testing.T, r *testcni.Rig, n testcni.Network) *testcni.Network {
	t.Helper()
	i := subnet.Add(1)
	if n.Name == "" {
		n.Name = fmt.Sprintf("sn%d", i)
	}
	if n.Range == "" {
		n.Range = fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250)
	}
	net, err := r.AddNetwork(n)
	require.NoError(t, err)
	return net
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// add makes a new sandbox and runs ADD in it.
func add(t *testing.T, n *testcni.Network, pod testcni.Pod) *testcni.Sandbox {
	t.Helper()
	s, err := rig.NewSandbox(n, pod, "lhnet1")
	require.NoError(t, err)
	require.NoError(t, s.Add(ctx(t)), "ADD of a sandbox of %s", pod.Ref())
	return s
}

func verify(t *testing.T, n *testcni.Network, live []*testcni.Sandbox, pods ...testcni.Pod) {
	t.Helper()
	bad, err := n.Verify(ctx(t), live, pods)
	require.NoError(t, err)
	if len(bad) > 0 {
		allocs, _ := n.Allocations(ctx(t))
		t.Fatalf("invariants broken:\n  %s\npool %s:\n%s", join(bad), n.PoolName(), testcni.Table(allocs))
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "\n  "
		}
		out += x
	}
	return out
}
