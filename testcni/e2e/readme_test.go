package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// The README's operator commands are fenced blocks marked for this test:
//
//	```console rig:NAME    run where an operator's kubectl and helm run
//	```console node:NAME   run in a root shell on a node
//
// Each `$ ` line is a command (a trailing \ continues it); the lines after
// it are its sample output, checked loosely: each line's first word must
// start a line of the real output, in order ("..." stands for anything,
// and a word ending in ... for any word it begins). An assignment `$ X=...`
// sets X for the block's later commands (and the next blocks'); one
// commented "# yours" is the operator's own value, which the test gives.
// A command ending in a here-document (<<'EOF') takes the lines up to its
// end. The add-on's README (install/addon/harvester-ipam) is marked alike.

type readmeCmd struct {
	line   int
	cmd    string
	sample []string
}

type readmeBlock struct {
	where, name string // rig or node; the block's name
	file        string
	line        int
	cmds        []readmeCmd
}

var (
	fenceRE   = regexp.MustCompile("^\\s*```(\\S*)\\s*(\\S*)\\s*$")
	heredocRE = regexp.MustCompile(`<<-?'?([A-Za-z_]+)'?\s*$`)
)

// readmeBlocks are README.md's marked blocks, by name; a console block
// without a mark, or two of one name, fail the test.
func readmeBlocks(t *testing.T) map[string]readmeBlock {
	return readmeBlocksOf(t, "README.md")
}

// readmeDocs is the reference, whose marked blocks (the log level raised and
// read, which the README's troubleshooting points to) TestKubeletREADME runs.
const readmeDocs = "docs/reference.md"

// readmeBlockNames are README.md's blocks, each run by TestKubeletREADME.
var readmeBlockNames = []string{"image", "import", "push", "install", "monitoring", "verify", "inspect", "release-now", "cni-error",
	"node", "wb-restart", "orphaned", "after-upgrade", "reconciler", "passnow", "events", "longhorn-restart", "giveback",
	"preflight", "upgrade", "standin-off", "standin-on", "uninstall"}

// readmeBlocksOf are the marked blocks of file (from the repository's root).
func readmeBlocksOf(t *testing.T, file string) map[string]readmeBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rig.Root, file))
	require.NoError(t, err)
	blocks := map[string]readmeBlock{}
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil || m[1] == "" {
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var body []string
		start := i + 1
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], strings.Repeat(" ", indent)))
		}
		if m[1] != "console" {
			continue
		}
		where, name, ok := strings.Cut(m[2], ":")
		if !ok || (where != "rig" && where != "node") || name == "" {
			t.Errorf("%s:%d: a console block must be marked rig:NAME or node:NAME for the README's test, not %q", file, start, m[2])
			continue
		}
		if _, dup := blocks[name]; dup {
			t.Errorf("%s:%d: a second block named %s", file, start, name)
		}
		blk := readmeBlock{where: where, name: name, file: file, line: start}
		for j := 0; j < len(body); j++ {
			l := body[j]
			if !strings.HasPrefix(l, "$ ") {
				if n := len(blk.cmds); n > 0 && strings.TrimSpace(l) != "" {
					blk.cmds[n-1].sample = append(blk.cmds[n-1].sample, l)
				}
				continue
			}
			c := readmeCmd{line: start + 1 + j, cmd: strings.TrimPrefix(l, "$ ")}
			for strings.HasSuffix(c.cmd, "\\") && j+1 < len(body) {
				j++
				c.cmd = strings.TrimSuffix(c.cmd, "\\") + "\n" + body[j]
			}
			if h := heredocRE.FindStringSubmatch(c.cmd); h != nil {
				for j+1 < len(body) {
					j++
					c.cmd += "\n" + body[j]
					if body[j] == h[1] {
						break
					}
				}
			}
			blk.cmds = append(blk.cmds, c)
		}
		if len(blk.cmds) == 0 {
			t.Errorf("%s:%d: block %s has no command", file, start, name)
		}
		blocks[name] = blk
	}
	return blocks
}

