package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

var nadCRD struct {
	sync.Once
	err error
}

// multusNet is a Multus thin plugin network whose pods ask, in their networks
// annotation, for a storage-network NAD on a /24 of its own, reaching
// harvester-ipam as ipam says. A NAD that names harvester-ipam is not in
// harvester-system: Harvester's webhook refuses that edit of a storage
// network's NAD there; it stands for a cluster that allows it.
func (e *env) multusNet(t *testing.T, ipam string) *testcni.MultusNetwork {
	t.Helper()
	nadCRD.Do(func() { nadCRD.err = rig.InstallNADCRD(ctx(t)) })
	require.NoError(t, nadCRD.err, "the NetworkAttachmentDefinition CRD")
	i := subnet.Add(1)
	m, err := rig.AddMultusNetwork(ctx(t), testcni.Network{
		Name:        fmt.Sprintf("multus%d", i),
		Range:       fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250),
		IPAM:        ipam,
		Tenant:      e.Tenant,
		Whereabouts: e.WB,
	}, nadNamespace(ipam), fmt.Sprintf("storagenetwork-%d", i), "lhnet1", fmt.Sprintf("10.244.%d.0/24", i%250))
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Multus' log (%s), last lines:\n%s", m.LogFile, tail(m.Log(), 40))
		}
	})
	return m
}

func multusPod(t *testing.T, m *testcni.MultusNetwork, name string) testcni.Pod {
	t.Helper()
	pod := m.Tenant.Pod(name + "-" + m.NADName)
	require.NoError(t, m.CreatePod(ctx(t), pod))
	return pod
}

// multusAdd makes a new sandbox of pod and runs ADD through Multus; it
// returns the sandbox and the storage address Multus reported on the pod.
func multusAdd(t *testing.T, m *testcni.MultusNetwork, pod testcni.Pod) (*testcni.Sandbox, string) {
	t.Helper()
	var s *testcni.Sandbox
	for attempt := 1; ; attempt++ {
		var err error
		s, err = m.NewSandbox(pod)
		require.NoError(t, err)
		err = s.Add(ctx(t))
		if err == nil {
			break
		}
		// Multus gives the API server 250 ms a request to show it the pod;
		// on a loaded machine it may not, and then the kubelet tears the
		// sandbox down and makes another: so does the test, twice.
		if !strings.Contains(err.Error(), "error waiting for pod") || attempt == 3 {
			require.NoError(t, err, "ADD through Multus of a sandbox of %s", pod.Ref())
		}
		t.Logf("ADD through Multus, attempt %d: %v; the runtime tries a new sandbox", attempt, err)
		require.NoError(t, s.Del(ctx(t)))
		require.NoError(t, s.Kill())
	}
	st, err := m.NetworkStatus(ctx(t), pod)
	require.NoError(t, err)
	for _, e := range st {
		if e.Interface == m.StorageIfName() && e.Name == m.NADNamespace+"/"+m.NADName {
			require.Len(t, e.IPs, 1, "network-status of %s: %+v", pod.Ref(), st)
			return s, e.IPs[0]
		}
	}
	t.Fatalf("Multus wrote no %s entry for %s/%s on %s: %+v", m.StorageIfName(), m.NADNamespace, m.NADName, pod.Ref(), st)
	return nil, ""
}

// holds asserts that the pod holds exactly one allocation in the storage
// pool, of sandbox s on the NAD's interface, at ip, with one reservation.
func holds(t *testing.T, m *testcni.MultusNetwork, pod testcni.Pod, s *testcni.Sandbox, ip string) {
	t.Helper()
	allocs := mustAllocs(t, m.Network)
	held := testcni.Of(allocs, pod.Ref())
	require.Len(t, held, 1, "one allocation for %s; pool %s:\n%s", pod.Ref(), m.PoolName(), testcni.Table(allocs))
	assert.Equal(t, s.ContainerID, held[0].ContainerID)
	if m.Whereabouts != testcni.V070 { // v0.7.0 records no ifname
		assert.Equal(t, m.StorageIfName(), held[0].IfName)
	}
	assert.Equal(t, ip, held[0].IP.String(), "the address in the pool is the one on the pod's network-status")
	orips := oripsOf(t, m.Network, pod.Ref())
	require.Len(t, orips, 1, "one reservation for %s", pod.Ref())
	assert.Equal(t, ip, orips[0].Name)
}

