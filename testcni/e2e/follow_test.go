package e2e

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/testcni"
)

// Harvester's storage-network and RWX-network NAD labels.
const (
	storageLabel = "storage-network.settings.harvesterhci.io/hash"
	rwxLabel     = "rwx-network.settings.harvesterhci.io/hash"
)

// harvesterNAD is a storage-network NAD's config as Harvester's bridge
// template writes it, with its ipam.type.
func harvesterNAD(ipamType string, vlan int) string {
	return fmt.Sprintf(`{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":%d,"ipam":{"type":"%s","range":"192.168.%d.0/24","exclude":["192.168.%d.1/32","192.168.%d.2/32"]}}`,
		vlan, ipamType, vlan, vlan, vlan)
}

// settingHash is the label value Harvester writes: the sha1 of the setting's value.
func settingHash(value string) string {
	h := sha1.Sum([]byte(value))
	return hex.EncodeToString(h[:])
}

var followNS atomic.Int32

// followNamespace is a NAD namespace of the test's own, standing for harvester-system.
func followNamespace(t *testing.T) string {
	t.Helper()
	ensureNADCRD(t)
	ns := fmt.Sprintf("harvester-system-f%d", followNS.Add(1))
	require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
	return ns
}

func ensureNADCRD(t *testing.T) {
	t.Helper()
	nadCRD.Do(func() { nadCRD.err = rig.InstallNADCRD(ctx(t)) })
	require.NoError(t, nadCRD.err, "the NetworkAttachmentDefinition CRD")
}

func createNAD(t *testing.T, ns, name string, labels map[string]string, config string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"config": config},
	}}
	obj.SetLabels(labels)
	out, err := rig.Dynamic.Resource(testcni.NADResource).Namespace(ns).Create(ctx(t), obj, metav1.CreateOptions{})
	require.NoError(t, err, "create NAD %s/%s", ns, name)
	// The rig has no namespace controller: a NAD outlives its namespace, and
	// every reconciler pass of every later test would read it.
	t.Cleanup(func() {
		err := rig.Dynamic.Resource(testcni.NADResource).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete NAD %s/%s: %v", ns, name, err)
		}
	})
	return out
}

func getNAD(t *testing.T, ns, name string) (config, resourceVersion string) {
	t.Helper()
	o, err := rig.Dynamic.Resource(testcni.NADResource).Namespace(ns).Get(ctx(t), name, metav1.GetOptions{})
	require.NoError(t, err)
	c, _, err := unstructured.NestedString(o.Object, "spec", "config")
	require.NoError(t, err)
	return c, o.GetResourceVersion()
}

// waitConfig waits until the NAD's config is want, byte for byte.
func waitConfig(t *testing.T, ns, name, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _ := getNAD(t, ns, name)
		if got == want {
			return
		}
		require.True(t, time.Now().Before(deadline), "NAD %s/%s after 30 s:\n  %s\nwant\n  %s", ns, name, got, want)
		time.Sleep(50 * time.Millisecond)
	}
}

// nadEvents are the Events recorded on a NAD, as `kubectl describe` lists them.
func nadEvents(t *testing.T, ns, name string) []corev1.Event {
	t.Helper()
	l, err := rig.Kube.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	require.NoError(t, err)
	return l.Items
}

