package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// The real node: containerd runs the sandboxes and calls Multus, Multus calls
// the storage network's IPAM from its NAD. No kubelet runs: the tests play
// its part through the CRI, with the pod's metadata as the kubelet sends it.

// nodeDelegates are the whereabouts versions the real-node tests run on:
// Harvester's current chart and its 2024 releases.
var nodeDelegates = []string{testcni.V093, testcni.V070}

// nodeEnv is one test on one whereabouts version, on a node of its own.
type nodeEnv struct {
	*env
	node *testcni.Node
}

// onEachNode runs f once per node delegate, side by side with each other
// and every other parallel test, each on a node (containerd) of its own.
func onEachNode(t *testing.T, opt testcni.NodeOptions, f func(t *testing.T, e *nodeEnv)) {
	t.Parallel()
	for _, v := range nodeDelegates {
		t.Run("whereabouts "+v, func(t *testing.T) {
			t.Parallel()
			f(t, newNodeEnv(t, v, opt))
		})
	}
}

func newNodeEnv(t *testing.T, wb string, opt testcni.NodeOptions) *nodeEnv {
	t.Helper()
	e := newEnv(t, wb)
	opt.Whereabouts = wb
	start := time.Now()
	nd, err := rig.StartNode(ctx(t), e.Tenant, opt)
	require.NoError(t, err, "start a node with containerd")
	t.Logf("node %s: containerd ready in %s", nd.Name, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd's log (%s), last lines:\n%s", nd.Log, nd.LogTail(30))
			t.Logf("Multus' log (%s), last lines:\n%s", nd.MultusLog, nd.MultusLogTail(30))
		}
		nd.Close()
	})
	return &nodeEnv{env: e, node: nd}
}

// storageNet creates a storage-network NAD whose IPAM is ipam (harvester-ipam
// or whereabouts) on a /24 of its own; pods join it on lhnet1.
func (e *nodeEnv) storageNet(t *testing.T, ipam string) *testcni.MultusNetwork {
	t.Helper()
	nadCRD.Do(func() { nadCRD.err = rig.InstallNADCRD(ctx(t)) })
	require.NoError(t, nadCRD.err, "the NetworkAttachmentDefinition CRD")
	i := subnet.Add(1)
	m, err := e.node.StorageNetwork(ctx(t), testcni.Network{
		Range: fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250), IPAM: ipam,
	}, "harvester-system", fmt.Sprintf("storagenetwork-%d", i), "lhnet1")
	require.NoError(t, err)
	return m
}

// pods creates n Longhorn pod objects on the node, asking for m.
func (e *nodeEnv) pods(t *testing.T, m *testcni.MultusNetwork, prefix string, n int) []testcni.Pod {
	t.Helper()
	var out []testcni.Pod
	for i := 0; i < n; i++ {
		p, err := e.node.CreatePod(ctx(t), m, fmt.Sprintf("%s-%d", prefix, i))
		require.NoError(t, err)
		out = append(out, p)
	}
	return out
}

// run runs a new sandbox of each pod, side by side as the kubelet's pod
// workers do, and marks each pod running.
func (e *nodeEnv) run(t *testing.T, pods []testcni.Pod) []*testcni.PodSandbox {
	t.Helper()
	out := make([]*testcni.PodSandbox, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.node.RunPodSandbox(ctx(t), p)
			if err == nil {
				err = e.node.MarkRunning(ctx(t), sb)
			}
			out[i], errs[i] = sb, err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

// stopRemove stops and removes sandboxes, side by side, and requires success.
func (e *nodeEnv) stopRemove(t *testing.T, ids ...string) {
	t.Helper()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.node.StopPodSandbox(ctx(t), id)
			if errs[i] == nil {
				errs[i] = e.node.RemovePodSandbox(ctx(t), id)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// storageIP is the pod's lhnet1 address, as Multus wrote it in the pod's
// network-status.
func storageIP(t *testing.T, m *testcni.MultusNetwork, pod testcni.Pod) string {
	t.Helper()
	st, err := m.NetworkStatus(ctx(t), pod)
	require.NoError(t, err)
	for _, s := range st {
		if s.Interface == m.StorageIfName() && s.Name == m.NADNamespace+"/"+m.NADName {
			require.Len(t, s.IPs, 1, "network-status of %s: %+v", pod.Ref(), st)
			return s.IPs[0]
		}
	}
	t.Fatalf("Multus wrote no %s entry for %s/%s on %s: %+v", m.StorageIfName(), m.NADNamespace, m.NADName, pod.Ref(), st)
	return ""
}

// holdsSandbox asserts that the pod holds one allocation in m's pool, of
// sandbox sb, at the address on its network-status, with one reservation.
func holdsSandbox(t *testing.T, m *testcni.MultusNetwork, sb *testcni.PodSandbox) string {
	t.Helper()
	ip := storageIP(t, m, sb.Pod)
	allocs := mustAllocs(t, m.Network)
	held := testcni.Of(allocs, sb.Pod.Ref())
	require.Len(t, held, 1, "one allocation for %s; pool %s:\n%s", sb.Pod.Ref(), m.PoolName(), testcni.Table(allocs))
	assert.Equal(t, sb.ID, held[0].ContainerID, "the allocation is the sandbox's")
	if m.Whereabouts != testcni.V070 {
		assert.Equal(t, "lhnet1", held[0].IfName)
	}
	assert.Equal(t, ip, held[0].IP.String(), "the pool holds the address on the pod's network-status")
	orips := oripsOf(t, m.Network, sb.Pod.Ref())
	require.Len(t, orips, 1, "one reservation for %s", sb.Pod.Ref())
	assert.Equal(t, ip, orips[0].Name)
	return ip
}

func ids(sbs []*testcni.PodSandbox) []string {
	var out []string
	for _, s := range sbs {
		out = append(out, s.ID)
	}
	return out
}

// states are the node's sandboxes by ID, as containerd lists them.
func (e *nodeEnv) states(t *testing.T) map[string]runtimeapi.PodSandboxState {
	t.Helper()
	l, err := e.node.ListPodSandbox(ctx(t))
	require.NoError(t, err)
	out := map[string]runtimeapi.PodSandboxState{}
	for _, s := range l {
		out[s.Id] = s.State
	}
	return out
}

var _ = strings.Contains

// A sandbox stopped and removed through the CRI: containerd's DEL goes
// through Multus to the storage network's IPAM, and the address is released.
func TestNodeStopRemoveReleases(t *testing.T) {
	onEachNode(t, testcni.NodeOptions{}, func(t *testing.T, e *nodeEnv) {
		for _, ipam := range []string{"harvester-ipam", "whereabouts"} {
			m := e.storageNet(t, ipam)
			pods := e.pods(t, m, "instance-manager-"+strings.TrimPrefix(ipam, "harvester-"), 2)
			sbs := e.run(t, pods)
			for _, sb := range sbs {
				ip := holdsSandbox(t, m, sb)
				t.Logf("%s: %s sandbox %s has %s on lhnet1, %s on eth0", ipam, sb.Pod.Ref(), sb.ID[:12], ip, sb.IP)
			}
			e.stopRemove(t, sbs[0].ID)
			released(t, m, pods[0])
			holdsSandbox(t, m, sbs[1])
			e.stopRemove(t, sbs[1].ID)
			released(t, m, pods[1])
			assert.Empty(t, e.states(t), "no sandbox left")
		}
	})
}
