package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/harvester/harvester-ipam/testcni"
)

// TestKubeletAddon does with install/addon what Harvester does with an
// add-on, on a cluster with a real kubelet where whereabouts runs as
// Harvester deploys it: the Addon is created against Harvester's own Addon
// CRD (v1.6.0's); enabled, it becomes the HelmChart Harvester's addon
// controller writes (owned by the Addon, its chart, repo, version and
// valuesContent; the test writes it, as that controller's code does), which
// RKE2's helm-controller (v0.16.17, built from its module) installs with a
// Job, from the Helm repository `make chart-repo` wrote, served over HTTP;
// disabled, the HelmChart is deleted and helm-controller's Job uninstalls
// the release, and the node gets whereabouts' name back. What stands in:
// Harvester's addon controller (the HelmChart is written here as its
// source writes it), and klipper-helm's entry script in the Job's image
// (testcni/klipperhelm, with the real helm).
func TestKubeletAddon(t *testing.T) {
	t.Parallel()
	ctx := longCtx(t)
	appVersion := chartAppVersion(t)
	chartVersion := strings.TrimPrefix(appVersion, "v")

	// The repository, as an operator makes it.
	repoDir := t.TempDir()
	mk := exec.CommandContext(ctx, "make", "chart-repo", "CHART_REPO="+repoDir)
	mk.Dir = rig.Root
	mk.Env = append(os.Environ(), "HELM="+rig.Tools["helm"])
	out, err := mk.CombinedOutput()
	require.NoError(t, err, "make chart-repo: %s", out)
	index, err := os.ReadFile(filepath.Join(repoDir, "index.yaml"))
	require.NoError(t, err, "make chart-repo writes index.yaml")
	assert.Contains(t, string(index), "harvester-ipam-"+chartVersion+".tgz")
	assert.FileExists(t, filepath.Join(repoDir, "harvester-ipam-"+chartVersion+".tgz"))

	images := map[string]func() (testcni.Image, error){
		"whereabouts":  func() (testcni.Image, error) { return rig.WhereaboutsImage(ctx, testcni.V093) },
		"the chart's":  func() (testcni.Image, error) { return rig.ChartImage(ctx, appVersion) },
		"klipper-helm": func() (testcni.Image, error) { return rig.KlipperHelmImage(ctx) },
	}
	var imgs []testcni.Image
	for what, build := range images {
		img, err := build()
		require.NoError(t, err, "%s image", what)
		imgs = append(imgs, img)
	}
	c, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: "addon", NoWebhook: true})
	require.NoError(t, err)
	nd, err := c.StartNode(ctx, c.Default, testcni.NodeOptions{Kubelet: true, NoWhereabouts: true, Images: imgs})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the kubelet's log, last lines:\n%s", nd.KubeletLogTail(30))
		}
		nd.Close()
	})
	require.NoError(t, c.DeployHarvesterWhereabouts(ctx, testcni.V093))
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
	wbBytes, err := os.ReadFile(rig.Tools["whereabouts-"+testcni.V093])
	require.NoError(t, err)
	at := func(name string) string {
		b, err := os.ReadFile(filepath.Join(nd.BinDir, name))
		switch {
		case os.IsNotExist(err):
			return "missing"
		case err != nil:
			return err.Error()
		case string(b) == string(wbBytes):
			return "whereabouts"
		}
		cmd := exec.Command(filepath.Join(nd.BinDir, name), "--version")
		v, _ := cmd.Output()
		return strings.TrimSpace(string(v))
	}
	require.Eventually(t, func() bool { return at("whereabouts") == "whereabouts" }, time.Minute, 200*time.Millisecond,
		"whereabouts' pod puts its binary at the name (now %s)", at("whereabouts"))

	url, stop, err := c.ServeOnMachine(8080, http.FileServer(http.Dir(repoDir)))
	require.NoError(t, err)
	defer stop()
	require.NoError(t, c.StartHelmController(ctx, testcni.KlipperHelmImageRef))

	// Harvester's Addon CRD, and the Addon as install/addon has it, its
	// repo the one thing an operator sets.
	require.NoError(t, c.ApplyAddonCRDs(ctx), "Harvester's Addon CRD, beside k3s' as RKE2 serves it")
	require.NoError(t, c.EnsureNamespace(ctx, testcni.HarvesterNamespace))
	raw, err := os.ReadFile(filepath.Join(rig.Root, "install", "addon", "harvester-ipam", "harvester-ipam.yaml"))
	require.NoError(t, err)
	var addon unstructured.Unstructured
	require.NoError(t, yamlUnmarshal(raw, &addon.Object))
	spec := addon.Object["spec"].(map[string]any)
	assert.Equal(t, chartVersion, spec["version"], "the Addon asks for the chart's version")
	assert.Equal(t, "harvester-ipam", spec["chart"])
	assert.Equal(t, false, spec["enabled"], "off until the operator enables it")
	spec["repo"] = url
	require.Eventually(t, func() bool {
		_, err = c.Dynamic.Resource(testcni.AddonResource).Namespace(addon.GetNamespace()).Create(ctx, &addon, metav1.CreateOptions{})
		return err == nil || !apierrors.IsNotFound(err) // the CRD just established
	}, time.Minute, 500*time.Millisecond)
	require.NoError(t, err, "the Addon is valid by Harvester's Addon CRD")
	// The CRD is no rubber stamp: an Addon without a field it requires is refused.
	bad := addon.DeepCopy()
	bad.SetName("without-values")
	delete(bad.Object["spec"].(map[string]any), "valuesContent")
	_, err = c.Dynamic.Resource(testcni.AddonResource).Namespace(addon.GetNamespace()).Create(ctx, bad, metav1.CreateOptions{})
	assert.ErrorContains(t, err, "valuesContent", "Harvester's CRD requires valuesContent")

	// Enabled (the README's kubectl patch), then the HelmChart as
	// Harvester's addon controller writes it.
	patch := exec.CommandContext(ctx, rig.Tools["kubectl"], "--kubeconfig", c.Kubeconfig, "-n", testcni.HarvesterNamespace,
		"patch", "addon", "harvester-ipam", "--type=merge", "-p", `{"spec":{"enabled":true}}`)
	out, err = patch.CombinedOutput()
	require.NoError(t, err, "kubectl patch addon: %s", out)
	a, err := c.Dynamic.Resource(testcni.AddonResource).Namespace(testcni.HarvesterNamespace).Get(ctx, "harvester-ipam", metav1.GetOptions{})
	require.NoError(t, err)
	enabled, _, _ := unstructured.NestedBool(a.Object, "spec", "enabled")
	require.True(t, enabled)
	hc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": map[string]any{
			"name": a.GetName(), "namespace": a.GetNamespace(),
			"ownerReferences": []any{map[string]any{"apiVersion": a.GetAPIVersion(), "kind": a.GetKind(), "name": a.GetName(), "uid": string(a.GetUID())}},
		},
		"spec": map[string]any{"chart": spec["chart"], "repo": url, "version": spec["version"], "valuesContent": spec["valuesContent"]},
	}}
	start := time.Now()
	_, err = c.Dynamic.Resource(testcni.HelmChartResource).Namespace(testcni.HarvesterNamespace).Create(ctx, hc, metav1.CreateOptions{})
	require.NoError(t, err, "the HelmChart, as Harvester's addon controller writes it")
	require.NoError(t, waitJob(ctx, c, "helm-install-harvester-ipam", 5*time.Minute))
	require.NoError(t, c.WaitRolledOut(ctx, testcni.HarvesterNamespace, "harvester-ipam", 3*time.Minute))
	t.Logf("enabled: helm-controller's Job installed the chart and its DaemonSet rolled out in %s", time.Since(start).Round(100*time.Millisecond))
	require.Eventually(t, func() bool { return at("whereabouts.real") == "whereabouts" }, time.Minute, 200*time.Millisecond)
	assert.Equal(t, "harvester-ipam "+appVersion, at("whereabouts"), "harvester-ipam stands in")

	// Disabled: the HelmChart deleted, as the addon controller does;
	// helm-controller's delete Job uninstalls the release.
	start = time.Now()
	_, err = c.Dynamic.Resource(testcni.AddonResource).Namespace(testcni.HarvesterNamespace).Patch(ctx, "harvester-ipam",
		types.MergePatchType, []byte(`{"spec":{"enabled":false}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Dynamic.Resource(testcni.HelmChartResource).Namespace(testcni.HarvesterNamespace).Delete(ctx, "harvester-ipam", metav1.DeleteOptions{}))
	require.NoError(t, wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Dynamic.Resource(testcni.HelmChartResource).Namespace(testcni.HarvesterNamespace).Get(ctx, "harvester-ipam", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}), "helm-controller's delete Job runs and the HelmChart goes")
	require.Eventually(t, func() bool {
		pods, err := c.Kube.CoreV1().Pods(testcni.HarvesterNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=harvester-ipam"})
		return err == nil && len(pods.Items) == 0
	}, 3*time.Minute, time.Second, "the chart's pods are gone")
	t.Logf("disabled: uninstalled in %s", time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, "whereabouts", at("whereabouts"), "the real whereabouts back at its name")
	assert.Equal(t, "missing", at("whereabouts.real"))
}

// waitJob waits until a Job (helm-controller's) has succeeded; a Job whose
// pods fail is reported with their logs' ends by its status.
func waitJob(ctx context.Context, c *testcni.Rig, name string, limit time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, limit, true, func(ctx context.Context) (bool, error) {
		j, err := c.Kube.BatchV1().Jobs(testcni.HarvesterNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("active %d, succeeded %d, failed %d", j.Status.Active, j.Status.Succeeded, j.Status.Failed)
		return j.Status.Succeeded > 0, nil
	})
	if err != nil {
		pods, _ := c.Kube.CoreV1().Pods(testcni.HarvesterNamespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		var why []string
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				why = append(why, fmt.Sprintf("%s: %+v", p.Name, cs.State))
			}
		}
		return fmt.Errorf("job %s: %w (%s) %s", name, err, last, strings.Join(why, "; "))
	}
	return nil
}
