package audit

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/reconcile"
)

// TrimPod is what the audit reads of a pod, in a copy that shares nothing
// with o: its names, creation and deletion, Longhorn's component label and KubeVirt's, its controller, its
// networks and network-status annotations, node, host network and phase. An
// informer keeps only this (a cluster's pods cost little memory).
func TrimPod(o *corev1.Pod) *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace, p.UID, p.ResourceVersion = o.Name, o.Namespace, o.UID, o.ResourceVersion
	p.CreationTimestamp, p.DeletionTimestamp = o.CreationTimestamp, o.DeletionTimestamp
	for _, k := range []string{componentLabel, kubevirtLabel, kubevirtVMLabel} {
		if v, ok := o.Labels[k]; ok {
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels[k] = strings.Clone(v)
		}
	}
	// Its controller, for what deleting it costs (audit's advice).
	for _, r := range o.OwnerReferences {
		if r.Controller != nil && *r.Controller {
			c := true
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: r.APIVersion, Kind: r.Kind, Name: strings.Clone(r.Name), UID: r.UID, Controller: &c}}
			break
		}
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
