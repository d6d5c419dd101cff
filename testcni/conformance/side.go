package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/harvester/harvester-ipam/testcni"
)

// Side is who serves the NADs that name whereabouts in a cluster.
type Side string

const (
	// Baseline is whereabouts alone, deployed as Harvester deploys it.
	Baseline Side = "baseline"
	// ExecPath is harvester-ipam standing in by the chart, its node agent
	// off: every verb is the plugin's own.
	ExecPath Side = "exec path"
	// Agent is the chart as it installs by default: the node agent serves.
	Agent Side = "agent"
)

// Sides are the three, in the table's order.
var Sides = []Side{Baseline, ExecPath, Agent}

// TestImage is the image whereabouts' suites run their pods from; the rig's
// own busybox image is imported under its name (nothing is pulled).
const TestImage = "quay.io/dougbtv/alpine:latest"

// chartTag is the tag of the chart's image the harvester-ipam sides run,
// built from this tree.
const chartTag = "v0.0.0-conformance"

// mirrorPort is where the machine's mirror of quay.io listens.
const mirrorPort = 5000

// controllers are the controller manager's controllers whereabouts' suites
// need beyond the rig's: they scale ReplicaSets and StatefulSets and wait
// for the reconciler's and the node-slice controller's Deployments; the
// chart's reconciler runs as its CronJob.
var controllers = []string{"deployment-controller", "replicaset-controller", "statefulset-controller", "cronjob-controller"}