func released(t *testing.T, m *testcni.MultusNetwork, pod testcni.Pod) {
	t.Helper()
	allocs := mustAllocs(t, m.Network)
	assert.Empty(t, testcni.Of(allocs, pod.Ref()), "%s holds nothing; pool %s:\n%s", pod.Ref(), m.PoolName(), testcni.Table(allocs))
	assert.Empty(t, oripsOf(t, m.Network, pod.Ref()), "and no reservation")
}

// The runtime recreates the sandbox and the old one's DEL never comes: the
// pod's next ADD through Multus leaves it one allocation, the new sandbox's.
func TestMultusRecreatedSandboxHoldsOneAddress(t *testing.T) {
	onEachDelegate(t, testMultusRecreatedSandboxHoldsOneAddress)
}

func testMultusRecreatedSandboxHoldsOneAddress(t *testing.T, e *env) {
	m := e.multusNet(t, testcni.StandIn)
	pod := multusPod(t, m, "instance-manager")
	s1, ip1 := multusAdd(t, m, pod)
	holds(t, m, pod, s1, ip1)

	require.NoError(t, s1.Kill(), "the sandbox dies without DEL")
	s2, ip2 := multusAdd(t, m, pod)
	t.Logf("first sandbox %s, second %s", ip1, ip2)
	holds(t, m, pod, s2, ip2)

	require.NoError(t, s2.Del(ctx(t)))
	released(t, m, pod)
}

// The storage network is disabled (its NAD deleted) while the pod runs; the
// sandbox's DEL comes later. Multus takes the delegate's config from its
// cache, so harvester-ipam's DEL runs with the full ipam config: released.
func TestMultusDelAfterNADDeletedUsesItsCache(t *testing.T) {
	onEachDelegate(t, testMultusDelAfterNADDeletedUsesItsCache)
}

func testMultusDelAfterNADDeletedUsesItsCache(t *testing.T, e *env) {
	m := e.multusNet(t, testcni.StandIn)
	pod := multusPod(t, m, "instance-manager")
	keep := multusPod(t, m, "backing-image-manager")
	s, ip := multusAdd(t, m, pod)
	k, kip := multusAdd(t, m, keep)
	holds(t, m, pod, s, ip)

	require.NoError(t, m.DeleteNAD(ctx(t)))
	require.NoError(t, s.Del(ctx(t)), "DEL through Multus with the NAD gone")
	released(t, m, pod)
	holds(t, m, keep, k, kip)
	assert.Contains(t, m.Log(), "consumeScratchNetConf: "+s.ContainerID, "Multus read its cache")

	require.NoError(t, s.Del(ctx(t)), "DEL again (Multus' cache consumed now) is success")
}

// The storage network is disabled (NAD deleted) and Multus' cache of the
// sandbox is lost too (a wiped /var/lib/cni); then the sandbox's DEL comes.
// Multus cannot know the storage network any more and never calls its IPAM:
//   - pod object still there: Multus re-reads the pod's networks annotation,
//     fails to get the NAD, logs it, deletes only the default network and
//     returns success;
//   - pod object gone too: Multus returns success at once and calls no
//     plugin at all.
//
// Either way the runtime is told all is clean, and the pool keeps the
// allocation and its reservation. Nothing on the node will ever release them:
// harvester-ipam is not called, and its next ADD reclaims by pod, which a
// deleted pod never has again. Once the pods are gone, the reconciler
// releases them, and keeps what a pod that still exists holds.
func TestMultusDelWithNADAndCacheGoneNeverReachesIPAM(t *testing.T) {
	onEachAllocator(t, testMultusDelWithNADAndCacheGoneNeverReachesIPAM)
}