// eventWith waits for the Event with that reason on a NAD: the follower
// records it just after its write, so it may follow the config by a moment.
func eventWith(t *testing.T, ns, name, reason string) *corev1.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found []string
		for _, e := range nadEvents(t, ns, name) {
			if e.Reason == reason && e.InvolvedObject.Kind == "NetworkAttachmentDefinition" {
				return &e
			}
			found = append(found, e.Reason)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on NAD %s/%s after 10 s; it has %v", reason, ns, name, found)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// follower is harvester-ipam-reconciler running as the chart's Deployment
// runs it, with the follower on.
type follower struct {
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan error
}

var followPools atomic.Int32

// startFollower runs the rig's reconciler binary in loop mode with args (the
// NAD flags); its passes look at an empty pool namespace of their own, in a
// dry run, so that they touch nothing of other tests.
func startFollower(t *testing.T, kubeconfig string, args ...string) *follower {
	t.Helper()
	pools := fmt.Sprintf("follow-pools-%d", followPools.Add(1))
	require.NoError(t, rig.EnsureNamespace(ctx(t), pools))
	base := []string{"--kubeconfig=" + kubeconfig, "--namespace=" + pools, "--dry-run", "--interval=1h", "--metrics-addr="}
	f := &follower{cmd: exec.Command(rig.ReconcilerBinary(), append(base, args...)...), logs: &syncBuffer{}, done: make(chan error, 1)}
	f.cmd.Stdout, f.cmd.Stderr = f.logs, f.logs
	require.NoError(t, f.cmd.Start())
	go func() { f.done <- f.cmd.Wait() }()
	t.Cleanup(func() {
		if f.cmd.ProcessState == nil {
			_ = f.cmd.Process.Kill()
			<-f.done
		}
	})
	return f
}

// stop sends SIGTERM, as the kubelet does, and wants a clean exit.
func (f *follower) stop(t *testing.T) string {
	t.Helper()
	require.NoError(t, f.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-f.done:
		require.NoError(t, err, "the follower's exit on SIGTERM:\n%s", f.logs.String())
	case <-time.After(10 * time.Second):
		_ = f.cmd.Process.Kill()
		t.Fatalf("the follower did not exit on SIGTERM:\n%s", f.logs.String())
	}
	return f.logs.String()
}

// unfollow runs `harvester-ipam-reconciler unfollow` with args.
func unfollow(t *testing.T, kubeconfig string, args ...string) run {
	t.Helper()
	cmd := exec.Command(rig.ReconcilerBinary(), append([]string{"unfollow", "--kubeconfig=" + kubeconfig}, args...)...)
	var out, errb syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := run{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.exit = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return r
}

// The follower, on NADs labelled and shaped as Harvester writes them: a
// storage-network NAD there before it starts and one that appears later are
// switched to harvester-ipam, each with an Event, every other byte kept; so
// is an RWX-network NAD. A NAD already switched, a NAD of another network
// (no label) and a NAD of another IPAM are not written at all
// (resourceVersion unchanged); a labelled NAD whose config does not parse,
// or has no ipam, is left alone with a Warning Event. `unfollow` then switches
// every followed NAD back, byte for byte, and leaves the others alone.
//
// Not parallel: while its NAD that does not parse exists, a reconciler
// cannot know the NADs (any NAD may name a pool), and the tests that run
// one assert on what the NADs say.
func TestFollowerSwitchesHarvesterNADs(t *testing.T) {
	ns := followNamespace(t)
	storage := map[string]string{storageLabel: settingHash(`{"vlan":50,"clusterNetwork":"mgmt","range":"192.168.50.0/24"}`)}
	// Harvester's NAD as it really comes: the bridge template, whitespace
	// and key order of its own; the follower must keep all of it.
	oddTmpl := "{\n  \"cniVersion\": \"0.3.1\",\n  \"ipam\": {\"exclude\": [\"10.9.0.1/32\"],  \"type\" :  \"%s\",\n \"range\": \"10.9.0.0/24\"},\n  \"type\": \"bridge\", \"bridge\": \"mgmt-br\"\n}\n"
	odd := func(typ string) string { return strings.Replace(oddTmpl, "%s", typ, 1) }

	createNAD(t, ns, "storagenetwork-old", storage, harvesterNAD("whereabouts", 50))
	createNAD(t, ns, "storagenetwork-odd", storage, odd("whereabouts"))
	already := createNAD(t, ns, "storagenetwork-done", storage, harvesterNAD("harvester-ipam", 51))
	other := createNAD(t, ns, "vm-network", map[string]string{"network.harvesterhci.io/type": "L2VlanNetwork"}, harvesterNAD("whereabouts", 52))
	hostLocal := createNAD(t, ns, "storagenetwork-hostlocal", storage, `{"cniVersion":"0.3.1","type":"bridge","ipam":{"type":"host-local","subnet":"10.8.0.0/24"}}`)
	createNAD(t, ns, "storagenetwork-broken", storage, `{"cniVersion":"0.3.1","type":"bridge","ipam":{"type":"whereabouts"`)
	createNAD(t, ns, "storagenetwork-noipam", storage, `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br"}`)

	f := startFollower(t, rig.Kubeconfig, "--follow-nads", "--nad-namespace="+ns)
	waitConfig(t, ns, "storagenetwork-old", harvesterNAD("harvester-ipam", 50))
	waitConfig(t, ns, "storagenetwork-odd", odd("harvester-ipam"))

	// Harvester creates a new NAD for a new value of the setting; and the RWX network's.
	createNAD(t, ns, "storagenetwork-new", map[string]string{storageLabel: settingHash("new")}, harvesterNAD("whereabouts", 60))
	createNAD(t, ns, "rwxnetwork-1", map[string]string{rwxLabel: settingHash("rwx")}, harvesterNAD("whereabouts", 70))
	waitConfig(t, ns, "storagenetwork-new", harvesterNAD("harvester-ipam", 60))
	waitConfig(t, ns, "rwxnetwork-1", harvesterNAD("harvester-ipam", 70))

	for _, name := range []string{"storagenetwork-old", "storagenetwork-odd", "storagenetwork-new", "rwxnetwork-1"} {
		e := eventWith(t, ns, name, "SwitchedToHarvesterIPAM")
		assert.Equal(t, corev1.EventTypeNormal, e.Type)
		assert.Contains(t, e.Message, `ipam.type "whereabouts" -> "harvester-ipam"`)
		assert.Equal(t, "harvester-ipam-follower", e.Source.Component)
	}
	// The NADs that fail to parse were seen (they were listed before the
	// ones created later were switched): a Warning each, saying why.
	assert.Contains(t, eventWith(t, ns, "storagenetwork-broken", "NotSwitched").Message, "not JSON")
	assert.Contains(t, eventWith(t, ns, "storagenetwork-noipam", "NotSwitched").Message, `no "ipam"`)
	assert.Equal(t, corev1.EventTypeWarning, eventWith(t, ns, "storagenetwork-noipam", "NotSwitched").Type)
	for _, o := range []*unstructured.Unstructured{already, other, hostLocal} {
		_, rv := getNAD(t, ns, o.GetName())
		assert.Equal(t, o.GetResourceVersion(), rv, "NAD %s not written", o.GetName())
		assert.Empty(t, nadEvents(t, ns, o.GetName()), "no Event on %s", o.GetName())
	}
	c, _ := getNAD(t, ns, "vm-network")
	assert.Equal(t, harvesterNAD("whereabouts", 52), c)
	c, _ = getNAD(t, ns, "storagenetwork-broken")
	assert.Equal(t, `{"cniVersion":"0.3.1","type":"bridge","ipam":{"type":"whereabouts"`, c)

	logs := f.stop(t)
	t.Logf("follower:\n%s", logs)
	assert.Contains(t, logs, fmt.Sprintf(`following NADs in namespace %s matching "%s" or "%s"`, ns, storageLabel, rwxLabel))
	assert.Contains(t, logs, "NAD "+ns+"/storagenetwork-noipam left alone")
	assert.Equal(t, 1, strings.Count(logs, "storagenetwork-noipam left alone"), "warned once")

	// Uninstall: every followed NAD back, byte for byte.
	r := unfollow(t, rig.Kubeconfig, "--nad-namespace="+ns)
	t.Logf("unfollow:\n%s%s", r.stdout, r.stderr)
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stdout, ns+`/storagenetwork-new: ipam.type "harvester-ipam" -> "whereabouts"`)
	assert.Contains(t, r.stdout, "unfollow: 5 NADs switched back to whereabouts, 3 left as they were")
	for name, want := range map[string]string{
		"storagenetwork-old": harvesterNAD("whereabouts", 50), "storagenetwork-odd": odd("whereabouts"),
		"storagenetwork-new": harvesterNAD("whereabouts", 60), "rwxnetwork-1": harvesterNAD("whereabouts", 70),
		// It was harvester-ipam before the follower: it is followed, so it goes back too.
		"storagenetwork-done": harvesterNAD("whereabouts", 51),
	} {
		c, _ := getNAD(t, ns, name)
		assert.Equal(t, want, c, "NAD %s back to whereabouts, byte for byte", name)
		assert.Contains(t, eventWith(t, ns, name, "SwitchedToWhereabouts").Message, `ipam.type "harvester-ipam" -> "whereabouts"`)
	}
	_, rv := getNAD(t, ns, "vm-network")
	assert.Equal(t, other.GetResourceVersion(), rv, "the other network's NAD never written")

	// Again: nothing left to switch.
	r = unfollow(t, rig.Kubeconfig, "--nad-namespace="+ns)
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stdout, "unfollow: 0 NADs switched back to whereabouts, 8 left as they were")
}