// samplesMatch says whether out has, in order, a line starting with the
// first word of each sample line.
func samplesMatch(sample []string, out string) error {
	lines := strings.Split(out, "\n")
	at := 0
	for _, s := range sample {
		f := strings.Fields(s)
		if len(f) == 0 || f[0] == "..." {
			continue
		}
		word, prefix := f[0], false
		if strings.HasSuffix(word, "...") {
			word, prefix = strings.TrimSuffix(word, "..."), true
		}
		found := false
		for ; at < len(lines); at++ {
			g := strings.Fields(lines[at])
			if len(g) > 0 && (g[0] == word || prefix && strings.HasPrefix(g[0], word)) {
				found, at = true, at+1
				break
			}
		}
		if !found {
			return fmt.Errorf("no line starting %q (sample line %q) in order", f[0], s)
		}
	}
	return nil
}

// A command is typed again only for a request the API server never served;
// a refusal, a timeout that may have applied or a wrong output is the
// command's own result.
func TestUnservedIsOnlyARequestNeverServed(t *testing.T) {
	for out, want := range map[string]bool{
		"Unable to connect to the server: net/http: TLS handshake timeout":                                  true,
		`The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?`: true,
		"Error from server (ServiceUnavailable): the server is currently unable to handle the request":      true,
		`Get "https://127.0.0.1:6443/api": dial tcp 127.0.0.1:6443: connect: connection refused`:            true,
		"Error from server: etcdserver: request timed out":                                                  false,
		`Error from server (NotFound): pods "x" not found`:                                                  false,
		"Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress":                false,
	} {
		assert.Equal(t, want, unservedRE.MatchString(out), out)
	}
}

// TestREADMEBlocksParse holds the parser to the README's blocks and the
// loose match to what it promises.
func TestREADMEBlocksParse(t *testing.T) {
	blocks := readmeBlocks(t)
	for _, name := range readmeBlockNames {
		assert.Contains(t, blocks, name, "README.md's block %s", name)
	}
	assert.Len(t, blocks, len(readmeBlockNames), "every README.md block is one TestKubeletREADME runs")
	assert.Equal(t, "node", blocks["import"].where)
	docs := readmeBlocksOf(t, readmeDocs)
	for _, name := range []string{"loglevel", "readlog"} {
		assert.Contains(t, docs, name, "%s's block %s", readmeDocs, name)
	}
	addon := readmeBlocksOf(t, addonREADME)
	for _, name := range []string{"addon-repo", "addon-apply", "addon-enable", "addon-loglevel", "addon-upgrade", "addon-standin-off", "addon-disable"} {
		assert.Contains(t, addon, name, "%s's block %s", addonREADME, name)
	}
	if c := addon["addon-loglevel"].cmds; assert.NotEmpty(t, c) {
		assert.True(t, strings.HasSuffix(c[0].cmd, "\nEOF"), "a here-document is the command's, up to its end: %q", c[0].cmd)
		assert.Equal(t, "addon.harvesterhci.io/harvester-ipam patched", c[0].sample[0], "and its output follows it")
	}
	assert.NoError(t, samplesMatch([]string{"NAME  READY", "harvester-ipam-...  2/2", "..."}, "x\nNAME READY STATUS\nharvester-ipam-x7k2p 2/2 Running\n"))
	assert.Error(t, samplesMatch([]string{"daemon set"}, "Waiting for daemon set\n"))
	assert.Error(t, samplesMatch([]string{"b", "a"}, "a\nb\n"), "in order")
}

// readmeShell runs the README's blocks as an operator would: kubectl, helm
// and crane on PATH, the cluster's kubeconfig, the repository as the
// working directory, on the cluster's machine (whose localhost the nodes'
// registry is at); node blocks in a root shell on the node.
type readmeShell struct {
	t     *testing.T
	c     *testcni.Rig
	nd    *testcni.Node
	env   []string
	vars  map[string]string
	yours map[string]string
	// nodeDir is the node's working directory (the archive copied there).
	nodeDir string
	ran     map[string]bool
	// out is each command's output, by block name, in order.
	out map[string][]string
	// subst are the operator's own values in the commands (a URL, a
	// registry, a password, a file of theirs): each old string is replaced
	// by the test's.
	subst [][2]string
}