func testMultusDelWithNADAndCacheGoneNeverReachesIPAM(t *testing.T, e *env) {
	m := e.multusNet(t, testcni.StandIn)
	live := multusPod(t, m, "instance-manager")
	gone := multusPod(t, m, "backing-image-ds")
	keeper := multusPod(t, m, "backing-image-manager")
	sl, ipl := multusAdd(t, m, live)
	sg, ipg := multusAdd(t, m, gone)
	sk, ipk := multusAdd(t, m, keeper)

	require.NoError(t, m.DeleteNAD(ctx(t)))
	for _, s := range []*testcni.Sandbox{sl, sg} {
		removed, err := m.ForgetCache(s)
		require.NoError(t, err)
		require.NotEmpty(t, removed, "Multus had cached %s", s.ContainerID)
	}

	// The pod object is still there.
	require.NoError(t, sl.Del(ctx(t)), "Multus reports success")
	holds(t, m, live, sl, ipl)
	log := m.Log()
	assert.Contains(t, log, "failed to get delegates", "Multus looked the NAD up again and failed")
	assert.Contains(t, log, "but continue to delete clusterNetwork")

	// The pod object is gone as well.
	require.NoError(t, m.DeletePod(ctx(t), gone))
	require.NoError(t, sg.Del(ctx(t)), "Multus reports success")
	holds(t, m, gone, sg, ipg)
	assert.Contains(t, m.Log(), "cannot properly delete", "Multus gave up without calling any plugin")

	// Once Longhorn deletes the live pod too, both allocations are orphans;
	// the keeper's pod still exists, and it keeps its address.
	require.NoError(t, m.DeletePod(ctx(t), live))
	e.reconcileAsTheChartDoes(t)
	released(t, m, live)
	released(t, m, gone)
	holds(t, m, keeper, sk, ipk)
}

// reconcileAsTheChartDoes runs one pass of the real reconciler with the
// arguments the chart's CronJob renders (with no grace period, so that one
// pass releases, and no audit after it: 35 s of looks that no test here
// reads), and requires it to succeed.
func (e *env) reconcileAsTheChartDoes(t *testing.T) {
	t.Helper()
	cj := typed[batchv1.CronJob](t, objects(t, render(t, "harvester-ipam", "kube-system", "reconciler.grace=0s", "reconciler.auditWait=0s", "whereabouts.poolNamespace="+e.PoolNamespace)), "CronJob")
	c := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
	require.Equal(t, []string{"/usr/bin/harvester-ipam-reconciler"}, c.Command)
	res, err := e.Reconciler(ctx(t), c.Args...)
	require.NoError(t, err)
	require.Zero(t, res.Exit, "the reconciler with the CronJob's args %q:\n%s%s", c.Args, res.Stdout, res.Stderr)
	t.Logf("reconciler %s:\n%s", strings.Join(c.Args, " "), res.Stdout)
	assert.Contains(t, res.Stdout, "pod gone")
}

// Switching the NAD back to whereabouts: a pod attached through
// harvester-ipam still gets its DEL through harvester-ipam (Multus' cache
// names it), so the binary must stay installed until such pods are gone;
// new sandboxes get plain whereabouts.
func TestMultusNADSwitchedBackToWhereabouts(t *testing.T) {
	onEachAllocator(t, testMultusNADSwitchedBackToWhereabouts)
}

func testMultusNADSwitchedBackToWhereabouts(t *testing.T, e *env) {
	m := e.multusNet(t, testcni.Named)
	pod := multusPod(t, m, "instance-manager")
	s, ip := multusAdd(t, m, pod)
	holds(t, m, pod, s, ip)

	m.IPAM = testcni.Alone
	require.NoError(t, m.SetNAD(ctx(t), m.NADConfig()))
	require.NoError(t, s.Del(ctx(t)))
	released(t, m, pod)
	assert.Contains(t, m.Log(), `"type":"harvester-ipam"`, "Multus' cached delegate named harvester-ipam")

	s2, ip2 := multusAdd(t, m, pod)
	holds(t, m, pod, s2, ip2)
	require.NoError(t, s2.Del(ctx(t)))
	released(t, m, pod)
}

func nadNamespace(ipam string) string {
	if ipam == testcni.Named {
		return "default"
	}
	return testcni.HarvesterNamespace
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}