// The follower runs beside the loop only; a bad selector is refused before
// anything runs; unfollow fails, exit 1, naming each NAD it could not switch.
func TestFollowerRefusalsAndUnfollowFailure(t *testing.T) {
	t.Parallel()
	ns := followNamespace(t)
	rec := func(args ...string) run {
		cmd := exec.Command(rig.ReconcilerBinary(), args...)
		out, err := cmd.CombinedOutput()
		r := run{stderr: string(out)}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			r.exit = ee.ExitCode()
		}
		return r
	}
	r := rec("--kubeconfig="+rig.Kubeconfig, "--follow-nads", "--interval=0")
	assert.Equal(t, 2, r.exit)
	assert.Contains(t, r.stderr, "--follow-nads runs beside the loop: give --interval a duration above 0 (a Deployment, not a CronJob)")
	r = rec("--kubeconfig="+rig.Kubeconfig, "--follow-nads", "--interval=1m", "--nad-selector=")
	assert.Equal(t, 2, r.exit)
	assert.Contains(t, r.stderr, `NAD selector "" matches every NAD: name a label`)
	r = rec("unfollow", "--kubeconfig="+rig.Kubeconfig, "--stop-deployment=nope")
	assert.Equal(t, 2, r.exit)
	assert.Contains(t, r.stderr, `--stop-deployment="nope": want NAMESPACE/NAME`)

	// An identity that may read the NADs but not write them.
	labels := map[string]string{storageLabel: settingHash(ns)}
	createNAD(t, ns, "storagenetwork-a", labels, harvesterNAD("harvester-ipam", 80))
	createNAD(t, ns, "storagenetwork-b", labels, harvesterNAD("harvester-ipam", 81))
	createNAD(t, ns, "storagenetwork-c", labels, harvesterNAD("whereabouts", 82))
	_, err := rig.Kube.RbacV1().Roles(ns).Create(ctx(t), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "nad-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"k8s.cni.cncf.io"}, Resources: []string{"network-attachment-definitions"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rig.Kube.RbacV1().RoleBindings(ns).Create(ctx(t), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nad-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "nad-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "nad-reader", Namespace: ns}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	kc := saKubeconfig(t, ns, "nad-reader")
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = unfollow(t, kc, "--nad-namespace="+ns)
		if !strings.Contains(r.stderr, "list NADs") || time.Now().After(deadline) { // RBAC seen by the authorizer
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("unfollow as nad-reader:\n%s%s", r.stdout, r.stderr)
	assert.Equal(t, 1, r.exit)
	assert.Contains(t, r.stderr, "unfollow: 2 of 3 NADs not switched back to whereabouts")
	for _, n := range []string{"storagenetwork-a", "storagenetwork-b"} {
		assert.Contains(t, r.stderr, fmt.Sprintf("switch ipam.type of NAD %s/%s from harvester-ipam to whereabouts: ", ns, n))
		c, _ := getNAD(t, ns, n)
		assert.Contains(t, c, `"type":"harvester-ipam"`, "unchanged")
	}
	assert.Contains(t, r.stderr, `cannot update resource "network-attachment-definitions"`)
	assert.Contains(t, r.stdout, ns+`/storagenetwork-c: ipam.type is "whereabouts"; left alone`)

	// No identity at all for NADs: the list fails, exit 1.
	r = unfollow(t, saKubeconfig(t, ns, "nobody"), "--nad-namespace="+ns)
	assert.Equal(t, 1, r.exit)
	assert.Contains(t, r.stderr, "unfollow: list NADs in namespace "+ns)
	assert.Contains(t, r.stderr, "forbidden")
}

