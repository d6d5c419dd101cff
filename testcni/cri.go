package testcni

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criTimeout bounds one CRI call: a sandbox's start runs Multus, bridge,
// host-local, harvester-ipam and whereabouts, which waits for its lease, up
// to two minutes, when many sandboxes start at once on a loaded machine.
const criTimeout = 3 * time.Minute

// Labels the kubelet puts on a sandbox; containerd reads the pod's identity
// for CNI_ARGS from the sandbox metadata.
const (
	labelPodName      = "io.kubernetes.pod.name"
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelPodUID       = "io.kubernetes.pod.uid"
)

// criClient speaks the CRI (v1) to one containerd over its socket.
type criClient struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
	img  runtimeapi.ImageServiceClient
}

func dialCRI(socket string) (*criClient, error) {
	conn, err := grpc.Dial("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial the CRI at %s: %w", socket, err)
	}
	return &criClient{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), img: runtimeapi.NewImageServiceClient(conn)}, nil
}

func (c *criClient) close() {
	if c != nil {
		c.conn.Close()
	}
}

// PodSandbox is one sandbox of a pod on a node, as the kubelet knows it.
type PodSandbox struct {
	ID      string
	Pod     Pod
	UID     string
	Attempt uint32
	// IP is the pod's address on the cluster network, as containerd reports it.
	IP string
}

func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, criTimeout)
}

// RunPodSandbox runs a new sandbox of pod, as the kubelet does: the pod
// object must exist (its UID is part of what the kubelet sends, and Multus
// checks it), and the attempt is one more than the pod's latest sandbox.
func (nd *Node) RunPodSandbox(ctx context.Context, pod Pod) (*PodSandbox, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	obj, err := nd.rig.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("run a sandbox of %s: %w", pod.Ref(), err)
	}
	uid := string(obj.UID)
	old, err := nd.SandboxesOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	var attempt uint32
	for _, s := range old {
		if a := s.Metadata.GetAttempt() + 1; a > attempt {
			attempt = a
		}
	}
	logDir := filepath.Join(nd.Dir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, uid))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: uid, Attempt: attempt},
		Hostname:     pod.Name,
		LogDirectory: logDir,
		Labels:       map[string]string{labelPodName: pod.Name, labelPodNamespace: pod.Namespace, labelPodUID: uid},
		Annotations:  obj.Annotations,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: nd.cgroupParent + "/pod" + uid,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
			},
		},
	}
	resp, err := nd.cri.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox of %s (attempt %d) on %s: %w", pod.Ref(), attempt, nd.Name, err)
	}
	sb := &PodSandbox{ID: resp.PodSandboxId, Pod: pod, UID: uid, Attempt: attempt}
	st, err := nd.PodSandboxStatus(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	sb.IP = st.GetNetwork().GetIp()
	return sb, nil
}

// StopPodSandbox stops a sandbox: containerd tears its network down (CNI DEL
// through Multus) and kills its processes. An error leaves it to be retried.
func (nd *Node) StopPodSandbox(ctx context.Context, id string) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	if _, err := nd.cri.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s on %s: %w", short(id), nd.Name, err)
	}
	return nil
}

// RemovePodSandbox removes a stopped sandbox.
func (nd *Node) RemovePodSandbox(ctx context.Context, id string) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	if _, err := nd.cri.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s on %s: %w", short(id), nd.Name, err)
	}
	return nil
}

// ListPodSandbox lists the node's sandboxes, oldest first.
func (nd *Node) ListPodSandbox(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	return nd.listPodSandbox(ctx, nil)
}

// SandboxesOf lists the sandboxes of one pod, oldest first.
func (nd *Node) SandboxesOf(ctx context.Context, pod Pod) ([]*runtimeapi.PodSandbox, error) {
	return nd.listPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{labelPodName: pod.Name, labelPodNamespace: pod.Namespace}})
}

func (nd *Node) listPodSandbox(ctx context.Context, f *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	resp, err := nd.cri.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox on %s: %w", nd.Name, err)
	}
	out := resp.Items
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return out, nil
}

// PodSandboxStatus is containerd's view of one sandbox.
func (nd *Node) PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	resp, err := nd.cri.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return nil, fmt.Errorf("PodSandboxStatus %s on %s: %w", short(id), nd.Name, err)
	}
	return resp.Status, nil
}

// MarkRunning records on the pod object what the kubelet records once the
// pod's sandbox and containers run: phase Running, the pod's IP, the node.
func (nd *Node) MarkRunning(ctx context.Context, sb *PodSandbox) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	pods := nd.rig.Kube.CoreV1().Pods(sb.Pod.Namespace)
	p, err := pods.Get(ctx, sb.Pod.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("mark %s running: %w", sb.Pod.Ref(), err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = sb.IP
	if sb.IP != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: sb.IP}}
	}
	p.Status.HostIP = "127.0.0.1"
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("mark %s running: %w", sb.Pod.Ref(), err)
	}
	return nil
}

// criReady is nil once the CRI answers, its network is ready (the CNI conf
// is loaded) and it has the sandbox image.
func (c *criClient) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.rt.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return fmt.Errorf("CRI status: %w", err)
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if !cond.Status {
			return fmt.Errorf("CRI condition %s is false: %s %s", cond.Type, cond.Reason, cond.Message)
		}
	}
	img, err := c.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: SandboxImage}})
	if err != nil {
		return fmt.Errorf("CRI image status of %s: %w", SandboxImage, err)
	}
	if img.Image == nil {
		return fmt.Errorf("the CRI does not have %s yet", SandboxImage)
	}
	return nil
}
