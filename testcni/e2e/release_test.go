package e2e

import (
	"fmt"
	"strings"
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// plant writes allocations into a network's pool, and their reservations, as
// an older whereabouts or an earlier configuration left them.
func plant(t *testing.T, n *testcni.Network, entries map[string]whereaboutsv1alpha1.IPAllocation, orips map[string]string) {
	t.Helper()
	c := ctx(t)
	pools := rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace)
	p, err := pools.Get(c, n.PoolName(), metav1.GetOptions{})
	require.NoError(t, err)
	for off, a := range entries {
		p.Spec.Allocations[off] = a
	}
	_, err = pools.Update(c, p, metav1.UpdateOptions{})
	require.NoError(t, err)
	for name, podRef := range orips {
		_, err := rig.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(n.Tenant.PoolNamespace).Create(c,
			&whereaboutsv1alpha1.OverlappingRangeIPReservation{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef},
			}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

func prefix(n *testcni.Network) string { return strings.TrimSuffix(n.Range, "0/24") }

// Allocations written before whereabouts v0.8 (no ifname) and under another
// ifname are released by the pod's next ADD; other pods' stay as they were.
func TestLegacyAndRenamedAllocationsAreReleased(t *testing.T) {
	onEachDelegate(t, testLegacyAndRenamedAllocationsAreReleased)
}

func testLegacyAndRenamedAllocationsAreReleased(t *testing.T, e *env) {
	n := e.network(t, testcni.Network{})
	a := e.Pod("instance-manager-a")
	b := e.Pod("backing-image-manager-b")
	first := add(t, n, a)
	other := add(t, n, b)
	pre := prefix(n)
	plant(t, n, map[string]whereaboutsv1alpha1.IPAllocation{
		"200": {ContainerID: "legacy-before-v08", PodRef: a.Ref()},
		"201": {ContainerID: "renamed", PodRef: a.Ref(), IfName: "storage0"},
		"202": {ContainerID: "legacy-of-b", PodRef: b.Ref()}, // b's own leftovers are b's business
	}, map[string]string{pre + "200": a.Ref(), pre + "201": a.Ref(), pre + "202": b.Ref()})

	beforeB := testcni.Of(mustAllocs(t, n), b.Ref())
	beforeORIPs := oripsOf(t, n, b.Ref())

	require.NoError(t, first.Kill())
	now := add(t, n, a)

	allocs := mustAllocs(t, n)
	t.Logf("pool after the new sandbox of %s:\n%s", a.Ref(), testcni.Table(allocs))
	held := testcni.Of(allocs, a.Ref())
	require.Len(t, held, 1, "one allocation for the pod")
	assert.Equal(t, now.ContainerID, held[0].ContainerID)
	if e.WB != testcni.V070 {
		assert.Equal(t, "lhnet1", held[0].IfName)
	}
	assert.Equal(t, beforeB, testcni.Of(allocs, b.Ref()), "the other pod's allocations are unchanged")
	assert.Equal(t, beforeORIPs, oripsOf(t, n, b.Ref()), "the other pod's reservations are unchanged")
	for _, o := range mustORIPs(t, n) {
		assert.NotContains(t, []string{pre + "200", pre + "201"}, o.Name, "the released addresses' reservations are gone")
	}
	_ = other
}

func mustAllocs(t *testing.T, n *testcni.Network) []shim.Allocation {
	t.Helper()
	a, err := n.Allocations(ctx(t))
	require.NoError(t, err)
	return a
}

func mustORIPs(t *testing.T, n *testcni.Network) []testcni.ORIP {
	t.Helper()
	o, err := n.ORIPs(ctx(t))
	require.NoError(t, err)
	return o
}

func oripsOf(t *testing.T, n *testcni.Network, podRef string) []testcni.ORIP {
	var out []testcni.ORIP
	for _, o := range mustORIPs(t, n) {
		if o.PodRef == podRef {
			out = append(out, o)
		}
	}
	return out
}

// DEL after the NAD is gone: the network config keeps only the ipam type, and
// the checkpoint tells DEL where the allocation is.
func TestDelAfterTheNADIsGone(t *testing.T) {
	onEachDelegate(t, testDelAfterTheNADIsGone)
}

func testDelAfterTheNADIsGone(t *testing.T, e *env) {
	n := e.network(t, testcni.Network{})
	pod := e.Pod("instance-manager-gone")
	keep := e.Pod("instance-manager-keep")
	s := add(t, n, pod)
	k := add(t, n, keep)
	require.NoError(t, n.ForgetIPAM())

	require.NoError(t, s.Del(ctx(t)), "DEL with a config of only {\"type\":\"harvester-ipam\"}")
	allocs := mustAllocs(t, n)
	assert.Empty(t, testcni.Of(allocs, pod.Ref()), "released")
	assert.Empty(t, oripsOf(t, n, pod.Ref()), "its reservation too")
	assert.Len(t, testcni.Of(allocs, keep.Ref()), 1, "nobody else's")
	require.NoError(t, s.Del(ctx(t)), "DEL again is success")

	// The pool itself deleted (the storage network reconfigured): DEL is success.
	require.NoError(t, rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace).Delete(ctx(t), n.PoolName(), metav1.DeleteOptions{}))
	require.NoError(t, k.Del(ctx(t)), "DEL when the pool was deleted")

	// A sandbox never seen: nothing to release, success.
	never, err := rig.NewSandbox(n, e.Pod("never"), "lhnet1")
	require.NoError(t, err)
	require.NoError(t, never.Del(ctx(t)), "DEL of a sandbox never seen")
}

// A DEL whose storage error whereabouts swallows (the network's whereabouts
// is a wrapper whose DEL reports success and leaves the pool): harvester-ipam,
// standing in or named, releases the attachment itself, never handing DEL
// on; whereabouts alone leaves the address held by no sandbox.
func TestSwallowedDelStillReleases(t *testing.T) {
	onEachDelegate(t, func(t *testing.T, e *env) {
		for i, tt := range []struct {
			ipam     string
			released bool
		}{{testcni.StandIn, true}, {testcni.Named, true}, {testcni.Alone, false}} {
			n := e.network(t, testcni.Network{IPAM: tt.ipam, SwallowDel: true})
			pod := e.Pod(fmt.Sprintf("instance-manager-swallowed-%d", i))
			s := add(t, n, pod)
			require.NoError(t, s.Del(ctx(t)), "%s: DEL reports success", tt.ipam)
			held := testcni.Of(mustAllocs(t, n), pod.Ref())
			if tt.released {
				assert.Empty(t, held, "%s on whereabouts %s: released", tt.ipam, e.WB)
				assert.Empty(t, oripsOf(t, n, pod.Ref()), "%s on whereabouts %s: its reservation too", tt.ipam, e.WB)
			} else {
				assert.Len(t, held, 1, "whereabouts %s alone: the swallowed DEL leaves the address", e.WB)
			}
		}
	})
}

// CHECK passes for a live sandbox, and fails once its allocation is removed
// from the pool by hand.
func TestCheck(t *testing.T) {
	onEachAllocator(t, testCheck)
}

func testCheck(t *testing.T, e *env) {
	// A bridge of its own: the bridge plugin's CHECK compares the bridge's
	// MAC, which changes when another test's sandbox joins a shared bridge.
	n := e.network(t, testcni.Network{CNIVersion: "1.0.0", Bridge: e.bridge("chk")})
	pod := e.Pod("instance-manager-check")
	s := add(t, n, pod)
	require.NoError(t, s.Check(ctx(t)))

	c := ctx(t)
	pools := rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace)
	p, err := pools.Get(c, n.PoolName(), metav1.GetOptions{})
	require.NoError(t, err)
	for off, a := range p.Spec.Allocations {
		if a.ContainerID == s.ContainerID {
			delete(p.Spec.Allocations, off)
		}
	}
	_, err = pools.Update(c, p, metav1.UpdateOptions{})
	require.NoError(t, err)

	err = s.Check(ctx(t))
	require.Error(t, err)
	var ce *testcni.CNIError
	require.ErrorAs(t, err, &ce)
	assert.NotZero(t, ce.Exit)
	assert.Contains(t, ce.Stdout+ce.Stderr, "holds nothing for container "+s.ContainerID+" ifname lhnet1")
}
