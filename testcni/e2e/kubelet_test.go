package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// The chart on a real node: a cluster of the rig's own (kube-apiserver,
// kube-controller-manager, kube-scheduler, Harvester's network webhook) on a
// machine of its own, one node with containerd and a real kubelet v1.37.0,
// Multus as the node's CNI, whereabouts' DaemonSet as Harvester deploys it,
// the chart installed with helm, and Longhorn-like pods on the storage
// network, all run by the kubelet. Each step asserts what an operator would
// look at: the pods' readiness, the bytes at /opt/cni/bin/whereabouts and
// whereabouts.real, the pool's entries, and which binary served each sandbox
// (harvester-ipam checkpoints every attachment it serves; whereabouts alone
// none).

// Two builds of the chart's image, for a rolling update from one to the other.
const (
	chartTag1 = "v0.0.0-rig.1"
	chartTag2 = "v0.0.0-rig.2"
)

// storageRange is the storage network's range on the kubelet's node.
const storageRange = "192.168.50.0/27"

// byTheWatcher bounds how long whereabouts' binary, once its install step
// has written it, holds the name before harvester-ipam stands in again: the
// installer's watcher sees the write and retakes at once (about a second
// here, logged and reported in docs/testing.md), where a blind watcher
// would leave it to the chart's next periodic look, a minute later. The
// bound tells the two apart on a loaded machine; it is not a speed test.
const byTheWatcher = 15 * time.Second

// kubeletNode is a cluster of the rig's own with one node and its kubelet.
type kubeletNode struct {
	c     *testcni.Rig
	nd    *testcni.Node
	watch *nameWatch
	// The bytes each binary has: the chart's builds, whereabouts' versions.
	hashes map[[32]byte]string
	sizes  map[int64]bool
	nad    string // the storage network's NAD, harvester-system/<nad>
}

// newKubeletNode starts a cluster and its node; whereabouts, when not "",
// is deployed as Harvester deploys it (its images and both of the chart's on
// the node), else the node has the chart's first image only.
func newKubeletNode(t *testing.T, name, whereabouts string, webhook bool) *kubeletNode {
	t.Helper()
	k := newKubeletCluster(t, name, whereabouts != "", webhook, 1)[0]
	if whereabouts != "" {
		k.deployWhereabouts(t, whereabouts)
	}
	return k
}

// newKubeletCluster starts a cluster and n nodes of it (node-1 ...), each
// with its own watch of whereabouts' name; with whereabouts, the nodes have
// whereabouts' images (v0.9.3, v0.9.4) and both of the chart's, else the
// chart's first only. Nothing is deployed.
func newKubeletCluster(t *testing.T, name string, whereabouts, webhook bool, n int) []*kubeletNode {
	t.Helper()
	start := time.Now()
	ctx := ctx(t)
	hashes, sizes := map[[32]byte]string{}, map[int64]bool{}
	// The images build while the cluster starts.
	type built struct {
		img       testcni.Image
		bin, what string
		err       error
	}
	var wants []func() built
	tags := []string{chartTag1}
	if whereabouts {
		tags = append(tags, chartTag2)
		for _, v := range []string{testcni.V093, testcni.V094} {
			wants = append(wants, func() built {
				img, err := rig.WhereaboutsImage(ctx, v)
				return built{img, rig.Tools["whereabouts-"+v], "whereabouts " + v, err}
			})
		}
	}
	for _, tag := range tags {
		wants = append(wants, func() built {
			img, err := rig.ChartImage(ctx, tag)
			return built{img, rig.ChartBinary(tag, "harvester-ipam"), "harvester-ipam " + tag, err}
		})
	}
	images := make(chan built, len(wants))
	for _, w := range wants {
		go func() { images <- w() }()
	}
	c, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: name, NoWebhook: !webhook})
	require.NoError(t, err)
	var imgs []testcni.Image
	for range wants {
		b := <-images
		require.NoError(t, b.err)
		imgs = append(imgs, b.img)
		hashes[sha(t, b.bin)] = b.what
		st, err := os.Stat(b.bin)
		require.NoError(t, err)
		sizes[st.Size()] = true
	}
	t.Logf("cluster %s and the images ready in %s", name, time.Since(start).Round(100*time.Millisecond))
	var out []*kubeletNode
	for i := 1; i <= n; i++ {
		opt := testcni.NodeOptions{Kubelet: true, NoWhereabouts: true, Images: imgs}
		if n > 1 {
			opt.Name = fmt.Sprintf("node-%d", i)
		}
		nd, err := c.StartNode(ctx, c.Default, opt)
		require.NoError(t, err, "start a node with containerd and the kubelet")
		k := &kubeletNode{c: c, nd: nd, hashes: hashes, sizes: sizes}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s: the kubelet's log (%s), last lines:\n%s", k.nd.Name, k.nd.KubeletLog, k.nd.KubeletLogTail(40))
				t.Logf("%s: containerd's log (%s), last lines:\n%s", k.nd.Name, k.nd.Log, k.nd.LogTail(20))
				t.Logf("%s: Multus' log (%s), last lines:\n%s", k.nd.Name, k.nd.MultusLog, k.nd.MultusLogTail(20))
			}
			k.watch.stop()
			k.nd.Close()
		})
		k.watch = watchName(filepath.Join(k.nd.BinDir, "whereabouts"), hashes, sizes)
		out = append(out, k)
	}
	t.Logf("its %d node(s) with a kubelet ready after %s", n, time.Since(start).Round(100*time.Millisecond))
	return out
}

