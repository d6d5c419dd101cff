package reconcile

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// cachedCluster serves the first look of a pass (every pod of the pools'
// namespaces, every node) from informers, so that a loop does not list every
// pod of the cluster each pass. What decides a release stays fresh: Fresh
// is the API server itself, and Pod, Node, NADs and Event go to it too.
type cachedCluster struct {
	*kubeCluster
	pods  cache.SharedIndexInformer
	nodes cache.SharedIndexInformer
}

// NewCachedCluster starts pod and node informers and waits, at most
// syncTimeout, until they hold the whole cluster; they stop with ctx. The
// cache keeps only what the reconciler reads of a pod.
func NewCachedCluster(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, callTimeout time.Duration, pageSize int64, syncTimeout time.Duration) (Cluster, error) {
	fresh := NewKubeCluster(kube, dyn, callTimeout, pageSize).(*kubeCluster)
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(trim))
	c := &cachedCluster{kubeCluster: fresh, pods: f.Core().V1().Pods().Informer(), nodes: f.Core().V1().Nodes().Informer()}
	f.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), c.pods.HasSynced, c.nodes.HasSynced) {
		return nil, fmt.Errorf("pod and node informers not synced after %s", syncTimeout)
	}
	return c, nil
}

// NewCachedClusterFrom is NewCachedCluster on pod and node informers the
// caller runs, and shares (the reconciler's Deployment shares them with the
// audit: one cluster-wide pod informer, not two). Each pod must keep what
// judge reads: names, phase, node, deletion and network-status (audit's
// TrimPod keeps more). The pod informer must index by namespace.
func NewCachedClusterFrom(kube kubernetes.Interface, dyn dynamic.Interface, callTimeout time.Duration, pageSize int64, pods, nodes cache.SharedIndexInformer) Cluster {
	fresh := NewKubeCluster(kube, dyn, callTimeout, pageSize).(*kubeCluster)
	return &cachedCluster{kubeCluster: fresh, pods: pods, nodes: nodes}
}

// Fresh is the cluster read straight from the API server: the look right
// before a release.
func (c *cachedCluster) Fresh() Cluster { return c.kubeCluster }

func (c *cachedCluster) Pods(_ context.Context, namespace string, want func(name string) bool) ([]corev1.Pod, error) {
	objs, err := c.pods.GetIndexer().ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil, fmt.Errorf("pods of %s from the cache: %w", namespace, err)
	}
	out := make([]corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && (want == nil || want(p.Name)) {
			out = append(out, *p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (c *cachedCluster) Nodes(context.Context) ([]string, error) {
	var out []string
	for _, o := range c.nodes.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// trim keeps of a pod what judge reads (phase, node, network-status) and of
// a node its name: a cluster's pods cost the reconciler little memory.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return trimPod(o), nil
	case *corev1.Node:
		n := &corev1.Node{}
		n.Name, n.UID, n.ResourceVersion = o.Name, o.UID, o.ResourceVersion
		return n, nil
	}
	return obj, nil // a tombstone or anything else, as it is
}

// trimPod is what judge reads of a pod: its names, phase, node, deletion
// and network-status, in a copy that shares nothing with o.
func trimPod(o *corev1.Pod) *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace, p.UID, p.ResourceVersion = o.Name, o.Namespace, o.UID, o.ResourceVersion
	p.DeletionTimestamp = o.DeletionTimestamp
	if v, ok := o.Annotations[NetworkStatusAnnotation]; ok {
		p.Annotations = map[string]string{NetworkStatusAnnotation: strings.Clone(v)}
	}
	p.Spec.NodeName = o.Spec.NodeName
	p.Status.Phase = o.Status.Phase
	return p
}

// freshOf is the cluster to read right before a release: the API server's
// when c is a cache.
func freshOf(c Cluster) Cluster {
	if f, ok := c.(interface{ Fresh() Cluster }); ok {
		return f.Fresh()
	}
	return c
}
