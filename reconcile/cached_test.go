package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func lists(kube *kubefake.Clientset) int {
	n := 0
	for _, a := range kube.Actions() {
		if a.GetVerb() == "list" {
			n++
		}
	}
	return n
}

// In loop mode a pass's first look comes from informers: no list of the
// cluster's pods per pass, and a pod keeps only what the verdict reads.
func TestCachedClusterServesTheFirstLookFromItsCache(t *testing.T) {
	p := pod(lh, "im-a", corev1.PodRunning, "node-a", status("192.168.50.4"))
	p.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{...}"
	p.Spec.Containers = []corev1.Container{{Name: "im", Image: "longhornio/longhorn-instance-manager"}}
	kube := kubefake.NewSimpleClientset(p, pod("other", "x", corev1.PodRunning, "node-a", ""),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := NewCachedCluster(ctx, kube, nil, time.Second, 10, 10*time.Second)
	require.NoError(t, err)
	synced := lists(kube)

	for i := 0; i < 3; i++ {
		pods, err := c.Pods(ctx, lh, nil)
		require.NoError(t, err)
		require.Len(t, pods, 1)
		got := pods[0]
		assert.Equal(t, "im-a", got.Name)
		assert.Equal(t, corev1.PodRunning, got.Status.Phase)
		assert.Equal(t, "node-a", got.Spec.NodeName)
		assert.Equal(t, map[string]string{NetworkStatusAnnotation: status("192.168.50.4")}, got.Annotations, "only network-status is kept")
		assert.Empty(t, got.Spec.Containers, "the spec is not kept")
		nodes, err := c.Nodes(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"node-a"}, nodes)
	}
	assert.Equal(t, synced, lists(kube), "the passes listed nothing")

	_, err = kube.CoreV1().Pods(lh).Create(ctx, pod(lh, "im-b", corev1.PodPending, "node-a", ""), metav1.CreateOptions{})
	require.NoError(t, err)
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Pods(ctx, lh, nil)
		return len(pods) == 2, err
	})
	require.NoError(t, err, "a new pod reaches the cache")
	pods, err := c.Pods(ctx, lh, nil)
	require.NoError(t, err)
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"im-a", "im-b"}, names, "in name order")

	got, err := c.Pod(ctx, lh, "im-a")
	require.NoError(t, err)
	assert.NotEmpty(t, got.Spec.Containers, "Pod reads the API server")
}

// The cache lags (here it holds nothing at all): the first look finds every
// pod gone, and the look right before the release, from the API server,
// finds them alive. With more due entries than the fresh look GETs one by
// one, it lists: the API server's list, never the cache's.
func TestTheFreshLookIsTheAPIServersNotTheCaches(t *testing.T) {
	const n = freshGETs + 5
	kube := kubefake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	allocs := map[string]alloc{}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		ip := "192.168.50." + strconv.Itoa(10+i)
		name := fmt.Sprintf("im-%02d", i)
		allocs[strconv.Itoa(10+i)] = alloc{ContainerID: "c" + name, PodRef: lh + "/" + name, IfName: "lhnet1"}
		_, err := kube.CoreV1().Pods(lh).Create(ctx, pod(lh, name, corev1.PodRunning, "node-a", status(ip)), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	api := fake.New()
	api.Put(fake.NewPool(poolName, "192.168.50.0/24", allocs))
	lagging := &cachedCluster{kubeCluster: NewKubeCluster(kube, nil, time.Second, 10).(*kubeCluster),
		pods:  cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		nodes: cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Node{}, 0, cache.Indexers{})}
	r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: lagging, Grace: 0}

	rep, err := r.Pass(ctx)
	require.NoError(t, err)
	assert.Len(t, rep.Rows, n, "the cache says every pod is gone")
	assert.Empty(t, rep.Released, "the API server says every pod is alive")
	assert.Len(t, api.Pool("kube-system", poolName).Spec.Allocations, n)
}