// deployWhereabouts deploys whereabouts' DaemonSet as Harvester does, waits
// until its pod has put its binary at the node's name, and writes the
// storage network's NAD as Harvester's controller does.
func (k *kubeletNode) deployWhereabouts(t *testing.T, whereabouts string) {
	t.Helper()
	c := k.c
	require.NoError(t, c.DeployHarvesterWhereabouts(ctx(t), whereabouts))
	require.NoError(t, c.WaitRolledOut(ctx(t), "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
	require.Eventually(t, func() bool { return k.watch.now() == "whereabouts "+whereabouts }, time.Minute, 100*time.Millisecond,
		"whereabouts' pod puts its binary at /opt/cni/bin/whereabouts (now: %s)", k.watch.now())
	// The storage network as Harvester's controller writes it: its NAD
	// names whereabouts, whose flat file its install step wrote.
	k.nad = "storagenetwork-rig"
	conf := fmt.Sprintf(`{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"ipam":{"type":"whereabouts","range":%q,"exclude":["192.168.50.1/32","192.168.50.2/32"]}}`, storageRange)
	_, err := c.Dynamic.Resource(testcni.NADResource).Namespace(testcni.HarvesterNamespace).Create(ctx(t), testcni.StorageNetworkNAD(k.nad, conf), metav1.CreateOptions{})
	require.NoError(t, err, "the storage network's NAD")
}

// agentServed is what the chart's node agent on the node logged it served
// ("ADD <container>/<ifname>: served in ..."), from its container's log.
func (k *kubeletNode) agentServed(t *testing.T) string {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(k.nd.VarLog, "pods", "kube-system_harvester-ipam-agent-*", "agent", "*.log"))
	require.NotEmpty(t, logs, "the node agent's container log")
	var served []string
	for _, l := range logs {
		b, err := os.ReadFile(l)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, ": served in ") {
				served = append(served, line)
			}
		}
	}
	return strings.Join(served, "\n")
}

// killAgent SIGKILLs the chart's node agent on the node (its container's
// task), as the OOM killer or a crash would; its DaemonSet restarts it.
func (k *kubeletNode) killAgent(t *testing.T) {
	t.Helper()
	name, err := k.c.PodOf(ctx(t), "kube-system", "app.kubernetes.io/component=agent", k.nd.Name)
	require.NoError(t, err, "the node agent's pod")
	pod, err := k.c.Kube.CoreV1().Pods("kube-system").Get(ctx(t), name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, pod.Status.ContainerStatuses, "the node agent's container")
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	c, cancel := context.WithTimeout(ctx(t), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(c, "ctr", "--address", k.nd.Socket, "--namespace", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id).CombinedOutput()
	require.NoError(t, err, "SIGKILL the node agent: %s", out)
}

// reservations are the storage network's reservations: the pod holding
// each address.
func (k *kubeletNode) reservations(t *testing.T) map[string]string {
	t.Helper()
	list, err := k.c.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations("kube-system").List(ctx(t), metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string]string{}
	for _, o := range list.Items {
		out[o.Name] = o.Spec.PodRef
	}
	return out
}

// sandboxFailures are the kubelet's events of pods whose sandbox failed to
// start (a CNI ADD that failed: FailedCreatePodSandBox) in a way IPAM had a
// part in. An ADD Multus failed before it ran any delegate (its own lookup
// of the pod, 250 ms a try, timed out on a loaded API server) never reached
// an IPAM plugin, and would fail the same under whereabouts alone: it is
// logged and counted, not returned.
func (k *kubeletNode) sandboxFailures(t *testing.T, pods []testcni.Pod) []string {
	t.Helper()
	of := map[string]bool{}
	for _, p := range pods {
		of[p.Namespace+"/"+p.Name] = true
	}
	evs, err := k.c.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx(t), metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
	require.NoError(t, err)
	var out []string
	before := 0
	for _, e := range evs.Items {
		if !of[e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name] {
			continue
		}
		if failedBeforeIPAM(e.Message) {
			before += int(max(e.Count, 1))
			continue
		}
		out = append(out, e.InvolvedObject.Name+": "+e.Message)
	}
	if before > 0 {
		t.Logf("%d sandbox ADDs failed in Multus' own lookup of the pod, before any IPAM plugin ran (the kubelet retried them)", before)
	}
	return out
}

// failedBeforeIPAM says whether a FailedCreatePodSandBox message is Multus
// failing its lookup of the pod (multus-cni v4 pkg/multus getPod, the first
// thing its ADD does), where no delegate and so no IPAM plugin has run.
func failedBeforeIPAM(msg string) bool {
	i := strings.Index(msg, "Multus: [")
	return i >= 0 && strings.Contains(msg[i:], "]: error waiting for pod: ")
}

// helm runs the rig's helm against the cluster.
func (k *kubeletNode) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := k.c.Helm(c, append(args, "--kubeconfig", k.c.Kubeconfig)...)
	return string(out), err
}