// nodeSliceRBAC grants Harvester's whereabouts ServiceAccount what
// whereabouts' own ClusterRole (doc/crds/daemonset-install.yaml) grants and
// Harvester's lacks: its NodeSlicePools. Without it, whereabouts alone
// fails every ADD of a node_slice_size network on Harvester's RBAC
// ("nodeslicepools ... is forbidden: User
// system:serviceaccount:kube-system:harvester-whereabouts"): the rig's, not
// the product's, so the rig grants it, on every side alike.
const nodeSliceRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: harvester-whereabouts-nodeslicepools
rules:
- apiGroups: [whereabouts.cni.cncf.io]
  resources: [nodeslicepools]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: harvester-whereabouts-nodeslicepools
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: harvester-whereabouts-nodeslicepools}
subjects:
- {kind: ServiceAccount, name: harvester-whereabouts, namespace: kube-system}
`

// Cluster is one side's cluster, ready for a suite.
type Cluster struct {
	Side    Side
	Version string
	Rig     *testcni.Rig
	Node    *testcni.Node
	chart   [32]byte // the sha256 of the chart's harvester-ipam binary
}

// Env is what the suite's binary reads: the cluster's kubeconfig and its
// size (one compute node; whereabouts' own CI fills 20% of its capacity in
// the ReplicaSet spec, as here).
func (c *Cluster) Env() []string {
	return []string{
		"KUBECONFIG=" + c.Rig.Kubeconfig,
		"NUMBER_OF_COMPUTE_NODES=1",
		"FILL_PERCENT_CAPACITY=20",
		"NUMBER_OF_THRASH_ITER=1",
	}
}

// Up starts side's cluster for whereabouts version: a cluster of the rig's
// own with one node and its kubelet (containerd, runc, Multus; the macvlan
// plugin whereabouts' suites attach with, whose master eth0 is the node's),
// whereabouts' DaemonSet as Harvester deploys it, whereabouts' own
// controllers its suites look for (the reconciler's Deployment from v0.9.4,
// the node-slice controller's) with whereabouts' own RBAC, and on the
// harvester-ipam sides the chart, standing in.
func Up(ctx context.Context, rig *testcni.Rig, name string, side Side, version string) (_ *Cluster, err error) {
	manifests := rig.Tools["whereabouts-manifests-"+version]
	if _, err := os.Stat(filepath.Join(manifests, "daemonset-install.yaml")); err != nil {
		return nil, fmt.Errorf("whereabouts %s's manifests (testcni/tools.sh conformance-%s copies them): %w", version, version, err)
	}
	type built struct {
		img testcni.Image
		err error
	}
	wants := []func() (testcni.Image, error){
		func() (testcni.Image, error) { return rig.WhereaboutsImage(ctx, version) },
		func() (testcni.Image, error) { return rig.BusyboxImage(ctx, TestImage) },
	}
	if side != Baseline {
		wants = append(wants, func() (testcni.Image, error) { return rig.ChartImage(ctx, chartTag) })
	}
	images := make(chan built, len(wants))
	for _, w := range wants {
		go func() { img, err := w(); images <- built{img, err} }()
	}
	rc, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: name, NoWebhook: true, Controllers: controllers})
	var imgs []testcni.Image
	var errs []error
	for range wants {
		b := <-images
		imgs = append(imgs, b.img)
		if b.err != nil {
			errs = append(errs, b.err)
		}
	}
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: the images: %v", name, errs)
	}
	c := &Cluster{Side: side, Version: version, Rig: rc}
	if err := c.applyFile(ctx, manifests, "whereabouts.cni.cncf.io_nodeslicepools.yaml", nil); err != nil {
		return nil, err
	}
	// The suite's pods run a latest tag, which the kubelet pulls at every
	// start: from a mirror of quay.io on the machine.
	mirror, _, err := rc.StartMirror(mirrorPort)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, img := range imgs {
		if img.Ref == TestImage {
			if err := mirror.Push(ctx, img); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	mirrors := map[string]string{strings.SplitN(TestImage, "/", 2)[0]: mirror.Endpoint}
	if c.Node, err = rc.StartNode(ctx, rc.Default, testcni.NodeOptions{Kubelet: true, NoWhereabouts: true, Images: imgs, Mirrors: mirrors}); err != nil {
		return nil, fmt.Errorf("%s: start its node: %w", name, err)
	}
	if err := rc.DeployHarvesterWhereabouts(ctx, version); err != nil {
		return nil, err
	}
	if err := rc.WaitRolledOut(ctx, "kube-system", testcni.HarvesterWhereabouts, 3*time.Minute); err != nil {
		return nil, err
	}
	wb, err := os.ReadFile(rig.Tools["whereabouts-"+version])
	if err != nil {
		return nil, err
	}
	if err := c.waitName(ctx, sha256.Sum256(wb), "whereabouts "+version); err != nil {
		return nil, err
	}
	if err := rc.Apply(ctx, []byte(nodeSliceRBAC), false); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := c.deployControllers(ctx, manifests); err != nil {
		return nil, err
	}
	if side == Baseline {
		return c, nil
	}
	bin, err := os.ReadFile(rig.ChartBinary(chartTag, "harvester-ipam"))
	if err != nil {
		return nil, err
	}
	c.chart = sha256.Sum256(bin)
	args := []string{"install", "harvester-ipam", filepath.Join(rig.Root, "install/chart/harvester-ipam"),
		"--namespace", "kube-system", "--set", "image.tag=" + chartTag, "--wait", "--timeout", "5m", "--kubeconfig", rc.Kubeconfig}
	if side == ExecPath {
		args = append(args, "--set", "agent.enabled=false")
	}
	hctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	if out, err := rc.Helm(hctx, args...); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", name, err, out)
	}
	if err := c.waitName(ctx, c.chart, "harvester-ipam "+chartTag); err != nil {
		return nil, err
	}
	return c, nil
}

// StandsIn says whether harvester-ipam is still at whereabouts' name on the
// node (a harvester-ipam side that lost the name would be testing
// whereabouts alone).
func (c *Cluster) StandsIn() (bool, error) {
	b, err := os.ReadFile(filepath.Join(c.Node.BinDir, "whereabouts"))
	if err != nil {
		return false, err
	}
	return sha256.Sum256(b) == c.chart, nil
}

// Served counts the attachments harvester-ipam served on the node (its
// checkpoints, one an attachment it served, kept until its DEL: so this
// is a lower bound) and the verbs its node agent logged it served.
func (c *Cluster) Served() (checkpoints, byAgent int) {
	ents, _ := os.ReadDir(filepath.Join(c.Node.VarLibCNI, "harvester-ipam"))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			checkpoints++
		}
	}
	logs, _ := filepath.Glob(filepath.Join(c.Node.VarLog, "pods", "kube-system_harvester-ipam-agent-*", "agent", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		byAgent += bytes.Count(b, []byte(": served in "))
	}
	return checkpoints, byAgent
}

// waitName waits until the node's whereabouts name holds the binary whose
// sha256 is want.
func (c *Cluster) waitName(ctx context.Context, want [32]byte, what string) error {
	path := filepath.Join(c.Node.BinDir, "whereabouts")
	var now string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			now = err.Error()
			return false, nil
		}
		now = fmt.Sprintf("%d bytes, another binary", len(b))
		return sha256.Sum256(b) == want, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %s never came to %s (%s): %w", c.Rig.Kubeconfig, path, what, now, err)
	}
	return nil
}

// deployControllers applies whereabouts' own ServiceAccount, ClusterRole
// and binding (its daemonset-install.yaml's, which its Deployments run as),
// its reconciler's Deployment where the version has one, and its node-slice
// controller's, each on whereabouts' image of the version, and waits until
// each has an available replica.
func (c *Cluster) deployControllers(ctx context.Context, manifests string) error {
	ds, err := os.ReadFile(filepath.Join(manifests, "daemonset-install.yaml"))
	if err != nil {
		return err
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		doc, err := testcni.PickDoc(ds, kind, "")
		if err != nil {
			return fmt.Errorf("whereabouts %s's daemonset-install.yaml: %w", c.Version, err)
		}
		if err := c.Rig.Apply(ctx, doc, false); err != nil {
			return fmt.Errorf("whereabouts %s's %s: %w", c.Version, kind, err)
		}
	}
	image := testcni.WhereaboutsImageRef(c.Version)
	deploys := map[string]string{"node-slice-controller.yaml": "whereabouts-controller"}
	if _, err := os.Stat(filepath.Join(manifests, "reconciler-deployment.yaml")); err == nil {
		deploys["reconciler-deployment.yaml"] = "whereabouts-reconciler"
	}
	for file := range deploys {
		if err := c.applyFile(ctx, manifests, file, func(b []byte) []byte {
			// Its image is whereabouts' of the version, on the node already.
			return bytes.ReplaceAll(b, []byte("ghcr.io/k8snetworkplumbingwg/whereabouts:latest"), []byte(image))
		}); err != nil {
			return err
		}
	}
	for _, name := range deploys {
		if err := c.waitAvailable(ctx, "kube-system", name); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) applyFile(ctx context.Context, dir, file string, edit func([]byte) []byte) error {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("whereabouts %s's %s: %w", c.Version, file, err)
	}
	if edit != nil {
		b = edit(b)
	}
	if err := c.Rig.Apply(ctx, b, false); err != nil {
		return fmt.Errorf("whereabouts %s's %s: %w", c.Version, file, err)
	}
	return nil
}

func (c *Cluster) waitAvailable(ctx context.Context, namespace, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		d, err := c.Rig.Kube.AppsV1().Deployments(namespace).Get(cctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d of %d available", d.Status.AvailableReplicas, replicas(d))
		return d.Status.AvailableReplicas >= replicas(d), nil
	})
	if err != nil {
		return fmt.Errorf("deployment %s/%s not available: %s: %w", namespace, name, last, err)
	}
	return nil
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// suiteNamespaces are where whereabouts' suites make their objects: its e2e
// suite in default, its node-slice suite in kube-system.
var suiteNamespaces = []string{"default", "kube-system"}

// Clean deletes what a spec of whereabouts' suites made and left (a spec
// that fails before its AfterEach, or whose AfterEach fails, leaves its
// pods, sets and networks), so that the next spec starts where the suite's
// own cleanup would have left it: the StatefulSets and ReplicaSets its
// entities name, the pods its specs label (tier, app=web), every NAD. Its
// pods go as any pod goes, their DELs run; what they leave in the pools is
// left, for the next spec to meet: a leak is a finding, not the harness's
// to clean. It waits until those pods are gone.
func (c *Cluster) Clean(ctx context.Context) error {
	kube := c.Rig.Kube
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	now := int64(0)
	fg := metav1.DeletePropagationForeground
	del := metav1.DeleteOptions{GracePeriodSeconds: &now, PropagationPolicy: &fg}
	var errs []error
	for _, ns := range suiteNamespaces {
		for _, sts := range []string{"web"} {
			if err := kube.AppsV1().StatefulSets(ns).Delete(ctx, sts, del); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
		if err := kube.AppsV1().ReplicaSets(ns).Delete(ctx, "whereabouts-scale-test", del); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		for _, sel := range suitePods {
			if err := kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{LabelSelector: sel}); err != nil {
				errs = append(errs, err)
			}
		}
		if err := c.Rig.Dynamic.Resource(testcni.NADResource).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("clean up after a spec: %v", errs)
	}
	var left []string
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		left = left[:0]
		for _, ns := range suiteNamespaces {
			for _, sel := range suitePods {
				pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
				if err != nil {
					return false, nil
				}
				for _, p := range pods.Items {
					left = append(left, ns+"/"+p.Name)
				}
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("clean up after a spec: pods %v not gone: %w", left, err)
	}
	return nil
}

// suitePods select the pods whereabouts' suites make: ProvisionPod's and
// the ReplicaSets' tier label (but tier=node, whereabouts' reconciler's own),
// the StatefulSets' app=web.
var suitePods = []string{"tier,tier!=node", "app=web"}

// DumpPools writes every IPPool's entries in the suites' namespaces to
// path, one line an entry (pool, offset, pod, container, interface), and
// the pods that exist then: what a spec left, for the next spec's log to
// be read against.
func (c *Cluster) DumpPools(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, ns := range suiteNamespaces {
		pools, err := c.Rig.WB.WhereaboutsV1alpha1().IPPools(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list the IPPools in %s: %w", ns, err)
		}
		for _, p := range pools.Items {
			fmt.Fprintf(&b, "pool %s/%s (%s): %d entries\n", ns, p.Name, p.Spec.Range, len(p.Spec.Allocations))
			for off, a := range p.Spec.Allocations {
				fmt.Fprintf(&b, "  %s %s %s %s\n", off, a.PodRef, a.ContainerID, a.IfName)
			}
		}
		pods, err := c.Rig.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list the pods in %s: %w", ns, err)
		}
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s/%s %s\n", ns, p.Name, p.Status.Phase)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
