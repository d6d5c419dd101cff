package testcni

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodState is what the API server says of a pod the rig creates: no kubelet
// runs here, so the tests say it.
type PodState struct {
	Node  string
	Phase corev1.PodPhase
	// StatusIPs, when set, become Multus' network-status annotation for lhnet1.
	StatusIPs []string
}

// CreatePod creates a pod object (in its namespace, created if needed) with
// the given node, phase and network-status.
func (r *Rig) CreatePod(ctx context.Context, pod Pod, st PodState) error {
	if err := r.EnsureNamespace(ctx, pod.Namespace); err != nil {
		return err
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		Spec:       corev1.PodSpec{NodeName: st.Node, Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/longhorn-instance-manager"}}},
	}
	if len(st.StatusIPs) > 0 {
		status, _ := json.Marshal([]map[string]any{{"name": "harvester-system/storagenetwork", "interface": "lhnet1", "ips": st.StatusIPs}})
		p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/network-status": string(status)}
	}
	created, err := r.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Ref(), err)
	}
	if st.Phase != "" {
		created.Status.Phase = st.Phase
		if _, err := r.Kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("set phase of pod %s: %w", pod.Ref(), err)
		}
	}
	return nil
}

// DeletePod deletes a pod object at once, as the node lifecycle controller
// force-deletes the pods of a removed node.
func (r *Rig) DeletePod(ctx context.Context, pod Pod) error {
	err := r.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", pod.Ref(), err)
	}
	return nil
}

// CreateNode and DeleteNode manage node objects.
func (r *Rig) CreateNode(ctx context.Context, name string) error {
	_, err := r.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

func (r *Rig) DeleteNode(ctx context.Context, name string) error {
	err := r.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete node %s: %w", name, err)
	}
	return nil
}