// chartArgs are helm's arguments for the chart with the image of tag.
func chartArgs(verb, tag string) []string {
	return []string{verb, "harvester-ipam", chartDir, "--namespace", "kube-system", "--set", "image.tag=" + tag, "--wait", "--timeout", "3m"}
}

// pods creates n Longhorn-like pods on the storage network (prefix-0 ...).
func (k *kubeletNode) pods(t *testing.T, prefix string, n int) []testcni.Pod {
	t.Helper()
	var out []testcni.Pod
	for i := 0; i < n; i++ {
		p := k.c.Default.Pod(fmt.Sprintf("%s-%d", prefix, i))
		require.NoError(t, k.nd.CreateLonghornPod(ctx(t), p, k.networks()))
		out = append(out, p)
	}
	return out
}

func (k *kubeletNode) networks() string {
	b, _ := json.Marshal([]map[string]string{{"namespace": testcni.HarvesterNamespace, "name": k.nad, "interface": "lhnet1"}})
	return string(b)
}

// allocs is the storage network's pool.
func (k *kubeletNode) allocs(t *testing.T) []shim.Allocation {
	t.Helper()
	a, err := k.c.PoolAllocations(ctx(t), "kube-system", "192.168.50.0-27")
	require.NoError(t, err)
	return a
}

// holdsOne checks each pod holds exactly one entry in the pool, its live
// sandbox's.
func (k *kubeletNode) holdsOne(t *testing.T, live map[string]string) {
	t.Helper()
	allocs := k.allocs(t)
	for ref, id := range live {
		of := testcni.Of(allocs, ref)
		if assert.Len(t, of, 1, "%s holds one address:\n%s", ref, testcni.Table(allocs)) {
			assert.Equal(t, id, of[0].ContainerID, "%s's entry is its live sandbox's", ref)
		}
	}
}

// servedBy counts the sandboxes harvester-ipam served (its checkpoint) and
// those it did not.
func (k *kubeletNode) servedBy(live map[string]string) (byHarvesterIPAM, byWhereaboutsAlone []string) {
	for ref, id := range live {
		if k.nd.Checkpointed(id, "lhnet1") {
			byHarvesterIPAM = append(byHarvesterIPAM, ref)
		} else {
			byWhereaboutsAlone = append(byWhereaboutsAlone, ref)
		}
	}
	return
}

// binaries are the bytes at the name and aside, by what they are.
func (k *kubeletNode) binaries(t *testing.T) (name, aside string) {
	t.Helper()
	what := func(p string) string {
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return "missing"
		}
		require.NoError(t, err)
		if w, ok := k.hashes[sha256.Sum256(b)]; ok {
			return w
		}
		return fmt.Sprintf("unknown (%d bytes)", len(b))
	}
	return what(filepath.Join(k.nd.BinDir, "whereabouts")), what(filepath.Join(k.nd.BinDir, "whereabouts.real"))
}

