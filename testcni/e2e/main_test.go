// Package e2e proves harvester-ipam where users meet it: a real API server,
// the real whereabouts and bridge plugins, cnitool and network namespaces.
package e2e

import (
	"context"
	"fmt"
	"os"
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

var subnet atomic.Int32

// network adds a network with a /24 of its own, so that tests never share a pool.
func network(t *testing.T, n testcni.Network) *testcni.Network {
	t.Helper()
	i := subnet.Add(1)
	if n.Name == "" {
		n.Name = fmt.Sprintf("sn%d", i)
	}
	if n.Range == "" {
		n.Range = fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250)
	}
	net, err := rig.AddNetwork(n)
	require.NoError(t, err)
	return net
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// sandbox makes a new sandbox and runs ADD in it.
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