func newReadmeShell(t *testing.T, c *testcni.Rig, nd *testcni.Node) *readmeShell {
	bin := t.TempDir()
	for _, tool := range []string{"kubectl", "helm", "crane"} {
		require.NoError(t, os.Symlink(rig.Tools[tool], filepath.Join(bin, tool)))
	}
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	home := t.TempDir()
	// The operator's own HOME, but this machine's Go caches: the rig has
	// no network, and make image builds from the module cache.
	goenv, err := exec.Command("go", "env", "GOMODCACHE", "GOCACHE").Output()
	require.NoError(t, err)
	caches := strings.Fields(string(goenv))
	require.Len(t, caches, 2)
	env := append(os.Environ(), "GOMODCACHE="+caches[0], "GOCACHE="+caches[1],
		"PATH="+bin+":"+filepath.Dir(goBin)+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"KUBECONFIG="+c.Kubeconfig, "HOME="+home,
		"HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	return &readmeShell{t: t, c: c, nd: nd, env: env, vars: map[string]string{}, yours: map[string]string{},
		nodeDir: t.TempDir(), ran: map[string]bool{}, out: map[string][]string{}}
}

// unservedRE is what kubectl and helm print for a request the API server
// never served: a connection not made, or dropped before an answer.
var unservedRE = regexp.MustCompile(`Unable to connect to the server|TLS handshake timeout|connect: connection refused|The connection to the server \S+ was refused|http2: client connection lost|the server is currently unable to handle the request`)

