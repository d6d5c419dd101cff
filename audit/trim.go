package audit

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim/reconcile"
)

// TrimPod is what the audit reads of a pod, in a copy that shares nothing
// with o: its names, creation and deletion, Longhorn's component label, its
// networks and network-status annotations, node, host network and phase. An
// informer keeps only this (a cluster's pods cost little memory).
func TrimPod(o *corev1.Pod) *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace, p.UID, p.ResourceVersion = o.Name, o.Namespace, o.UID, o.ResourceVersion
	p.CreationTimestamp, p.DeletionTimestamp = o.CreationTimestamp, o.DeletionTimestamp
	if c, ok := o.Labels[componentLabel]; ok {
		p.Labels = map[string]string{componentLabel: strings.Clone(c)}
	}
	for _, k := range []string{NetworksAnnotation, reconcile.NetworkStatusAnnotation} {
		if v, ok := o.Annotations[k]; ok {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[k] = strings.Clone(v)
		}
	}
	p.Spec.NodeName, p.Spec.HostNetwork = o.Spec.NodeName, o.Spec.HostNetwork
	p.Status.Phase = o.Status.Phase
	return p
}