// saKubeconfig writes a kubeconfig that logs in as ns/name.
func saKubeconfig(t *testing.T, ns, name string) string {
	t.Helper()
	b, err := rig.ServiceAccountKubeconfig(ctx(t), ns, name)
	require.NoError(t, err)
	loggedIn(t, b)
	p := t.TempDir() + "/kubeconfig"
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// A NAD the follower switched is really used: a pod attached through Multus
// to that NAD goes through harvester-ipam (Multus hands it the NAD's config),
// so a sandbox recreated without DEL leaves the pod one address, on every
// whereabouts version (v0.7.0 alone would hold two), and DEL releases it.
// Uninstalled, the NAD is Harvester's again byte for byte, and new sandboxes
// get whereabouts.
func TestFollowedNADServesMultus(t *testing.T) {
	onEachDelegate(t, testFollowedNADServesMultus)
}

func testFollowedNADServesMultus(t *testing.T, e *env) {
	m := e.multusNet(t, "whereabouts")
	original, _ := getNAD(t, m.NADNamespace, m.NADName)
	require.Contains(t, original, `"type":"whereabouts"`)
	// Harvester's label, with a value of this test's own: the followers of
	// the other delegates' runs, in the same namespace, leave it alone.
	hash := settingHash(m.NADName + e.WB)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, storageLabel, hash)
	_, err := rig.Dynamic.Resource(testcni.NADResource).Namespace(m.NADNamespace).Patch(ctx(t), m.NADName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)

	selector := storageLabel + "=" + hash
	f := startFollower(t, rig.Kubeconfig, "--follow-nads", "--nad-namespace="+m.NADNamespace, "--nad-selector="+selector)
	switched := strings.Replace(original, `"type":"whereabouts"`, `"type":"harvester-ipam"`, 1)
	waitConfig(t, m.NADNamespace, m.NADName, switched)
	eventWith(t, m.NADNamespace, m.NADName, "SwitchedToHarvesterIPAM")

	pod := multusPod(t, m, "instance-manager")
	s1, ip1 := multusAdd(t, m, pod)
	holds(t, m, pod, s1, ip1)
	assert.Contains(t, m.Log(), `"type":"harvester-ipam"`, "Multus delegated to harvester-ipam")
	require.NoError(t, s1.Kill(), "the sandbox dies without DEL")
	s2, ip2 := multusAdd(t, m, pod)
	holds(t, m, pod, s2, ip2)
	require.NoError(t, s2.Del(ctx(t)))
	released(t, m, pod)

	f.stop(t)
	r := unfollow(t, rig.Kubeconfig, "--nad-namespace="+m.NADNamespace, "--nad-selector="+selector)
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stdout, "unfollow: 1 NADs switched back to whereabouts, 0 left as they were")
	back, _ := getNAD(t, m.NADNamespace, m.NADName)
	assert.Equal(t, original, back, "byte for byte as before")
	s3, ip3 := multusAdd(t, m, pod)
	holds(t, m, pod, s3, ip3)
	require.NoError(t, s3.Del(ctx(t)))
	released(t, m, pod)
}

