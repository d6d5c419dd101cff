package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/harvester/harvester-ipam/shim"
)

// Cluster is what the reconciler reads of the cluster beside whereabouts'
// objects (which it reaches through shim.Store): pods, nodes and
// NetworkAttachmentDefinitions, and where it records Events. NewKubeCluster is the API server's; tests and the
// simulation bring their own.
type Cluster interface {
	// Pods are the pods of a namespace that want keeps (nil: every one),
	// each with what a verdict reads of it (trim) or more. The API server's
	// are read page by page, and each page dropped but for what is kept:
	// memory grows with the pods wanted, not with the cluster's.
	Pods(ctx context.Context, namespace string, want func(name string) bool) ([]corev1.Pod, error)
	// Pod reads one pod fresh; nil, nil when it does not exist.
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// Nodes are the names of the nodes.
	Nodes(ctx context.Context) ([]string, error)
	// Node says, fresh, whether a node exists.
	Node(ctx context.Context, name string) (bool, error)
	// NADs are the NetworkAttachmentDefinitions of every namespace. An
	// error (no NAD CRD, forbidden, unreachable) leaves them unknown, which
	// is never fatal: sizes are then the ranges', and no pool is orphaned.
	NADs(ctx context.Context) ([]NAD, error)
	// Event records an Event.
	Event(ctx context.Context, ev *corev1.Event) error
}

// NADResource is the NetworkAttachmentDefinition resource (Multus' CRD).
var NADResource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// kubeCluster is Cluster on the API server, with its own timeout on every
// request and paged lists.
type kubeCluster struct {
	kube        kubernetes.Interface
	dyn         dynamic.Interface
	callTimeout time.Duration
	pageSize    int64
}

// NewKubeCluster reads the cluster through kube, and NADs through dyn (nil:
// NADs are never known), each request bounded by callTimeout, lists
// pageSize items a page.
func NewKubeCluster(kube kubernetes.Interface, dyn dynamic.Interface, callTimeout time.Duration, pageSize int64) Cluster {
	if callTimeout <= 0 {
		callTimeout = 10 * time.Second
	}
	if pageSize <= 0 {
		pageSize = 500
	}
	return &kubeCluster{kube: kube, dyn: dyn, callTimeout: callTimeout, pageSize: pageSize}
}

func (k *kubeCluster) Pods(ctx context.Context, namespace string, want func(name string) bool) ([]corev1.Pod, error) {
	pods, err := shim.ListAll(ctx, k.pageSize, func(ctx context.Context, page shim.Page) ([]corev1.Pod, string, error) {
		cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
		defer cancel()
		l, err := k.kube.CoreV1().Pods(namespace).List(cctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
		if err != nil {
			return nil, "", err
		}
		// Of the page, only the pods wanted, trimmed: the page itself is
		// garbage once this returns.
		var out []corev1.Pod
		for i := range l.Items {
			if want == nil || want(l.Items[i].Name) {
				out = append(out, *trimPod(&l.Items[i]))
			}
		}
		return out, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", namespace, err)
	}
	return pods, nil
}

func (k *kubeCluster) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
	defer cancel()
	p, err := k.kube.CoreV1().Pods(namespace).Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

func (k *kubeCluster) Nodes(ctx context.Context) ([]string, error) {
	nodes, err := shim.ListAll(ctx, k.pageSize, func(ctx context.Context, page shim.Page) ([]string, string, error) {
		cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
		defer cancel()
		l, err := k.kube.CoreV1().Nodes().List(cctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
		if err != nil {
			return nil, "", err
		}
		names := make([]string, len(l.Items))
		for i, n := range l.Items {
			names[i] = n.Name
		}
		return names, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return nodes, nil
}

func (k *kubeCluster) Node(ctx context.Context, name string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
	defer cancel()
	_, err := k.kube.CoreV1().Nodes().Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return true, nil
}

// NADs lists them with the dynamic client, as unstructured objects: only
// spec.config is read, and no NAD clientset is worth linking for that.
func (k *kubeCluster) NADs(ctx context.Context) ([]NAD, error) {
	if k.dyn == nil {
		return nil, errors.New("no client for NADs")
	}
	nads, err := shim.ListAll(ctx, k.pageSize, func(ctx context.Context, page shim.Page) ([]NAD, string, error) {
		cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
		defer cancel()
		l, err := k.dyn.Resource(NADResource).List(cctx, metav1.ListOptions{Limit: page.Limit, Continue: page.Continue})
		if err != nil {
			return nil, "", err
		}
		out := make([]NAD, 0, len(l.Items))
		for _, o := range l.Items {
			// A config that is not a string is kept as "": it reads as
			// broken, so the NADs are not known, never as absent.
			cfg, _, _ := unstructured.NestedString(o.Object, "spec", "config")
			out = append(out, NAD{Namespace: o.GetNamespace(), Name: o.GetName(), Config: cfg})
		}
		return out, l.GetContinue(), nil
	})
	if err != nil {
		return nil, fmt.Errorf("list network-attachment-definitions: %w", err)
	}
	return nads, nil
}

func (k *kubeCluster) Event(ctx context.Context, ev *corev1.Event) error {
	cctx, cancel := context.WithTimeout(ctx, k.callTimeout)
	defer cancel()
	_, err := k.kube.CoreV1().Events(ev.Namespace).Create(cctx, ev, metav1.CreateOptions{})
	return err
}