var assignRE = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(.*)$`)

// run runs a block's commands in order; each must exit 0 and print what its
// sample promises.
func (s *readmeShell) run(b readmeBlock) {
	t := s.t
	t.Helper()
	s.ran[b.name] = true
	for _, c := range b.cmds {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		if m := assignRE.FindStringSubmatch(c.cmd); m != nil && !strings.Contains(c.cmd, "\n") {
			if strings.Contains(m[2], "# yours") {
				v, ok := s.yours[m[1]]
				require.True(t, ok, "%s:%d: %s is the operator's own; the test has none", b.file, c.line, m[1])
				s.vars[m[1]] = v
				cancel()
				continue
			}
			out, err := s.command(ctx, b.where, c.cmd+"\nprintf %s \"$"+m[1]+"\"").Output()
			cancel()
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			require.NoError(t, err, "%s:%d: %s printed: %s", b.file, c.line, c.cmd, oneLine(lastLines(string(stderr), 8)))
			s.vars[m[1]] = string(out)
			t.Logf("%s:%d: %s=%s", b.file, c.line, m[1], out)
			continue
		}
		var buf bytes.Buffer
		var err error
		for try := 1; ; try++ {
			start := time.Now()
			buf.Reset()
			cmd := s.command(ctx, b.where, c.cmd)
			cmd.Stdout, cmd.Stderr = &buf, &buf
			err = cmd.Run()
			t.Logf("%s:%d ($ %s), %s:\n%s", b.file, c.line, c.cmd, time.Since(start).Round(100*time.Millisecond), buf.String())
			// What this checks is the command as written, not a loaded
			// API server's transport: a request it never served is typed
			// again, once, as an operator would.
			if err == nil || try > 1 || !unservedRE.MatchString(buf.String()) {
				break
			}
			t.Logf("%s:%d: the API server did not serve the request (%s): once more", b.file, c.line, unservedRE.FindString(buf.String()))
		}
		cancel()
		s.out[b.name] = append(s.out[b.name], buf.String())
		if !assert.NoError(t, err, "%s:%d: %s printed: %s", b.file, c.line, c.cmd, oneLine(lastLines(buf.String(), 8))) {
			continue
		}
		assert.NoError(t, samplesMatch(c.sample, buf.String()), "%s:%d: %s prints what the README shows; it printed: %s", b.file, c.line, c.cmd, oneLine(lastLines(buf.String(), 8)))
	}
}

// oneLine puts a command's last lines on one line of a failure's message:
// CI shows a failure's message and the three lines after it.
func oneLine(out string) string { return strings.ReplaceAll(out, "\n", " | ") }

func (s *readmeShell) command(ctx context.Context, where, script string) *exec.Cmd {
	var vars []string
	for k, v := range s.vars {
		vars = append(vars, k+"="+v)
	}
	for _, r := range s.subst {
		script = strings.ReplaceAll(script, r[0], r[1])
	}
	if where == "node" {
		// RKE2's ctr is containerd's own ctr, of RKE2's containerd; the
		// node's is Debian's 1.6.20, at the socket path RKE2 uses.
		script = strings.ReplaceAll(script, "/var/lib/rancher/rke2/bin/ctr ", "ctr ")
		cmd, err := s.nd.OnNode(ctx, s.nodeDir, script)
		require.NoError(s.t, err)
		cmd.Env = append(cmd.Env, vars...)
		return cmd
	}
	cmd, err := s.c.OnMachine(ctx, "bash", "-o", "pipefail", "-c", script)
	require.NoError(s.t, err)
	cmd.Dir = rig.Root
	cmd.Env = append(append([]string{}, s.env...), vars...)
	return cmd
}

// TestKubeletREADME runs README.md's operator commands as written, with the
// chart's default values, on a cluster with a real kubelet where whereabouts
// runs as Harvester deploys it: the image built and imported with RKE2's ctr
// and socket, helm install, verify, inspect, every troubleshooting block (a
// node's pods, a pod's CNI error, the reconciler, a pass, the Events and the
// audit, whereabouts restarted, a backing-image manager's new sandbox, the stand-in
// off and on, old pools deleted), the log level raised and read (the
// reference's blocks), monitoring on, the preflight, an upgrade, helm
// uninstall, the give-back on a node that was down at an uninstall, the image
// pushed to a registry and pulled from it, and whereabouts upgraded as a
// Harvester upgrade does, each node's real binary then checked. Every marked
// block runs; each step checks what an operator would (the bytes at
// whereabouts' name, the node's files).
func TestKubeletREADME(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t)
	docs := readmeBlocksOf(t, readmeDocs)
	ctx := longCtx(t)
	wb, err := rig.WhereaboutsImage(ctx, testcni.V093)
	require.NoError(t, err)
	wbNext, err := rig.WhereaboutsImage(ctx, testcni.V094)
	require.NoError(t, err)
	// The README's monitoring block turns the reconciler into a Deployment
	// and waits for its rollout: the cluster runs the controllers that roll
	// one out.
	c, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: "readme", NoWebhook: true, Controllers: []string{"deployment-controller", "replicaset-controller"}})
	require.NoError(t, err)
	nd, err := c.StartNode(ctx, c.Default, testcni.NodeOptions{Kubelet: true, NoWhereabouts: true, Images: []testcni.Image{wb, wbNext}})
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
	require.NoError(t, c.EnsureNamespace(ctx, testcni.HarvesterNamespace))
	conf := fmt.Sprintf(`{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","ipam":{"type":"whereabouts","range":%q}}`, storageRange)
	_, err = c.Dynamic.Resource(testcni.NADResource).Namespace(testcni.HarvesterNamespace).Create(ctx, testcni.StorageNetworkNAD("storagenetwork-readme", conf), metav1.CreateOptions{})
	require.NoError(t, err)
	k := &kubeletNode{c: c, nd: nd, nad: "storagenetwork-readme"}
	longhorn := k.pods(t, "instance-manager", 2)
	shareManager := k.pods(t, "share-manager-pvc", 1)[0]
	imageManager := k.pods(t, "backing-image-manager-0d3c5a2e", 1)[0]
	_, err = nd.WaitPodsReady(ctx, append(append([]testcni.Pod(nil), longhorn...), shareManager, imageManager), time.Time{}, 3*time.Minute)
	require.NoError(t, err)
	wbBytes, err := os.ReadFile(rig.Tools["whereabouts-"+testcni.V093])
	require.NoError(t, err)
	at := func(name string) string {
		b, err := os.ReadFile(filepath.Join(nd.BinDir, name))
		switch {
		case os.IsNotExist(err):
			return "missing"
		case err != nil:
			return err.Error()
		case bytes.Equal(b, wbBytes):
			return "whereabouts " + testcni.V093
		}
		cmd := exec.Command(filepath.Join(nd.BinDir, name))
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		if f := strings.Fields(stderr.String()); len(f) > 1 && f[0] == "harvester-ipam" {
			return "harvester-ipam " + f[1]
		}
		return fmt.Sprintf("unknown (%d bytes)", len(b))
	}
	sh := newReadmeShell(t, c, nd)
	appVersion := chartAppVersion(t)
	sh.yours["REGISTRY"] = "localhost:5000/harvester"
	sh.yours["NODE"] = nd.Name
	sh.yours["IMAGE"] = "rancher/harvester-ipam:" + appVersion
	standing := func(what string) {
		t.Helper()
		require.Eventually(t, func() bool { return at("whereabouts") == "harvester-ipam "+appVersion }, time.Minute, 200*time.Millisecond,
			"%s: harvester-ipam stands in at the name (now %s)", what, at("whereabouts"))
		assert.Equal(t, "whereabouts "+testcni.V093, at("whereabouts.real"), "%s: the real whereabouts aside, byte for byte", what)
	}

	// Install: the image built, imported on the node with RKE2's ctr and
	// socket, the chart with its defaults.
	sh.run(blocks["image"])
	archive := filepath.Join(rig.Root, "bin", "harvester-ipam-image.tar")
	require.NoError(t, copyFileTo(archive, filepath.Join(sh.nodeDir, "harvester-ipam-image.tar")))
	sh.run(blocks["import"])
	sh.run(blocks["install"])
	standing("installed")
	sh.run(blocks["verify"])
	sh.run(blocks["inspect"])

	// Troubleshooting, each block as a row sends the operator to it.
	sh.run(blocks["node"])
	if outs := sh.out["node"]; assert.NotEmpty(t, outs) {
		assert.Contains(t, outs[0], "harvester-ipam-agent-", "the node's pods: the agent's")
		assert.Contains(t, strings.Join(outs, ""), "harvester-ipam stands in at /host/opt/cni/bin/whereabouts", "the node's installer verifies")
	}
	sh.yours["POD"] = longhorn[0].Name
	sh.run(blocks["cni-error"])
	assert.Regexp(t, `Name:\s+`+longhorn[0].Name, strings.Join(sh.out["cni-error"], ""), "the pod described, its events with it")
	sh.run(blocks["reconciler"])
	assert.Contains(t, strings.Join(sh.out["reconciler"], ""), "cronjob.batch/harvester-ipam-reconciler")
	// A pass now, in CronJob mode: a Job from the CronJob.
	sh.run(blocks["passnow"])
	sh.run(blocks["release-now"])
	sh.run(blocks["events"])

	// whereabouts' pod restarted: its install step writes the name, and
	// harvester-ipam takes it back.
	oldWB, err := c.PodOf(ctx, "kube-system", "name=whereabouts", nd.Name)
	require.NoError(t, err)
	sh.run(blocks["wb-restart"])
	require.Eventually(t, func() bool {
		p, err := c.PodOf(ctx, "kube-system", "name=whereabouts", nd.Name)
		return err == nil && p != "" && p != oldWB
	}, time.Minute, 200*time.Millisecond, "whereabouts' DaemonSet makes the node a new pod")
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
	standing("whereabouts' pod restarted")

	// A backing-image manager's new sandbox, as the README says of it: its
	// files' states read (Longhorn's CRD, the least of it: served, keeping
	// whatever an object has, and the manager's object with one file
	// ready), then the pod deleted.
	bimOut, err := sh.command(ctx, "rig", fmt.Sprintf(longhornBIM, imageManager.Name, imageManager.Namespace)).CombinedOutput()
	require.NoError(t, err, "Longhorn's BackingImageManager: %s", bimOut)
	sh.yours["POD"] = imageManager.Name
	sh.run(blocks["longhorn-restart"])
	require.Eventually(t, func() bool {
		_, err := c.Kube.CoreV1().Pods(imageManager.Namespace).Get(ctx, imageManager.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, time.Second, "the backing-image manager's pod is deleted")

	// The stand-in off: whereabouts' own bytes back, nothing aside; on again.
	sh.run(blocks["standin-off"])
	assert.Equal(t, "whereabouts "+testcni.V093, at("whereabouts"), "the stand-in off: whereabouts at its name")
	assert.Equal(t, "missing", at("whereabouts.real"))
	sh.run(blocks["standin-on"])
	standing("the stand-in on again")

	// The log level raised (the reference's blocks): the node's settings
	// written, and the next ADD logs at debug to the file, which the
	// debugging pod reads.
	sh.run(docs["loglevel"])
	settings := filepath.Join(nd.Etc, "cni", "net.d", "harvester-ipam.d", "harvester-ipam.conf")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(settings)
		return strings.Contains(string(b), `"log_level":"debug"`)
	}, time.Minute, 200*time.Millisecond, "the installer writes the node's settings")
	before := time.Now()
	live, err := nd.WaitPodsReady(ctx, longhorn, time.Time{}, time.Minute)
	require.NoError(t, err)
	for _, id := range live {
		require.NoError(t, nd.KillSandbox(ctx, id))
		break
	}
	_, err = nd.WaitPodsReady(ctx, longhorn[:1], before, 3*time.Minute)
	require.NoError(t, err)
	sh.run(docs["readlog"])
	assert.Contains(t, strings.Join(sh.out["readlog"], ""), "[debug] harvester-ipam ADD", "the debugging pod shows the plugin's debug log")

	// Monitoring on (the reconciler as a Deployment), old pools deleted.
	require.NoError(t, c.InstallMonitoringCRDs(ctx))
	require.NoError(t, c.EnsureNamespace(ctx, "cattle-dashboards"))
	sh.run(blocks["monitoring"])
	sh.run(blocks["orphaned"])
	d, err := c.Kube.AppsV1().Deployments("kube-system").Get(ctx, "harvester-ipam-reconciler", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, d.Spec.Template.Spec.Containers[0].Args, "--delete-orphaned-pools", "the reconciler deletes old pools")

	// The preflight and an upgrade.
	sh.run(blocks["preflight"])
	assert.Equal(t, "1", sh.vars["NEED"], "NEED: the number of nodes")
	sh.run(blocks["upgrade"])

	// Uninstall: the real whereabouts back at its name, nothing aside.
	sh.run(blocks["uninstall"])
	if outs := sh.out["uninstall"]; assert.NotEmpty(t, outs) {
		loop := outs[len(outs)-1]
		assert.Contains(t, loop, "node "+nd.Name+": whereabouts", "the loop over the nodes shows the node's whereabouts")
		assert.NotContains(t, loop, "whereabouts.real", "nothing aside on any node")
	}
	assert.Equal(t, "whereabouts "+testcni.V093, at("whereabouts"), "the real whereabouts back at its name")
	assert.Equal(t, "missing", at("whereabouts.real"))

	// A node down at an uninstall: installed again, the node shut down,
	// the chart uninstalled and its pod force-deleted (as the pod garbage
	// collector does for a node that is gone), the node booted. Its
	// whereabouts pod writes its binary at the name; whereabouts.real stays
	// until the give-back.
	out, err := k.helm(t, "install", "harvester-ipam", chartDir, "-n", "kube-system", "--wait", "--timeout", "3m")
	require.NoError(t, err, out)
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", "harvester-ipam", 3*time.Minute))
	_, err = nd.Shutdown(ctx, 10*time.Second)
	require.NoError(t, err)
	out, err = k.helm(t, "uninstall", "harvester-ipam", "-n", "kube-system")
	require.NoError(t, err, out)
	zero := int64(0)
	pods, err := c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=harvester-ipam"})
	require.NoError(t, err)
	for _, p := range pods.Items {
		require.NoError(t, c.Kube.CoreV1().Pods("kube-system").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	}
	require.NoError(t, nd.Boot(ctx))
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
	require.Eventually(t, func() bool { return at("whereabouts") == "whereabouts "+testcni.V093 }, 2*time.Minute, 200*time.Millisecond,
		"whereabouts' pod writes its binary at the name after the boot (now %s)", at("whereabouts"))
	require.Equal(t, "whereabouts "+testcni.V093, at("whereabouts.real"), "the missed uninstall left the real binary aside")
	sh.run(blocks["giveback"])
	assert.Equal(t, "whereabouts "+testcni.V093, at("whereabouts"))
	assert.Equal(t, "missing", at("whereabouts.real"), "the give-back removed whereabouts.real")

	// The registry path: pushed with crane, pulled by the node.
	stop, err := c.StartOnMachine("registry", rig.Tools["crane"], "registry", "serve", "--address", "127.0.0.1:5000")
	require.NoError(t, err)
	defer stop()
	sh.run(blocks["push"])
	// (Last: on this containerd 1.6, pulling by a second name the image
	// that was imported under the first made the first unknown to the CRI.)
	out, err = k.helm(t, "install", "harvester-ipam", chartDir, "-n", "kube-system",
		"--set", "image.repository="+sh.yours["REGISTRY"]+"/harvester-ipam", "--wait", "--timeout", "3m")
	require.NoError(t, err, out)
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", "harvester-ipam", 3*time.Minute))
	ref := sh.yours["REGISTRY"] + "/harvester-ipam:" + appVersion
	require.Eventually(t, func() bool {
		// The installer's and the node agent's pods run the one image: the
		// first to start pulls it, the other finds it on the node.
		pods, err := c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=harvester-ipam"})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Spec.Containers[0].Image != ref {
				continue
			}
			evs, err := c.Kube.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",reason=Pulled"})
			if err != nil {
				return false
			}
			for _, e := range evs.Items {
				if strings.Contains(e.Message, "Successfully pulled image \""+ref+"\"") {
					return true
				}
			}
		}
		return false
	}, time.Minute, time.Second, "the DaemonSets' new pods pulled %s from the registry (an event of one of them)", ref)
	standing("the image pulled from the registry")

	// A Harvester upgrade deploys whereabouts again, a newer one: each
	// node's real binary aside is then the new whereabouts, as the block
	// shows (the same sha256 twice).
	require.NoError(t, c.DeployHarvesterWhereabouts(ctx, testcni.V094))
	require.NoError(t, c.WaitRolledOut(ctx, "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute))
	nextSum := sha(t, rig.Tools["whereabouts-"+testcni.V094])
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(nd.BinDir, "whereabouts.real"))
		return err == nil && sha256.Sum256(b) == nextSum && at("whereabouts") == "harvester-ipam "+appVersion
	}, 2*time.Minute, 200*time.Millisecond, "whereabouts %s aside, harvester-ipam at the name (now %s)", testcni.V094, at("whereabouts"))
	sh.run(blocks["after-upgrade"])
	if outs := sh.out["after-upgrade"]; assert.NotEmpty(t, outs) {
		want := hex.EncodeToString(nextSum[:])[:12]
		assert.Contains(t, outs[0], "node "+nd.Name+": "+want+" "+want, "the node's whereabouts and the binary aside: the same, the new whereabouts")
	}

	for name := range blocks {
		assert.True(t, sh.ran[name], "README.md's block %s was not run", name)
	}
	for name := range docs {
		assert.True(t, sh.ran[name], "%s's block %s was not run", readmeDocs, name)
	}
}

func chartAppVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(rig.Root, chartDir, "Chart.yaml"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)`).FindSubmatch(b)
	require.NotNil(t, m)
	return string(m[1])
}

func copyFileTo(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// longCtx bounds a whole real-kubelet scenario (ctx bounds one step): its
// cluster, node, images and every step, on a machine that may be loaded.
func longCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	t.Cleanup(cancel)
	return c
}

// longhornBIM applies Longhorn's BackingImageManager CRD, the least of it, and
// a manager (name, namespace) whose one file is ready, as longhorn-manager's
// types write its status (backingImageFileMap: name, state).
const longhornBIM = `kubectl apply -f - <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: backingimagemanagers.longhorn.io}
spec:
  group: longhorn.io
  scope: Namespaced
  names: {kind: BackingImageManager, listKind: BackingImageManagerList, plural: backingimagemanagers, singular: backingimagemanager}
  versions:
  - name: v1beta2
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
EOF
kubectl wait --for condition=established --timeout=60s crd/backingimagemanagers.longhorn.io
kubectl apply -f - <<'EOF'
apiVersion: longhorn.io/v1beta2
kind: BackingImageManager
metadata: {name: %s, namespace: %s}
status:
  currentState: running
  backingImageFileMap:
    default-image-x7k2p: {name: default-image-x7k2p, state: ready, size: 1073741824}
EOF
`
