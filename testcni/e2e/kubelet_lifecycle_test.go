package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/testcni"
)

// The chart's release in TestKubeletLifecycle, in a namespace of its own (a
// step deletes it), and the second release that meets it on the nodes.
const (
	lcNS       = "harvester-ipam-lc"
	lcOtherNS  = "harvester-ipam-other"
	lcInterval = "10s"
)

// lcArgs are helm's arguments for the release with the chart's first image,
// its installer looking every lcInterval, and extra values.
func lcArgs(verb string, set ...string) []string {
	args := []string{verb, "harvester-ipam", chartDir, "--namespace", lcNS, "--wait", "--timeout", "3m",
		"--set", "image.tag=" + chartTag1, "--set", "installer.interval=" + lcInterval, "--set", "reconciler.enabled=false"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// standInFiles are the stand-in's record and lock files on the node.
func (k *kubeletNode) standInFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{".harvester-ipam.owner.*", ".harvester-ipam.alive.*", ".harvester-ipam.standin-*"} {
		m, err := filepath.Glob(filepath.Join(k.nd.BinDir, pattern))
		require.NoError(t, err)
		for _, p := range m {
			out = append(out, filepath.Base(p))
		}
	}
	sort.Strings(out)
	return out
}

// installerLogs are the logs of the installers of namespace ns on the node
// (the kubelet's files, while their pods exist).
func (k *kubeletNode) installerLogs(ns string) string {
	logs, _ := filepath.Glob(filepath.Join(k.nd.VarLog, "pods", ns+"_*", "install", "*.log"))
	var b strings.Builder
	for _, l := range logs {
		if c, err := os.ReadFile(l); err == nil {
			b.Write(c)
		}
	}
	return b.String()
}

// givenBack waits until the node holds whereabouts' own binary at its name,
// nothing aside and nothing of the stand-in's, within limit of since.
func (k *kubeletNode) givenBack(t *testing.T, version string, since time.Time, limit time.Duration, when string) {
	t.Helper()
	for {
		name, aside := k.binaries(t)
		files := k.standInFiles(t)
		if name == "whereabouts "+version && aside == "missing" && len(files) == 0 {
			t.Logf("%s: %s given back %s after it began", k.nd.Name, when, time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Since(since) > limit {
			t.Errorf("%s: %s: want whereabouts %s at the name, nothing aside or left; after %s the name holds %s, the aside %s, and %v are left",
				k.nd.Name, when, version, limit, name, aside, files)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubeletLifecycle runs the stand-in's life around its steps on a
// cluster of two nodes with real kubelets, as an operator drives it: the
// chart installed before whereabouts (nothing to stand in for: it is ready),
// whereabouts arriving, whereabouts.real written while the clock was an hour
// ahead and then v0.9.4 written, the installer's pod force-deleted, a second
// release at the same time, a node left out by installer.nodeSelector, the
// stand-in turned off and on with helm upgrade and helm rollback, inotify
// exhausted on the nodes, and the chart's namespace deleted. Each step is a
// subtest that asserts what an operator would look at: the bytes at
// /opt/cni/bin/whereabouts and whereabouts.real on each node, what else is
// left there, the pods' readiness (helm --wait), and the installers' logs.
func TestKubeletLifecycle(t *testing.T) {
	t.Parallel()
	ks := newKubeletCluster(t, "lifecycle", true, false, 2)
	c, one, two := ks[0].c, ks[0], ks[1]
	// Only node-1 carries the label a later nodeSelector asks for.
	_, err := c.Kube.CoreV1().Nodes().Patch(ctx(t), one.nd.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"storage":"yes"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	revision := 0
	helm := func(t *testing.T, args ...string) {
		t.Helper()
		start := time.Now()
		out, err := one.helm(t, args...)
		require.NoError(t, err, out)
		if args[1] == "harvester-ipam" && args[0] != "uninstall" {
			revision++
		}
		t.Logf("helm %s %s (--wait) took %s", args[0], args[1], time.Since(start).Round(100*time.Millisecond))
	}
	standing := func(t *testing.T, k *kubeletNode, build, version, when string) {
		t.Helper()
		k.settled(t, "harvester-ipam "+build, "whereabouts "+version, when)
	}

	t.Run("NothingToStandInFor", func(t *testing.T) {
		// No whereabouts on the nodes yet: the installers are ready all the
		// same, and helm install --wait and the rollout return.
		helm(t, append(lcArgs("install"), "--create-namespace")...)
		require.NoError(t, c.WaitRolledOut(ctx(t), lcNS, "harvester-ipam", 3*time.Minute), "kubectl rollout status daemonset/harvester-ipam")
		for _, k := range ks {
			name, _ := k.binaries(t)
			assert.Equal(t, "missing", name, "%s: nothing stands at whereabouts' name", k.nd.Name)
			assert.Equal(t, sha(t, c.ChartBinary(chartTag1, "harvester-ipam")), sha(t, filepath.Join(k.nd.BinDir, "harvester-ipam")), "%s: harvester-ipam under its own name", k.nd.Name)
		}
	})

	t.Run("WhereaboutsArrives", func(t *testing.T) {
		// Its DaemonSet's pods write its binary at the name: the installers
		// see it and stand in.
		require.NoError(t, c.DeployHarvesterWhereabouts(ctx(t), testcni.V093))
		require.NoError(t, c.WaitRolledOut(ctx(t), "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
		for _, k := range ks {
			standing(t, k, chartTag1, testcni.V093, "whereabouts arrived")
		}
	})

	t.Run("ClockAheadThenV094", func(t *testing.T) {
		// whereabouts.real written while the node's clock was an hour ahead
		// (NTP stepped it back since): v0.9.4, written after it with an
		// earlier time, is the newer, and goes aside.
		ahead := time.Now().Add(time.Hour)
		for _, k := range ks {
			require.NoError(t, os.Chtimes(filepath.Join(k.nd.BinDir, "whereabouts.real"), ahead, ahead))
		}
		require.NoError(t, c.DeployHarvesterWhereabouts(ctx(t), testcni.V094))
		require.NoError(t, c.WaitRolledOut(ctx(t), "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
		for _, k := range ks {
			standing(t, k, chartTag1, testcni.V094, "v0.9.4 written after a whereabouts.real dated an hour ahead")
		}
	})

	t.Run("ForceDeletedPod", func(t *testing.T) {
		// kubectl delete pod --force --grace-period=0: the pod object goes at
		// once (its token is refused from then on), the kubelet stops the
		// container, the DaemonSet makes a new pod. Not an uninstall: the
		// name stays harvester-ipam's throughout.
		mark := one.watch.mark()
		pod, err := c.PodOf(ctx(t), lcNS, "app.kubernetes.io/component=installer", one.nd.Name)
		require.NoError(t, err)
		require.NoError(t, c.Kube.CoreV1().Pods(lcNS).Delete(ctx(t), pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		require.Eventually(t, func() bool {
			next, err := c.PodOf(ctx(t), lcNS, "app.kubernetes.io/component=installer", one.nd.Name)
			return err == nil && next != pod
		}, time.Minute, 200*time.Millisecond, "the DaemonSet makes a new pod")
		require.NoError(t, c.WaitRolledOut(ctx(t), lcNS, "harvester-ipam", 3*time.Minute))
		time.Sleep(5 * time.Second) // the old container's stop is over
		assert.Empty(t, one.watch.gapsSince(mark), "the name is harvester-ipam's throughout: %s", one.watch.history(mark))
		standing(t, one, chartTag1, testcni.V094, "force-deleted")
	})

	t.Run("TwoReleases", func(t *testing.T) {
		// A second release of the chart (another build) while the first
		// stands in: it takes nothing, says so, is ready, and its rollouts
		// end; the name never changes hands.
		marks := []int{one.watch.mark(), two.watch.mark()}
		other := func(verb string, set ...string) []string {
			args := []string{verb, "other", chartDir, "--namespace", lcOtherNS, "--wait", "--timeout", "3m",
				"--set", "image.tag=" + chartTag2, "--set", "installer.interval=" + lcInterval, "--set", "reconciler.enabled=false"}
			for _, s := range set {
				args = append(args, "--set", s)
			}
			return args
		}
		helm(t, append(other("install"), "--create-namespace")...)
		require.NoError(t, c.WaitRolledOut(ctx(t), lcOtherNS, "other-harvester-ipam", 3*time.Minute), "the second release's rollout ends")
		time.Sleep(25 * time.Second) // two of its intervals: time to fight, were it to
		helm(t, other("upgrade", "installer.interval=15s")...)
		require.NoError(t, c.WaitRolledOut(ctx(t), lcOtherNS, "other-harvester-ipam", 3*time.Minute), "the second release's next rollout ends")
		for i, k := range ks {
			logs := k.installerLogs(lcOtherNS)
			assert.Contains(t, logs, "release "+lcNS+"/harvester-ipam (pod ", "%s: the second release says who stands in", k.nd.Name)
			assert.Contains(t, logs, "this release ("+lcOtherNS+"/other-harvester-ipam) does not fight it", "%s", k.nd.Name)
			assert.NotContains(t, k.watch.history(marks[i]), "harvester-ipam "+chartTag2, "%s: the second release never takes the name", k.nd.Name)
			assert.Empty(t, k.watch.gapsSince(marks[i]), "%s: %s", k.nd.Name, k.watch.history(marks[i]))
		}
		t.Logf("node-1, the second release's log:\n%s", lastLines(ks[0].installerLogs(lcOtherNS), 6))
		helm(t, "uninstall", "other", "--namespace", lcOtherNS, "--wait", "--timeout", "3m")
		require.Eventually(t, func() bool {
			pods, err := c.Kube.CoreV1().Pods(lcOtherNS).List(ctx(t), metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0
		}, 2*time.Minute, 200*time.Millisecond, "the second release's pods are gone")
		for i, k := range ks {
			assert.Empty(t, k.watch.gapsSince(marks[i]), "%s: uninstalling the second release leaves the first's name: %s", k.nd.Name, k.watch.history(marks[i]))
			standing(t, k, chartTag1, testcni.V094, "the second release uninstalled")
		}
	})

	t.Run("NodeLeftOut", func(t *testing.T) {
		// installer.nodeSelector leaves node-2 out: its pod goes and gives the
		// name back there, and only there; node-1's pod rolls over keeping it.
		mark := one.watch.mark()
		start := time.Now()
		helm(t, lcArgs("upgrade", "installer.nodeSelector.storage=yes")...)
		two.givenBack(t, testcni.V094, start, time.Minute, "left out by the nodeSelector")
		assert.Empty(t, one.watch.gapsSince(mark), "node-1 keeps harvester-ipam at the name: %s", one.watch.history(mark))
		standing(t, one, chartTag1, testcni.V094, "node-2 left out")
		// Back in: it stands in there again.
		helm(t, lcArgs("upgrade")...)
		standing(t, two, chartTag1, testcni.V094, "node-2 selected again")
	})

	t.Run("StandInTurnedOffAndOn", func(t *testing.T) {
		start := time.Now()
		helm(t, lcArgs("upgrade", "standIn.enabled=false")...)
		off := revision
		for _, k := range ks {
			k.givenBack(t, testcni.V094, start, time.Minute, "standIn.enabled=false")
		}
		helm(t, lcArgs("upgrade")...)
		on := revision
		for _, k := range ks {
			standing(t, k, chartTag1, testcni.V094, "standIn.enabled=true again")
		}
		// helm rollback across the switch, both ways.
		start = time.Now()
		helm(t, "rollback", "harvester-ipam", fmt.Sprint(off), "--namespace", lcNS, "--wait", "--timeout", "3m")
		for _, k := range ks {
			k.givenBack(t, testcni.V094, start, time.Minute, fmt.Sprintf("helm rollback to revision %d (not standing in)", off))
		}
		helm(t, "rollback", "harvester-ipam", fmt.Sprint(on), "--namespace", lcNS, "--wait", "--timeout", "3m")
		for _, k := range ks {
			standing(t, k, chartTag1, testcni.V094, fmt.Sprintf("helm rollback to revision %d (standing in)", on))
		}
	})

	t.Run("InotifyExhausted", func(t *testing.T) {
		// inotify_init1 answers EMFILE in the installer's container (a
		// seccomp profile does it as an exhausted fs.inotify.max_user_instances
		// would, without starving the rest of the machine): it warns, stays
		// ready (the rollout ends), and takes the name again by its interval
		// after whereabouts writes it.
		profile := `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["inotify_init","inotify_init1"],"action":"SCMP_ACT_ERRNO","errnoRet":24}]}`
		for _, k := range ks {
			dir := filepath.Join(k.nd.KubeletDir, "seccomp")
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "harvester-ipam-no-inotify.json"), []byte(profile), 0o644))
		}
		patch := `{"spec":{"template":{"spec":{"containers":[{"name":"install","securityContext":{"seccompProfile":{"type":"Localhost","localhostProfile":"harvester-ipam-no-inotify.json"}}}]}}}}`
		_, err := c.Kube.AppsV1().DaemonSets(lcNS).Patch(ctx(t), "harvester-ipam", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			ds, err := c.Kube.AppsV1().DaemonSets(lcNS).Get(ctx(t), "harvester-ipam", metav1.GetOptions{})
			return err == nil && ds.Status.ObservedGeneration >= ds.Generation && ds.Status.UpdatedNumberScheduled == ds.Status.DesiredNumberScheduled
		}, time.Minute, 200*time.Millisecond)
		require.NoError(t, c.WaitRolledOut(ctx(t), lcNS, "harvester-ipam", 3*time.Minute), "ready without inotify: the rollout ends")
		require.Eventually(t, func() bool { return strings.Contains(one.installerLogs(lcNS), "warning: cannot watch") },
			time.Minute, 200*time.Millisecond, "the installer says it cannot watch:\n%s", lastLines(one.installerLogs(lcNS), 10))
		assert.Contains(t, one.installerLogs(lcNS), "too many open files", "inotify_init1's EMFILE")
		standing(t, one, chartTag1, testcni.V094, "without inotify")

		// whereabouts' pod on node-1 restarts: its install step writes the
		// name, and the installer's next interval takes it again.
		mark := one.watch.mark()
		pod, err := c.PodOf(ctx(t), "kube-system", "name=whereabouts", one.nd.Name)
		require.NoError(t, err)
		require.NoError(t, c.Kube.CoreV1().Pods("kube-system").Delete(ctx(t), pod, metav1.DeleteOptions{}))
		var gaps []gap
		require.Eventually(t, func() bool {
			gaps = one.watch.gapsSince(mark)
			return len(gaps) > 0 && gaps[len(gaps)-1].closed()
		}, 3*time.Minute, 100*time.Millisecond, "harvester-ipam stands in again by the interval: %s", one.watch.history(mark))
		for _, g := range gaps {
			t.Logf("without inotify, whereabouts' write: %s (the interval is %s)", g, lcInterval)
		}
		standing(t, one, chartTag1, testcni.V094, "taken again by the interval")
	})

	t.Run("NamespaceDeleted", func(t *testing.T) {
		// The chart's namespace deleted: its pods may go before its
		// DaemonSet; the name is given back on every node.
		start := time.Now()
		require.NoError(t, c.Kube.CoreV1().Namespaces().Delete(ctx(t), lcNS, metav1.DeleteOptions{}))
		for _, k := range ks {
			k.givenBack(t, testcni.V094, start, 2*time.Minute, "the chart's namespace deleted")
		}
		require.Eventually(t, func() bool {
			_, err := c.Kube.CoreV1().Namespaces().Get(ctx(t), lcNS, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, 3*time.Minute, 500*time.Millisecond, "the namespace is gone")
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
