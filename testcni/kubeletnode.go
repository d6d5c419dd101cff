package testcni

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/harvester/harvester-ipam/shim"
)

// KubeVersion is the Kubernetes the rig runs: kube-apiserver, and in its
// clusters the controller manager, the scheduler and the kubelet
// (testcni/tools.sh builds the same version).
const KubeVersion = "v1.37.0"

// writeKubeletConf writes the kubelet's configuration: what these machines
// need (cgroup v1, which it refuses unless failCgroupV1 is false; cgroupfs
// without per-QoS cgroups, the pods' cgroups under the node's own parent,
// which the rig removes at a power cut; no swap check, no eviction, no image
// garbage collection), its API open to the API server's client certificate
// alone (kubectl exec, attach, logs and debug go through it; anonymous
// requests are refused), its own port on the machine, and every dir of its
// own on the node's disk.
func (nd *Node) writeKubeletConf() error {
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupsPerQOS: false
cgroupRoot: %q
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization:
  mode: AlwaysAllow
staticPodPath: %q
containerRuntimeEndpoint: unix://%s
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
volumePluginDir: %q
serializeImagePulls: false
shutdownGracePeriod: 0s
`, nd.cgroupParent, nd.rig.cluster.kubeletCA, filepath.Join(nd.KubeletDir, "manifests"), nd.Socket, nd.IP, nd.kubeletPort, filepath.Join(nd.KubeletDir, "volume-plugins"))
	for _, d := range []string{filepath.Join(nd.KubeletDir, "manifests"), filepath.Join(nd.KubeletDir, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(nd.Dir, "kubelet.yaml"), []byte(conf))
}

// kubeletArgs is the kubelet's command line: the node registers under its
// name, at the machine's address (it refuses a loopback one), with the
// tenant's (admin) kubeconfig.
func (nd *Node) kubeletArgs() []string {
	return []string{nd.rig.Tools["kubelet"],
		"--config=" + filepath.Join(nd.Dir, "kubelet.yaml"),
		"--kubeconfig=" + nd.Via.Kubeconfig,
		"--root-dir=" + nd.KubeletDir, "--cert-dir=" + filepath.Join(nd.KubeletDir, "pki"),
		"--hostname-override=" + nd.Name, "--node-ip=" + nd.IP,
		"--v=2",
	}
}

// startKubelet starts the kubelet and waits until the node reports Ready
// (its runtime and network ready) with a heartbeat from this boot: after a
// power cut the node object still says Ready, from before.
func (nd *Node) startKubelet(ctx context.Context, since time.Time) error {
	if err := nd.control(ctx, "start kubelet", "started"); err != nil {
		return err
	}
	if err := nd.WaitReady(ctx, since, 2*time.Minute); err != nil {
		return err
	}
	return nd.untaintReady(ctx)
}

// untaintReady does the one thing of the node lifecycle controller (which
// the rig's clusters do not run) that pods need: a Ready node loses the
// node.kubernetes.io/not-ready:NoSchedule taint the kubelet registers it
// with, so that the scheduler places pods that do not tolerate it (a Job's).
func (nd *Node) untaintReady(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := nd.rig.Kube.CoreV1().Nodes().Get(cctx, nd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(n.Spec.Taints) {
			return true, nil
		}
		n.Spec.Taints = keep
		_, err = nd.rig.Kube.CoreV1().Nodes().Update(cctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	})
}

// WaitReady waits until the node's Ready condition is true with a heartbeat
// at or after since.
func (nd *Node) WaitReady(ctx context.Context, since time.Time, limit time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		select {
		case <-nd.done:
			return false, fmt.Errorf("nodeinit exited")
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := nd.rig.Kube.CoreV1().Nodes().Get(cctx, nd.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s (%s: %s), heartbeat %s", c.Status, c.Reason, c.Message, c.LastHeartbeatTime.Format(time.RFC3339))
				return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)), nil
			}
		}
		last = "no Ready condition yet"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not ready: %w (%s); the kubelet's log ends:\n%s", nd.Name, err, last, nd.KubeletLogTail(30))
	}
	return nil
}

// StopKubelet stops the kubelet (SIGTERM), as `systemctl stop kubelet`: the
// containers keep running.
func (nd *Node) StopKubelet(ctx context.Context) error {
	return nd.control(ctx, "stop kubelet", "stopped")
}

// StartKubelet starts the kubelet again and waits until the node is Ready.
func (nd *Node) StartKubelet(ctx context.Context) error {
	return nd.startKubelet(ctx, time.Now())
}

// Shutdown shuts the node down cleanly, as systemd does (the kubelet's
// graceful node shutdown needs systemd-logind's inhibitor locks, which these
// machines do not have): the kubelet's unit stops, then containerd's (its
// shims and containers keep running), then every process left gets SIGTERM
// and, after grace, SIGKILL; then the power goes. It returns how many
// processes had not exited within grace, and which. Boot brings the node up
// again.
func (nd *Node) Shutdown(ctx context.Context, grace time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
	defer cancel()
	cmd := fmt.Sprintf("shutdown %d", int(grace.Seconds()))
	if _, err := fmt.Fprintln(nd.initIn, cmd); err != nil {
		return "", fmt.Errorf("node %s: %s: %w", nd.Name, cmd, err)
	}
	var killed string
	select {
	case r := <-nd.replies:
		n, ok := strings.CutPrefix(r, "down ")
		if !ok {
			return "", fmt.Errorf("node %s: %s: %s", nd.Name, cmd, r)
		}
		killed = n
	case <-nd.done:
		return "", fmt.Errorf("node %s: nodeinit exited on %s", nd.Name, cmd)
	case <-ctx.Done():
		return "", fmt.Errorf("node %s: no answer to %s: %w", nd.Name, cmd, ctx.Err())
	}
	return killed, nd.powerOff()
}

// Boot boots the node after Shutdown, with its disk as it was.
func (nd *Node) Boot(ctx context.Context) error {
	assets, err := nd.rig.nodeAssets(ctx)
	if err != nil {
		return err
	}
	return nd.boot(ctx, assets)
}

// KubeletLogTail is the end of the kubelet's log.
func (nd *Node) KubeletLogTail(lines int) string {
	b, _ := os.ReadFile(nd.KubeletLog)
	return tailLines(string(b), lines)
}

// Sandbox is the pod's ready sandbox on this node, as containerd lists it
// ("" when it has none).
func (nd *Node) Sandbox(ctx context.Context, pod Pod) (string, error) {
	sbs, err := nd.SandboxesOf(ctx, pod)
	if err != nil {
		return "", err
	}
	for i := len(sbs) - 1; i >= 0; i-- {
		if sbs[i].State == runtimeapi.PodSandboxState_SANDBOX_READY {
			return sbs[i].Id, nil
		}
	}
	return "", nil
}

// WaitPodsReady waits until every pod is Ready on this node, each with a
// ready sandbox created at or after since, and returns their sandboxes (pod
// ref -> container ID).
func (nd *Node) WaitPodsReady(ctx context.Context, pods []Pod, since time.Time, limit time.Duration) (map[string]string, error) {
	out := map[string]string{}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		for _, p := range pods {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			obj, err := nd.rig.Kube.CoreV1().Pods(p.Namespace).Get(cctx, p.Name, metav1.GetOptions{})
			cancel()
			if err != nil {
				last = fmt.Sprintf("%s: %v", p.Ref(), err)
				return false, nil
			}
			if !PodReady(obj) {
				last = fmt.Sprintf("%s is %s, not Ready", p.Ref(), obj.Status.Phase)
				return false, nil
			}
			sbs, err := nd.SandboxesOf(ctx, p)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			id := ""
			for _, s := range sbs {
				if s.State == runtimeapi.PodSandboxState_SANDBOX_READY && time.Unix(0, s.CreatedAt).After(since) {
					id = s.Id
				}
			}
			if id == "" {
				last = fmt.Sprintf("%s has no ready sandbox made since %s", p.Ref(), since.Format(time.RFC3339Nano))
				return false, nil
			}
			out[p.Ref()] = id
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("pods on %s not ready: %w (%s); the kubelet's log ends:\n%s", nd.Name, err, last, nd.KubeletLogTail(20))
	}
	return out, nil
}

// PodReady says whether a pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// longhornPod is a pod object as Harvester's Longhorn pods are to the
// network: bound to the node, asking for the storage network; on a node
// with a kubelet its container runs the rig's pause binary (an image the
// node has).
func (nd *Node) longhornPod(pod Pod, networks string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace,
			Labels:      map[string]string{"longhorn.io/component": "instance-manager"},
			Annotations: map[string]string{NetworksAnnotation: networks}},
		Spec: corev1.PodSpec{NodeName: nd.Name, Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/longhorn-instance-manager"}}},
	}
	if nd.opt.Kubelet {
		p.Spec.Containers[0].Image = SandboxImage
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		p.Spec.TerminationGracePeriodSeconds = ptr(int64(5))
	}
	return p
}

// DeletePodAndWait deletes a pod gracefully, as kubectl delete does, and
// waits until it is gone (its kubelet has killed it).
func (r *Rig) DeletePodAndWait(ctx context.Context, pod Pod, limit time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := r.Kube.CoreV1().Pods(pod.Namespace).Delete(cctx, pod.Name, metav1.DeleteOptions{})
	cancel()
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", pod.Ref(), err)
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := r.Kube.CoreV1().Pods(pod.Namespace).Get(cctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// CreateLonghornPod creates a pod object bound to this node that asks for
// the networks of a networks annotation, as Longhorn's pods on Harvester's
// storage network do; on a node with a kubelet, the kubelet runs it.
func (nd *Node) CreateLonghornPod(ctx context.Context, pod Pod, networks string) error {
	if err := nd.rig.EnsureNamespace(ctx, pod.Namespace); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := nd.rig.Kube.CoreV1().Pods(pod.Namespace).Create(cctx, nd.longhornPod(pod, networks), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s on %s: %w", pod.Ref(), nd.Name, err)
	}
	return nil
}

// KillSandbox kills a sandbox's process (SIGKILL to its pause), as when it
// crashes: containerd marks it NOTREADY, and the kubelet stops it (CNI DEL)
// and makes the pod a new one.
func (nd *Node) KillSandbox(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "--address", nd.Socket, "--namespace", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kill sandbox %s on %s: %w: %s", short(id), nd.Name, err, out)
	}
	return nil
}

// Checkpointed says whether harvester-ipam served the attachment (sandbox
// id, ifname) on this node: it records each attachment it serves, before
// anything is allocated, in /var/lib/cni/harvester-ipam, and whereabouts
// alone records none.
func (nd *Node) Checkpointed(id, ifName string) bool {
	_, err := os.Stat(filepath.Join(nd.VarLibCNI, "harvester-ipam", id+":"+ifName+".json"))
	return err == nil
}

// PoolAllocations reads a pool fresh from the API server; none when it
// does not exist.
func (r *Rig) PoolAllocations(ctx context.Context, namespace, pool string) ([]shim.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := r.WB.WhereaboutsV1alpha1().IPPools(namespace).Get(ctx, pool, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pool %s/%s: %w", namespace, pool, err)
	}
	return shim.Allocations(p)
}

// ChartBinary is a binary of the chart's image of tag (ChartImage built it).
func (r *Rig) ChartBinary(tag, name string) string {
	return filepath.Join(filepath.Dir(r.bin), "images", "harvester-ipam-"+tag, name)
}
