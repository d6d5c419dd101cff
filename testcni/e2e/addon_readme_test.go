package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/harvester/harvester-ipam/testcni"
)

const addonREADME = "install/addon/harvester-ipam/README.md"

// TestKubeletAddonREADME runs the add-on's README as written, as Harvester
// runs an add-on, on a cluster with a real kubelet where whereabouts runs as
// Harvester deploys it: the chart repository made with make chart-repo and
// served over HTTP; the image in a private registry that wants a login
// (crane's registry behind a proxy that answers 401 without it), its pull
// secret made in harvester-system as the README says; the Addon of
// install/addon with the repo and valuesContent the README gives, applied
// against Harvester's own Addon CRD; enabled, changed and disabled with the
// README's commands, which Harvester's addon controller (the rig's stand-in,
// testcni.StartAddonController) turns into a HelmChart that RKE2's
// helm-controller installs, upgrades and uninstalls with its Jobs. Each
// command's sample output is checked, and what each step promises: the
// pods pulled the image with the login, harvester-ipam stands in, the log
// level reaches the node, the chart's newer version and back, the stand-in
// turned off gives the name back, disabled the chart is gone and every node
// has whereabouts alone. The operator's own values (the chart repository's
// URL, the registry, the login, their copy of harvester-ipam.yaml) are the
// test's; the newer version is the chart packaged as 0.2.0
// (CHART_VERSION), the "new release's checkout" of the README.
func TestKubeletAddonREADME(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocksOf(t, addonREADME)
	ctx := longCtx(t)
	appVersion := chartAppVersion(t)
	version := chartVersion(t)
	const newer = "0.2.0"
	readme, err := os.ReadFile(filepath.Join(rig.Root, addonREADME))
	require.NoError(t, err)
	require.Contains(t, string(readme), `"`+version+`"`, "the README goes back to the chart's own version, %s", version)

	wb, err := rig.WhereaboutsImage(ctx, testcni.V093)
	require.NoError(t, err)
	klipper, err := rig.KlipperHelmImage(ctx)
	require.NoError(t, err)
	chartImage, err := rig.ChartImage(ctx, appVersion)
	require.NoError(t, err)
	c, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: "addonreadme", NoWebhook: true})
	require.NoError(t, err)
	// The chart's image is not on the node: it comes from the registry.
	nd, err := c.StartNode(ctx, c.Default, testcni.NodeOptions{Kubelet: true, NoWhereabouts: true, Images: []testcni.Image{wb, klipper}})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the kubelet's log, last lines:\n%s", nd.KubeletLogTail(30))
			t.Logf("containerd's log, last lines:\n%s", nd.LogTail(20))
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
		v, _ := exec.Command(filepath.Join(nd.BinDir, name), "--version").Output()
		return strings.TrimSpace(string(v))
	}
	require.Eventually(t, func() bool { return at("whereabouts") == "whereabouts" }, time.Minute, 200*time.Millisecond)
	// Longhorn's pods on the storage network, before the add-on.
	require.NoError(t, c.EnsureNamespace(ctx, testcni.HarvesterNamespace))
	conf := fmt.Sprintf(`{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","ipam":{"type":"whereabouts","range":%q}}`, storageRange)
	_, err = c.Dynamic.Resource(testcni.NADResource).Namespace(testcni.HarvesterNamespace).Create(ctx, testcni.StorageNetworkNAD("storagenetwork-addon", conf), metav1.CreateOptions{})
	require.NoError(t, err)
	longhorn := (&kubeletNode{c: c, nd: nd, nad: "storagenetwork-addon"}).pods(t, "instance-manager", 2)
	_, err = nd.WaitPodsReady(ctx, longhorn, time.Time{}, 3*time.Minute)
	require.NoError(t, err)

	// A private registry, the image pushed there (as the README's step 2
	// does with crane).
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	reg, stopReg, err := c.StartPrivateRegistry(5000, "rig-operator", hex.EncodeToString(pw))
	require.NoError(t, err)
	defer stopReg()
	image := reg.Host + "/harvester/harvester-ipam:" + appVersion
	push := exec.CommandContext(ctx, rig.Tools["crane"], "push", "--insecure", chartImage.Archive, reg.Push+"/harvester/harvester-ipam:"+appVersion)
	out, err := push.CombinedOutput()
	require.NoError(t, err, "crane push: %s", out)

	// Harvester: its Addon CRD beside k3s' (RKE2 serves both: the README
	// names addons.harvesterhci.io in full), its namespace, its addon
	// controller; RKE2's helm-controller.
	require.NoError(t, c.ApplyAddonCRDs(ctx), "Harvester's and k3s' Addon CRDs")
	require.NoError(t, c.StartHelmController(ctx, testcni.KlipperHelmImageRef))
	defer c.StartAddonController(ctx, testcni.HarvesterNamespace)()

	// The repository the README's step 2 makes, in the directory the web
	// server serves (the README's /srv/www/harvester-ipam, the operator's
	// own), which keeps every version make chart-repo adds to it.
	repoDir := filepath.Join(t.TempDir(), "srv", "harvester-ipam")
	require.NoError(t, os.MkdirAll(repoDir, 0o755))
	url, stopRepo, err := c.ServeOnMachine(8080, http.FileServer(http.Dir(repoDir)))
	require.NoError(t, err)
	defer stopRepo()

	// The operator's copy of harvester-ipam.yaml, with the repo and the
	// valuesContent of the README's step 3.
	sh := newReadmeShell(t, c, nd)
	subst := strings.NewReplacer("http://charts.example.com/harvester-ipam", url, "registry.example.com", reg.Host)
	var step3 struct {
		Spec struct {
			Repo          string `json:"repo"`
			ValuesContent string `json:"valuesContent"`
		} `json:"spec"`
	}
	m := regexp.MustCompile("(?ms)^[ \t]*```yaml[ \t]*\n(.*?)^[ \t]*```").FindSubmatch(readme)
	require.NotNil(t, m, "the README's step 3 gives the Addon's repo and values in a yaml block")
	require.NoError(t, yaml.Unmarshal([]byte(dedent(string(m[1]))), &step3))
	require.NotEmpty(t, step3.Spec.Repo)
	raw, err := os.ReadFile(filepath.Join(rig.Root, "install", "addon", "harvester-ipam", "harvester-ipam.yaml"))
	require.NoError(t, err)
	var addon map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &addon))
	spec := addon["spec"].(map[string]any)
	spec["repo"] = subst.Replace(step3.Spec.Repo)
	spec["valuesContent"] = subst.Replace(step3.Spec.ValuesContent)
	mine, err := yaml.Marshal(addon)
	require.NoError(t, err)
	addonFile := filepath.Join(t.TempDir(), "harvester-ipam.yaml")
	require.NoError(t, os.WriteFile(addonFile, mine, 0o644))
	// The operator's helm for make chart-repo (the shell's HOME has no
	// tool cache, and the rig no network to build one).
	sh.env = append(sh.env, "HELM="+rig.Tools["helm"])
	sh.subst = [][2]string{
		{"http://charts.example.com/harvester-ipam", url},
		{"registry.example.com", reg.Host},
		{"--docker-username=...", "--docker-username=" + reg.User},
		{"--docker-password=...", "--docker-password=" + reg.Password},
		{"install/addon/harvester-ipam/harvester-ipam.yaml", addonFile},
		{"/srv/www/harvester-ipam", repoDir},
	}

	// Installation: the repository, the secret and the Addon, enabled.
	sh.run(blocks["addon-repo"])
	assert.FileExists(t, filepath.Join(repoDir, "harvester-ipam-"+version+".tgz"))
	sh.run(blocks["addon-apply"])
	start := time.Now()
	sh.run(blocks["addon-enable"])
	t.Logf("enabled in %s", time.Since(start).Round(100*time.Millisecond))
	require.False(t, t.Failed(), "the add-on did not install as its README says")
	assert.Equal(t, "harvester-ipam "+appVersion, at("whereabouts"), "harvester-ipam stands in")
	assert.Equal(t, "whereabouts", at("whereabouts.real"))
	pods, err := c.Kube.CoreV1().Pods(testcni.HarvesterNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=harvester-ipam"})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items)
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			assert.Equal(t, image, ctr.Image, "pod %s, container %s runs the registry's image", p.Name, ctr.Name)
		}
		require.Len(t, p.Spec.ImagePullSecrets, 1)
		assert.Equal(t, "harvester-ipam-pull", p.Spec.ImagePullSecrets[0].Name)
	}
	_, refused, manifests := reg.Counts()
	assert.Positive(t, refused, "the registry refused a pull without the login")
	assert.NotEmpty(t, manifests, "the node pulled the image's manifest with the pull secret's login")
	t.Logf("the registry: %d requests refused without the login, manifests pulled with it: %v", refused, manifests)

	// The README's Verify and inspect, in the namespaces its table gives the
	// add-on: harvester-ipam's objects in harvester-system, the rest (the
	// pools, whereabouts) in kube-system.
	main := readmeBlocks(t)
	for _, name := range []string{"verify", "inspect"} {
		blk := main[name]
		blk.name, blk.cmds = "addon-table-"+name, append([]readmeCmd(nil), blk.cmds...)
		for i := range blk.cmds {
			if addonsObjectRE.MatchString(blk.cmds[i].cmd) {
				blk.cmds[i].cmd = strings.ReplaceAll(blk.cmds[i].cmd, "-n kube-system", "-n "+testcni.HarvesterNamespace)
			}
		}
		sh.run(blk)
	}

	// Values: the log level, which the installer writes to the node.
	sh.run(blocks["addon-loglevel"])
	settings := filepath.Join(nd.Etc, "cni", "net.d", "harvester-ipam.d", "harvester-ipam.conf")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(settings)
		return strings.Contains(string(b), `"log_level":"debug"`)
	}, time.Minute, 200*time.Millisecond, "the node's settings have the new log level")

	// A newer chart in the repository (the new release's checkout runs
	// step 2), the upgrade, and back.
	mk := blocks["addon-repo"]
	mk.name, mk.cmds = "addon-repo-newer", append([]readmeCmd(nil), mk.cmds...)
	mk.cmds[0].cmd += " CHART_VERSION=" + newer
	sh.run(mk)
	for _, v := range []string{version, newer} {
		assert.FileExists(t, filepath.Join(repoDir, "harvester-ipam-"+v+".tgz"), "the repository keeps %s", v)
	}
	up := blocks["addon-upgrade"]
	require.Contains(t, up.cmds[0].cmd, `"version":"`+newer+`"`)
	sh.run(up)
	back := up
	back.name, back.cmds = "addon-downgrade", nil
	for _, cmd := range up.cmds {
		cmd.cmd = strings.ReplaceAll(cmd.cmd, `"version":"`+newer+`"`, `"version":"`+version+`"`)
		cmd.sample = append([]string(nil), cmd.sample...)
		for i := range cmd.sample {
			cmd.sample[i] = strings.ReplaceAll(cmd.sample[i], "harvester-ipam-"+newer, "harvester-ipam-"+version)
		}
		back.cmds = append(back.cmds, cmd)
	}
	sh.run(back)
	hc, err := c.Dynamic.Resource(testcni.HelmChartResource).Namespace(testcni.HarvesterNamespace).Get(ctx, "harvester-ipam", metav1.GetOptions{})
	require.NoError(t, err)
	v, _, _ := unstructured.NestedString(hc.Object, "spec", "version")
	assert.Equal(t, version, v, "the HelmChart is back at %s", version)
	assert.Equal(t, "harvester-ipam "+appVersion, at("whereabouts"), "still standing in")

	// The stand-in turned off: whereabouts' own bytes back, nothing aside.
	sh.run(blocks["addon-standin-off"])
	assert.Equal(t, "whereabouts", at("whereabouts"))
	assert.Equal(t, "missing", at("whereabouts.real"))

	// Disabled: the release uninstalled, every node with whereabouts alone.
	sh.run(blocks["addon-disable"])
	if outs := sh.out["addon-disable"]; assert.NotEmpty(t, outs) {
		loop := outs[len(outs)-1]
		assert.Contains(t, loop, "node "+nd.Name+": whereabouts")
		assert.NotContains(t, loop, "whereabouts.real")
	}
	ds, err := c.Kube.AppsV1().DaemonSets(testcni.HarvesterNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=harvester-ipam"})
	require.NoError(t, err)
	assert.Empty(t, ds.Items, "the chart's DaemonSets are gone")
	assert.Equal(t, "whereabouts", at("whereabouts"))

	for name := range blocks {
		assert.True(t, sh.ran[name], "%s's block %s was not run", addonREADME, name)
	}
	assert.True(t, sh.ran["addon-table-verify"] && sh.ran["addon-table-inspect"])
}

// addonsObjectRE matches a command on harvester-ipam's own objects, which
// the README's Install puts in harvester-system for the add-on.
var addonsObjectRE = regexp.MustCompile(`(ds|deploy|cronjob|job)/harvester-ipam|app\.kubernetes\.io/name=harvester-ipam`)

// dedent removes the indentation of a block's first line from every line.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		if len(l) >= indent && strings.TrimSpace(l[:indent]) == "" {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

func chartVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(rig.Root, chartDir, "Chart.yaml"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)`).FindSubmatch(b)
	require.NotNil(t, m)
	return string(m[1])
}
