package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The cluster on a real API server: pods and nodes read as the reconciler
// needs them, gone ones as nothing, failures as errors that say what failed.
func TestKubeCluster(t *testing.T) {
	kube := k8sfake.NewSimpleClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: lh, Name: "a"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: lh, Name: "b"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "c"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
	)
	c := NewKubeCluster(kube, nil, 0, 0).(*kubeCluster)
	assert.Equal(t, 10*time.Second, c.callTimeout, "the default")
	assert.EqualValues(t, 500, c.pageSize, "the default")
	c2 := NewKubeCluster(kube, nil, time.Second, 7).(*kubeCluster)
	assert.Equal(t, time.Second, c2.callTimeout)
	assert.EqualValues(t, 7, c2.pageSize)
	c3 := NewKubeCluster(kube, nil, time.Nanosecond, 1).(*kubeCluster)
	assert.Equal(t, time.Nanosecond, c3.callTimeout, "the smallest is no default")
	assert.EqualValues(t, 1, c3.pageSize)

	ctx := context.Background()
	pods, err := c.Pods(ctx, lh, nil)
	require.NoError(t, err)
	assert.Len(t, pods, 2)
	p, err := c.Pod(ctx, lh, "a")
	require.NoError(t, err)
	require.NotNil(t, p)
	assert.Equal(t, "a", p.Name)
	p, err = c.Pod(ctx, lh, "gone")
	require.NoError(t, err)
	assert.Nil(t, p, "a gone pod is nothing, not an error")
	nodes, err := c.Nodes(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"node-a"}, nodes)
	ok, err := c.Node(ctx, "node-a")
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = c.Node(ctx, "gone")
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, c.Event(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "e1"}, Reason: "R"}))
	ev, err := kube.CoreV1().Events("kube-system").Get(ctx, "e1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "R", ev.Reason)

	kube.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	_, err = c.Pods(ctx, lh, nil)
	assert.EqualError(t, err, "list pods in longhorn-system: connection refused")
	_, err = c.Pod(ctx, lh, "a")
	assert.EqualError(t, err, "get pod longhorn-system/a: connection refused")
	_, err = c.Nodes(ctx)
	assert.EqualError(t, err, "list nodes: connection refused")
	_, err = c.Node(ctx, "node-a")
	assert.EqualError(t, err, "get node node-a: connection refused")
	assert.Error(t, c.Event(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "e2"}}))
}

// NADs are read with the dynamic client, page by page: each one's
// namespace, name and spec.config; one whose config is no string reads as
// "" (broken, not absent). Without a client, no NAD is known.
func TestKubeClusterNADs(t *testing.T) {
	nad := func(ns, name string, config any) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
			"metadata": map[string]any{"namespace": ns, "name": name},
			"spec":     map[string]any{"config": config},
		}}
		return o
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{NADResource: "NetworkAttachmentDefinitionList"})
	// Under the resource's own name (the fake would guess another from the kind).
	for _, o := range []*unstructured.Unstructured{
		nad("harvester-system", "storagenetwork-a", `{"ipam":{"type":"whereabouts"}}`),
		nad("default", "broken", int64(7)),
	} {
		require.NoError(t, dyn.Tracker().Create(NADResource, o, o.GetNamespace()))
	}
	c := NewKubeCluster(k8sfake.NewSimpleClientset(), dyn, time.Second, 1)
	nads, err := c.NADs(context.Background())
	require.NoError(t, err)
	assert.ElementsMatch(t, []NAD{
		{Namespace: "harvester-system", Name: "storagenetwork-a", Config: `{"ipam":{"type":"whereabouts"}}`},
		{Namespace: "default", Name: "broken", Config: ""},
	}, nads)

	_, err = NewKubeCluster(k8sfake.NewSimpleClientset(), nil, 0, 0).NADs(context.Background())
	assert.ErrorContains(t, err, "no client for NADs")
}