// The chart with the follower on: the Deployment's arguments and the
// pre-delete hook's, and the RBAC of each, applied for real. The follower,
// run with the Deployment's rendered arguments as the reconciler's
// ServiceAccount, switches a new storage-network NAD; the hook Job's command,
// run as its own ServiceAccount, stops the Deployment (replicas 0) and
// switches the NAD back.
func TestChartFollowerAndUnfollowHook(t *testing.T) {
	t.Parallel()
	const release = "follow-chart"
	nadNS := followNamespace(t)
	// Namespaces of this run's own (the rig may serve -count=N runs).
	relNS, pools := "harvester-ipam-"+nadNS, "pools-"+nadNS
	require.NoError(t, rig.EnsureNamespace(ctx(t), relNS))
	require.NoError(t, rig.EnsureNamespace(ctx(t), pools))
	manifest := render(t, release, relNS, "reconciler.mode=deployment", "reconciler.dryRun=true", "whereabouts.poolNamespace="+pools,
		"follower.enabled=true", "follower.namespace="+nadNS)
	objs := objects(t, manifest)
	require.NoError(t, rig.Apply(ctx(t), manifest, false), "the chart with the follower, applied")

	var dep, job corev1.Container
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			require.NoError(t, fromUnstructured(c[0], &dep))
		case "Job":
			c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			require.NoError(t, fromUnstructured(c[0], &job))
		}
	}
	require.Equal(t, []string{"/usr/bin/harvester-ipam-reconciler"}, job.Command)
	require.Equal(t, []string{"unfollow", "--nad-namespace=" + nadNS,
		"--nad-selector=" + storageLabel, "--nad-selector=" + rwxLabel,
		"--stop-deployment=" + relNS + "/" + release + "-harvester-ipam-reconciler"}, job.Args)

	createNAD(t, nadNS, "storagenetwork-chart", map[string]string{storageLabel: settingHash("chart")}, harvesterNAD("whereabouts", 90))

	// The Deployment's container, as the reconciler's ServiceAccount. Its
	// args are the rendered ones but --metrics-addr (tests run side by side).
	reconcilerKC := saKubeconfig(t, relNS, release+"-harvester-ipam-reconciler")
	var args []string
	for _, a := range dep.Args {
		if !strings.HasPrefix(a, "--metrics-addr=") {
			args = append(args, a)
		}
	}
	require.Contains(t, args, "--follow-nads")
	cmd := exec.Command(rig.ReconcilerBinary(), append([]string{"--kubeconfig=" + reconcilerKC, "--metrics-addr="}, args...)...)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitConfig(t, nadNS, "storagenetwork-chart", harvesterNAD("harvester-ipam", 90))
	eventWith(t, nadNS, "storagenetwork-chart", "SwitchedToHarvesterIPAM")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-done)
	assert.NotContains(t, logs.String(), "forbidden", "the chart's RBAC is enough:\n%s", logs.String())

	// The hook Job's container, as the hook's ServiceAccount. The
	// Deployment's pod (no kubelet runs here: an object with its labels) is
	// still terminating for a while: the switch back waits until it is gone.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: release + "-harvester-ipam-reconciler-abc12", Namespace: relNS, Labels: map[string]string{
			"app.kubernetes.io/name": "harvester-ipam", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "reconciler"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "reconcile", Image: "rancher/harvester-ipam"}}},
	}
	_, err := rig.Kube.CoreV1().Pods(relNS).Create(ctx(t), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	var podGone atomic.Int64
	go func() {
		time.Sleep(2 * time.Second)
		podGone.Store(time.Now().UnixNano())
		_ = rig.Kube.CoreV1().Pods(relNS).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}()
	hookKC := saKubeconfig(t, relNS, release+"-harvester-ipam-unfollow")
	start := time.Now()
	r := unfollow(t, hookKC, job.Args[1:]...)
	t.Logf("the hook Job, %s:\n%s%s", time.Since(start).Round(time.Millisecond), r.stdout, r.stderr)
	require.Equal(t, 0, r.exit, r.stderr)
	ev := eventWith(t, nadNS, "storagenetwork-chart", "SwitchedToWhereabouts")
	require.NotZero(t, podGone.Load())
	// Events have whole seconds.
	assert.False(t, ev.FirstTimestamp.Time.Before(time.Unix(0, podGone.Load()).Truncate(time.Second)), "switched back only once the follower's pod was gone")
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "it waited for the pod")
	assert.Contains(t, r.stderr, "deployment "+relNS+"/"+release+"-harvester-ipam-reconciler scaled to 0")
	scale, err := rig.Kube.AppsV1().Deployments(relNS).GetScale(ctx(t), release+"-harvester-ipam-reconciler", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(0), scale.Spec.Replicas, "the follower is stopped first")
	c, _ := getNAD(t, nadNS, "storagenetwork-chart")
	assert.Equal(t, harvesterNAD("whereabouts", 90), c)
	eventWith(t, nadNS, "storagenetwork-chart", "SwitchedToWhereabouts")

	// A second uninstall attempt (the Deployment already gone) still works.
	require.NoError(t, rig.Kube.AppsV1().Deployments(relNS).Delete(ctx(t), release+"-harvester-ipam-reconciler", metav1.DeleteOptions{}))
	r = unfollow(t, hookKC, job.Args[1:]...)
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stderr, "not found: no follower to stop")
}

func fromUnstructured(in any, out any) error {
	m, ok := in.(map[string]any)
	if !ok {
		return fmt.Errorf("not an object: %T", in)
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, out)
}