// settled checks the name and the aside hold what they should once the
// installer is done: after it puts harvester-ipam at the name (an exchange),
// the binary it took from there is at a temporary name until it is probed
// and renamed aside, which a loaded machine may take a while to do.
func (k *kubeletNode) settled(t *testing.T, name, aside, when string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, a := k.binaries(t)
		if n == name && a == aside {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: want %s at the name and %s aside; after 30 s they hold %s and %s", when, name, aside, n, a)
			return
		}
	}
}

// TestKubelet runs the chart's life on one node as an operator meets it, in
// order: helm install, whereabouts' pod restarted and upgraded, helm
// upgrade, the kubelet restarted, a clean shutdown and boot, helm
// uninstall. Each step is a subtest; a failed one leaves the node as it
// was, and the next runs. The audit watches throughout, as the chart's
// Deployment mode runs it: a step fails on any finding it reports.
func TestKubelet(t *testing.T) {
	t.Parallel()
	k := newKubeletNode(t, "kubelet", testcni.V093, true)
	// The audit watches the whole life (issue 38: a healthy cluster reports
	// nothing, ever); each step fails on a finding it saw.
	aq := watchAudit(t, k.c, "kube-system")
	run := func(name string, step func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			defer aq.quiet(t, name)
			step(t)
		})
	}
	longhorn := k.pods(t, "instance-manager", 3)
	live, err := k.nd.WaitPodsReady(ctx(t), longhorn, time.Time{}, 3*time.Minute)
	require.NoError(t, err)
	_, alone := k.servedBy(live)
	require.Len(t, alone, 3, "before the chart, whereabouts alone serves the storage network")
	k.holdsOne(t, live)

	run("HelmInstall", func(t *testing.T) {
		start := time.Now()
		out, err := k.helm(t, chartArgs("install", chartTag1)...)
		require.NoError(t, err, out)
		require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", "harvester-ipam", 3*time.Minute), "kubectl rollout status daemonset/harvester-ipam")
		t.Logf("helm install --wait and the rollout took %s", time.Since(start).Round(100*time.Millisecond))
		name, aside := k.binaries(t)
		assert.Equal(t, "harvester-ipam "+chartTag1, name, "harvester-ipam stands in at /opt/cni/bin/whereabouts")
		assert.Equal(t, "whereabouts "+testcni.V093, aside, "the real whereabouts aside, byte for byte")

		// Each Longhorn pod's sandbox dies; the kubelet stops it (DEL) and
		// makes the pod a new one: harvester-ipam serves each.
		before := time.Now()
		var kills sync.WaitGroup
		for _, id := range live {
			kills.Add(1)
			go func() { defer kills.Done(); assert.NoError(t, k.nd.KillSandbox(ctx(t), id)) }()
		}
		kills.Wait()
		next, err := k.nd.WaitPodsReady(ctx(t), longhorn, before, 3*time.Minute)
		require.NoError(t, err)
		by, alone := k.servedBy(next)
		assert.Empty(t, alone, "every next sandbox served by harvester-ipam")
		t.Logf("next sandboxes served by harvester-ipam: %d", len(by))
		k.holdsOne(t, next)
		// The chart's node agent served them: its log says so, a line a verb.
		served := k.agentServed(t)
		for _, id := range next {
			assert.Contains(t, served, "ADD "+id+"/lhnet1", "the node agent served the ADD of sandbox %s", id)
		}
		live = next
	})

	// A storm: the node's pods all start at once (a Harvester cluster back
	// from a power loss). The chart's node agent serves every ADD, no sandbox
	// fails its ADD, and each pod holds one address of its own.
	run("StormOfPodsAtOnce", func(t *testing.T) {
		const n = 20
		start := time.Now()
		pods := make([]testcni.Pod, n)
		var made sync.WaitGroup
		for i := range pods {
			pods[i] = k.c.Default.Pod(fmt.Sprintf("storm-%d", i))
			made.Add(1)
			go func() { defer made.Done(); assert.NoError(t, k.nd.CreateLonghornPod(ctx(t), pods[i], k.networks())) }()
		}
		made.Wait()
		sbs, err := k.nd.WaitPodsReady(ctx(t), pods, start, 3*time.Minute)
		require.NoError(t, err)
		t.Logf("%d pods created at once, all ready in %s", n, time.Since(start).Round(100*time.Millisecond))
		_, alone := k.servedBy(sbs)
		assert.Empty(t, alone, "every sandbox of the storm served by harvester-ipam")
		k.holdsOne(t, sbs)
		// The node agent serves the storm; an ADD it does not acknowledge
		// within the plugin's bound (a loaded machine) is the plugin's own,
		// which the checks above cover the same.
		served := k.agentServed(t)
		byAgent := 0
		for _, id := range sbs {
			if strings.Contains(served, "ADD "+id+"/lhnet1: served") {
				byAgent++
			}
		}
		t.Logf("the storm's ADDs served by the node agent: %d of %d (the rest by the plugin alone)", byAgent, len(sbs))
		assert.GreaterOrEqual(t, byAgent, len(sbs)/2, "the node agent serves the storm")
		assert.Empty(t, k.sandboxFailures(t, pods), "no sandbox of the storm failed to start")
		var gone sync.WaitGroup
		for _, p := range pods {
			gone.Add(1)
			go func() { defer gone.Done(); assert.NoError(t, k.c.DeletePodAndWait(ctx(t), p, 2*time.Minute)) }()
		}
		gone.Wait()
	})

	// The agent replaced during a busy day: helm upgrade changes the agent's
	// pod (a rollout: the new agent beside the old one) while the storage
	// network's pods die and start again, then the agent is SIGKILLed in the
	// middle of a storm. Nothing the operator runs notices: every pod
	// starts, no sandbox fails its ADD, every live pod holds exactly one
	// entry and its reservation, and nothing of a deleted pod is left.
	run("AgentRolledOutAndKilledWhilePodsChurn", func(t *testing.T) {
		const n = 6
		start := time.Now()
		churned := k.pods(t, "churn", n)
		_, err := k.nd.WaitPodsReady(ctx(t), churned, start, 3*time.Minute)
		require.NoError(t, err)
		stop := make(chan struct{})
		var churn sync.WaitGroup
		churn.Add(1)
		kills := 0
		go func() {
			defer churn.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(300 * time.Millisecond):
				}
				pod := churned[i%n]
				id, err := k.nd.Sandbox(ctx(t), pod)
				if err != nil || id == "" {
					continue // between sandboxes
				}
				if k.nd.KillSandbox(ctx(t), id) == nil {
					kills++
				}
			}
		}()
		out, err := k.helm(t, append(chartArgs("upgrade", chartTag1), "--set", "agent.maxInFlight=128")...)
		require.NoError(t, err, out)
		require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", "harvester-ipam-agent", 3*time.Minute), "kubectl rollout status daemonset/harvester-ipam-agent")
		close(stop)
		churn.Wait()
		t.Logf("%d sandboxes killed while the agent rolled out", kills)

		// A storm, and the agent SIGKILLed in its middle (its DaemonSet's
		// container restarts).
		const m = 12
		storm := make([]testcni.Pod, m)
		stormStart := time.Now()
		var made sync.WaitGroup
		for i := range storm {
			storm[i] = k.c.Default.Pod(fmt.Sprintf("killed-storm-%d", i))
			made.Add(1)
			go func() { defer made.Done(); assert.NoError(t, k.nd.CreateLonghornPod(ctx(t), storm[i], k.networks())) }()
		}
		time.Sleep(300 * time.Millisecond)
		k.killAgent(t)
		made.Wait()

		all := append(append([]testcni.Pod{}, churned...), storm...)
		live, err := k.nd.WaitPodsReady(ctx(t), all, time.Time{}, 3*time.Minute)
		require.NoError(t, err)
		t.Logf("the storm's pods ready %s after it began", time.Since(stormStart).Round(100*time.Millisecond))
		assert.Empty(t, k.sandboxFailures(t, all), "no sandbox failed to start")
		k.holdsOne(t, live)
		res := k.reservations(t)
		for ref, id := range live {
			ip := ""
			for _, a := range k.allocs(t) {
				if a.ContainerID == id {
					ip = a.IP.String()
				}
			}
			assert.Equal(t, ref, res[ip], "%s's address %s has its reservation, the pod's", ref, ip)
		}

		var gone sync.WaitGroup
		for _, p := range all {
			gone.Add(1)
			go func() { defer gone.Done(); assert.NoError(t, k.c.DeletePodAndWait(ctx(t), p, 2*time.Minute)) }()
		}
		gone.Wait()
		allocs := k.allocs(t)
		res = k.reservations(t)
		for _, p := range all {
			assert.Empty(t, testcni.Of(allocs, p.Ref()), "nothing of deleted pod %s left in the pool", p.Ref())
			for ip, ref := range res {
				assert.NotEqual(t, p.Ref(), ref, "the reservation of %s, of deleted pod %s, is left", ip, p.Ref())
			}
		}
	})

	run("WhereaboutsPodDeletedThenUpgraded", func(t *testing.T) {
		for _, step := range []struct {
			what, version string
			do            func() error
		}{
			{"its pod deleted (its DaemonSet makes a new one)", testcni.V093, func() error {
				pod, err := k.c.PodOf(ctx(t), "kube-system", "name=whereabouts", k.nd.Name)
				if err != nil {
					return err
				}
				return k.c.Kube.CoreV1().Pods("kube-system").Delete(ctx(t), pod, metav1.DeleteOptions{})
			}},
			{"its image upgraded to " + testcni.V094, testcni.V094, func() error {
				return k.c.DeployHarvesterWhereabouts(ctx(t), testcni.V094)
			}},
		} {
			mark := k.watch.mark()
			require.NoError(t, step.do(), step.what)
			require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
			// Its install step's cp -f wrote its binary at the name: seen,
			// then harvester-ipam again.
			var gaps []gap
			require.Eventually(t, func() bool {
				gaps = k.watch.gapsSince(mark)
				return len(gaps) > 0 && gaps[len(gaps)-1].closed()
			}, time.Minute, 50*time.Millisecond, "whereabouts %s: its install step writes /opt/cni/bin/whereabouts, and harvester-ipam stands in again (%s)", step.what, k.watch.history(mark))
			for _, g := range gaps {
				assert.LessOrEqual(t, g.length(), byTheWatcher, "whereabouts %s: harvester-ipam stands in again when its watcher sees the write, not at the next periodic look: %s", step.what, g)
				t.Logf("whereabouts %s: %s", step.what, g)
			}
			k.settled(t, "harvester-ipam "+chartTag1, "whereabouts "+step.version, "whereabouts "+step.what)
		}
	})

	run("HelmUpgradeRollingUpdate", func(t *testing.T) {
		mark := k.watch.mark()
		start := time.Now()
		// Longhorn pods start all through the rolling update.
		var churn []testcni.Pod
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 12; i++ {
				p := k.c.Default.Pod(fmt.Sprintf("during-upgrade-%d", i))
				if err := k.nd.CreateLonghornPod(ctx(t), p, k.networks()); err != nil {
					t.Errorf("%v", err)
					return
				}
				churn = append(churn, p)
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
		out, err := k.helm(t, chartArgs("upgrade", chartTag2)...)
		rollErr := k.c.WaitRolledOut(ctx(t), "kube-system", "harvester-ipam", 3*time.Minute)
		done := time.Now()
		close(stop)
		wg.Wait()
		require.NoError(t, err, out)
		require.NoError(t, rollErr, "kubectl rollout status daemonset/harvester-ipam")
		t.Logf("helm upgrade --wait and the rollout took %s", done.Sub(start).Round(100*time.Millisecond))
		assert.Empty(t, k.watch.gapsSince(mark), "during the rolling update the name is harvester-ipam's throughout: %s", k.watch.history(mark))
		name, aside := k.binaries(t)
		assert.Equal(t, "harvester-ipam "+chartTag2, name, "the new build stands in")
		assert.Equal(t, "whereabouts "+testcni.V094, aside, "the real whereabouts aside, untouched")
		sbs, err := k.nd.WaitPodsReady(ctx(t), churn, start, 3*time.Minute)
		require.NoError(t, err)
		by, alone := k.servedBy(sbs)
		assert.Empty(t, alone, "no sandbox started during the rolling update is served by whereabouts alone")
		assert.Empty(t, k.sandboxFailures(t, churn), "no sandbox started during the rolling update (the node agent rolled too) failed its ADD")
		t.Logf("%d sandboxes started during the rolling update, served by harvester-ipam: %d", len(sbs), len(by))
		k.holdsOne(t, sbs)
		var gone sync.WaitGroup
		for _, p := range churn {
			gone.Add(1)
			go func() { defer gone.Done(); assert.NoError(t, k.c.DeletePodAndWait(ctx(t), p, 2*time.Minute)) }()
		}
		// Gone before the next step, which compares the pool before and
		// after. (Whether each DEL released is not asked here: on a loaded
		// machine a DEL may time out, and Multus, which drops its cache of
		// a sandbox at the first DEL, then calls no plugin for the pod that
		// is gone: the reconciler's case, README's Troubleshoot.)
		gone.Wait()
	})

	run("KubeletRestarted", func(t *testing.T) {
		mark := k.watch.mark()
		pools := k.allocs(t)
		require.NoError(t, k.nd.StopKubelet(ctx(t)))
		time.Sleep(3 * time.Second)
		require.NoError(t, k.nd.StartKubelet(ctx(t)))
		again, err := k.nd.WaitPodsReady(ctx(t), longhorn, time.Time{}, 2*time.Minute)
		require.NoError(t, err)
		assert.Equal(t, live, again, "the pods keep their sandboxes")
		require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", "harvester-ipam", time.Minute))
		assert.Empty(t, k.watch.gapsSince(mark), "the name is harvester-ipam's throughout: %s", k.watch.history(mark))
		assert.Equal(t, pools, k.allocs(t), "the pool as it was")
	})

	run("CleanShutdownAndBoot", func(t *testing.T) {
		mark := k.watch.mark()
		killed, err := k.nd.Shutdown(ctx(t), 10*time.Second)
		require.NoError(t, err)
		t.Logf("shutdown: still there 10 s after SIGTERM, then killed: %s", killed)
		assert.Empty(t, k.watch.gapsSince(mark), "shut down, the node keeps harvester-ipam at the name: %s", k.watch.history(mark))
		name, aside := k.binaries(t)
		assert.Equal(t, "harvester-ipam "+chartTag2, name, "harvester-ipam at the name while the node is down")
		assert.Equal(t, "whereabouts "+testcni.V094, aside)

		boot := k.watch.mark()
		booted := time.Now()
		require.NoError(t, k.nd.Boot(ctx(t)))
		next, err := k.nd.WaitPodsReady(ctx(t), longhorn, booted, 3*time.Minute)
		require.NoError(t, err)
		require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
		require.NoError(t, k.c.WaitRolledOut(ctx(t), "kube-system", "harvester-ipam", 3*time.Minute))
		// Booted, whereabouts' pod runs its install step again: harvester-ipam
		// stands in again as soon as its own pod runs.
		for _, g := range k.watch.gapsSince(boot) {
			t.Logf("after the boot: %s", g)
			assert.True(t, g.closed(), "harvester-ipam stands in again after the boot: %s", g)
		}
		k.settled(t, "harvester-ipam "+chartTag2, "whereabouts "+testcni.V094, "booted")
		by, alone := k.servedBy(next)
		t.Logf("the pods' sandboxes after the boot: %d served by harvester-ipam, %d by whereabouts alone (%v)", len(by), len(alone), alone)
		k.holdsOne(t, next)
		live = next
	})

	run("HelmUninstall", func(t *testing.T) {
		pools := k.allocs(t)
		// The installer's log, open before its pod goes (the kubelet removes
		// it with the pod): what its stop read and did.
		logs, _ := filepath.Glob(filepath.Join(k.nd.VarLog, "pods", "kube-system_harvester-ipam-*", "install", "*.log"))
		var open []*os.File
		for _, l := range logs {
			if f, err := os.Open(l); err == nil {
				open = append(open, f)
				defer f.Close()
			}
		}
		defer func() {
			for _, f := range open {
				b, _ := io.ReadAll(f)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("the installer's log (%s), last lines:\n%s", f.Name(), strings.Join(lines[max(0, len(lines)-8):], "\n"))
			}
		}()
		out, err := k.helm(t, "uninstall", "harvester-ipam", "--namespace", "kube-system", "--wait", "--timeout", "3m")
		require.NoError(t, err, out)
		// helm's --wait waits for the DaemonSet to go; its pod is then
		// deleted by the garbage collector and stopped by the kubelet, and
		// its installer gives the name back as it stops. Gone means the
		// pod object is gone, its stop done, not only marked for deletion.
		require.Eventually(t, func() bool {
			pods, err := k.c.Kube.CoreV1().Pods("kube-system").List(ctx(t), metav1.ListOptions{
				LabelSelector: "app.kubernetes.io/name=harvester-ipam", FieldSelector: "spec.nodeName=" + k.nd.Name})
			return err == nil && len(pods.Items) == 0
		}, 2*time.Minute, 200*time.Millisecond, "the chart's pod is gone")
		name, aside := k.binaries(t)
		assert.Equal(t, "whereabouts "+testcni.V094, name, "the real whereabouts back at its name, byte for byte")
		assert.Equal(t, "missing", aside, "no whereabouts.real left")
		assert.Equal(t, pools, k.allocs(t), "the pool untouched")
	})
	aq.settle(t, "after the last step", testcni.HarvesterNamespace+"/"+k.nad)
}

// nameWatch samples the file at whereabouts' name every few milliseconds
// and records what it is each time it changes: a known binary (by its
// bytes), missing, or something else (a copy being written).
type nameWatch struct {
	path   string
	hashes map[[32]byte]string
	sizes  map[int64]bool
	mu     sync.Mutex
	seen   []sighting
	quit   chan struct{}
	done   chan struct{}
}

type sighting struct {
	at   time.Time
	what string
}

func watchName(path string, hashes map[[32]byte]string, sizes map[int64]bool) *nameWatch {
	w := &nameWatch{path: path, hashes: hashes, sizes: sizes, quit: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *nameWatch) run() {
	defer close(w.done)
	type key struct {
		ino, size int64
		mtime     int64
	}
	var last key
	for {
		var k key
		what := ""
		var st syscall.Stat_t
		if err := syscall.Stat(w.path, &st); err != nil {
			what = "missing"
		} else {
			k = key{int64(st.Ino), st.Size, st.Mtim.Nano()}
			switch {
			case k == last:
				what = "" // unchanged
			case !w.sizes[st.Size]:
				what = "being written" // no binary this watch knows has this size
			default:
				what = w.classify()
			}
		}
		if what != "" {
			last = k
			w.mu.Lock()
			if n := len(w.seen); n == 0 || w.seen[n-1].what != what {
				w.seen = append(w.seen, sighting{time.Now(), what})
			}
			w.mu.Unlock()
		}
		select {
		case <-w.quit:
			return
		case <-time.After(3 * time.Millisecond):
		}
	}
}

// classify reads the file and names it by its bytes.
func (w *nameWatch) classify() string {
	f, err := os.Open(w.path)
	if err != nil {
		return "missing"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unreadable"
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	if what, ok := w.hashes[sum]; ok {
		return what
	}
	return "being written"
}

func (w *nameWatch) stop() {
	if w == nil {
		return
	}
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// now is what the name is at the latest sighting.
func (w *nameWatch) now() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		return "not seen yet"
	}
	return w.seen[len(w.seen)-1].what
}

// mark is a point in the watch's history.
func (w *nameWatch) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

// gap is a time the name was not harvester-ipam: from the first sighting of
// something else to the next sighting of harvester-ipam (end zero if not
// yet).
type gap struct {
	start, end time.Time
	what       []string
}

func (g gap) closed() bool { return !g.end.IsZero() }

func (g gap) length() time.Duration {
	if !g.closed() {
		return time.Since(g.start)
	}
	return g.end.Sub(g.start)
}

func (g gap) String() string {
	if !g.closed() {
		return fmt.Sprintf("%s since %s, not harvester-ipam again yet", strings.Join(g.what, " -> "), g.start.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%s for %s, then harvester-ipam again", strings.Join(g.what, " -> "), g.length().Round(time.Millisecond))
}

// gapsSince are the gaps after mark.
func (w *nameWatch) gapsSince(mark int) []gap {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []gap
	var cur *gap
	for _, s := range w.seen[mark:] {
		ours := strings.HasPrefix(s.what, "harvester-ipam ")
		switch {
		case !ours && cur == nil:
			cur = &gap{start: s.at, what: []string{s.what}}
		case !ours:
			cur.what = append(cur.what, s.what)
		case ours && cur != nil:
			cur.end = s.at
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// history tells what the name was since mark.
func (w *nameWatch) history(mark int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b bytes.Buffer
	for _, s := range w.seen[mark:] {
		fmt.Fprintf(&b, "\n  %s %s", s.at.Format("15:04:05.000"), s.what)
	}
	if b.Len() == 0 {
		return "no change"
	}
	return b.String()
}

func TestFailedBeforeIPAM(t *testing.T) {
	for _, c := range []struct {
		name, msg string
		before    bool
	}{
		{"multus' lookup of the pod timed out", `failed to setup network for sandbox "ab62": plugin type="multus" name="multus-cni-network" failed (add): Multus: [longhorn-system/storm-0/7e90]: error waiting for pod: Get "https://172.31.1.2:6443/api/v1/namespaces/longhorn-system/pods/storm-0?timeout=1m0s": context deadline exceeded`, true},
		{"the IPAM delegate failed", `failed to setup network for sandbox "ab62": plugin type="multus" name="multus-cni-network" failed (add): Multus: [longhorn-system/storm-0/7e90]: error adding container to network "lhnet1": error at storage engine: harvester-ipam: allocate in pool`, false},
		{"a pod name that reads like the lookup", `plugin type="multus" failed (add): Multus: [ns/error waiting for pod: x/1]: error adding container to network "n": whereabouts`, false},
		{"not multus", `error waiting for pod: something`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.before, failedBeforeIPAM(c.msg))
		})
	}
}
