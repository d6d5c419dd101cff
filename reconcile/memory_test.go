package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// bigPod is a pod as a large cluster has thousands of: labels, annotations,
// managed fields, containers with env, mounts and resources, a status with
// conditions (about 6 KB of JSON).
func bigPod(ns string, i int) *corev1.Pod {
	name := fmt.Sprintf("instance-manager-%05d", i)
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("0f6e1c1e-0000-4000-8000-%012d", i)),
			ResourceVersion: strconv.Itoa(1000 + i), CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
			Labels: map[string]string{"longhorn.io/component": "instance-manager", "longhorn.io/node": fmt.Sprintf("node-%03d", i%300),
				"longhorn.io/instance-manager-type": "aio", "longhorn.io/managed-by": "longhorn-manager"},
			Annotations: map[string]string{
				"k8s.v1.cni.cncf.io/networks": `[{"namespace":"harvester-system","name":"storagenetwork-sg8d8","interface":"lhnet1"}]`,
				NetworkStatusAnnotation:       status(fmt.Sprintf("192.168.%d.%d", 50+i/250, 1+i%250)),
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "longhorn.io/v1beta2", Kind: "InstanceManager", Name: name, UID: "1"}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "longhorn-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:k8s.v1.cni.cncf.io/networks":{}},"f:labels":{".":{},"f:longhorn.io/component":{},"f:longhorn.io/instance-manager-type":{},"f:longhorn.io/node":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"instance-manager\"}":{".":{},"f:args":{},"f:command":{},"f:env":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:resources":{},"f:securityContext":{},"f:volumeMounts":{}}},"f:nodeName":{},"f:priorityClassName":{},"f:serviceAccountName":{},"f:tolerations":{},"f:volumes":{}}}`)}}},
		},
		Spec:   corev1.PodSpec{NodeName: fmt.Sprintf("node-%03d", i%300), ServiceAccountName: "longhorn-service-account", PriorityClassName: "longhorn-critical"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.52.0.1", QOSClass: corev1.PodQOSBurstable},
	}
	for c := 0; c < 2; c++ {
		ctr := corev1.Container{Name: fmt.Sprintf("instance-manager-%d", c), Image: "longhornio/longhorn-instance-manager:v1.9.1",
			Command:         []string{"instance-manager", "--debug", "daemon", "--listen", "0.0.0.0:8500"},
			Resources:       corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("960m")}},
			SecurityContext: &corev1.SecurityContext{Privileged: new(true)}}
		for e := 0; e < 8; e++ {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: fmt.Sprintf("LONGHORN_SETTING_%d", e), Value: strings.Repeat("v", 24)})
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: fmt.Sprintf("vol-%d", e), MountPath: fmt.Sprintf("/host/var/lib/longhorn/%d", e)})
		}
		p.Spec.Containers = append(p.Spec.Containers, ctr)
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image, Ready: true,
			ImageID: "docker.io/longhornio/longhorn-instance-manager@sha256:" + strings.Repeat("a", 64), ContainerID: "containerd://" + strings.Repeat("b", 64)})
	}
	for e := 0; e < 8; e++ {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("vol-%d", e),
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/var/lib/longhorn/%d", e)}}})
	}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))})
	}
	return p
}

// pagedPods is an API server's pod list for one namespace of n pods, served
// page by page as the API server does (limit, continue), encoded as each
// page is asked for. At each page it asks, it records the client's live heap
// (after a collection): what the reader holds of the pages before.
type pagedPods struct {
	ns    string
	n     int
	mu    sync.Mutex
	heaps []uint64
	pages []int64 // the limit of each request
	conts int     // requests with a continue token
}

func (s *pagedPods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/api/v1/nodes":
		l := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}}
		for i := 0; i < 300; i++ {
			l.Items = append(l.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%03d", i)}})
		}
		_ = json.NewEncoder(w).Encode(&l)
		return
	case "/api/v1/namespaces/" + s.ns + "/pods":
	default:
		http.NotFound(w, r)
		return
	}
	limit, _ := strconv.ParseInt(r.URL.Query().Get("limit"), 10, 64)
	from := 0
	if c := r.URL.Query().Get("continue"); c != "" {
		from, _ = strconv.Atoi(c)
	}
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	s.mu.Lock()
	s.heaps = append(s.heaps, m.HeapAlloc)
	s.pages = append(s.pages, limit)
	if from > 0 {
		s.conts++
	}
	s.mu.Unlock()
	to := s.n
	if limit > 0 && from+int(limit) < to {
		to = from + int(limit)
	}
	l := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, ListMeta: metav1.ListMeta{ResourceVersion: "5000"}}
	if to < s.n {
		l.Continue = strconv.Itoa(to)
	}
	for i := from; i < to; i++ {
		l.Items = append(l.Items, *bigPod(s.ns, i))
	}
	_ = json.NewEncoder(w).Encode(&l)
}

func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A pass's or inspect's look at the pods, on a cluster of 20,000 pods in the
// pools' namespace (about 120 MB of pods as JSON), 40 of which the pools
// name: the pods are read page by page (limit and continue, as client-go's
// pager), and of each page only the pods the pools name are kept, with only
// what a verdict reads of them. Memory stays bounded by a page and the
// pools' entries, not by the cluster's pods: the live heap (measured with
// runtime.ReadMemStats after a collection, at every page and at the end)
// grows by a few MB, where keeping each pod whole held hundreds.
func TestReadingThePodsOfALargeClusterKeepsMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("lists 20,000 pods")
	}
	const n, named = 20000, 40
	srv := &pagedPods{ns: lh, n: n}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: ts.URL, QPS: -1})
	require.NoError(t, err)

	allocs := map[string]alloc{}
	for i := 0; i < named; i++ {
		allocs[strconv.Itoa(i+1)] = alloc{ContainerID: "c" + strconv.Itoa(i), PodRef: fmt.Sprintf("%s/instance-manager-%05d", lh, i*(n/named)), IfName: "lhnet1"}
	}
	allocs["999"] = alloc{ContainerID: "gone", PodRef: lh + "/gone", IfName: "lhnet1"}
	pools := []shim.Pool{*fake.NewPool("p", "192.168.48.0/20", allocs)}

	base := liveHeap()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	r := &Reconciler{Cluster: NewKubeCluster(kube, nil, time.Minute, 0)}
	w, err := r.readWorld(context.Background(), pools)
	require.NoError(t, err)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	end := liveHeap()

	peak := end
	for _, h := range srv.heaps {
		peak = max(peak, h)
	}
	growth := int64(peak) - int64(base)
	// The heap's high-water mark, garbage included (the API server's side,
	// in this process, too): what a container's memory limit meets.
	sys := int64(after.HeapSys) - int64(before.HeapSys)
	t.Logf("%d pods read in %d pages (limits %v...): live heap %.1f MB before, %.1f MB at the peak, %.1f MB at the end; the heap's high-water mark grew by %.1f MB",
		n, len(srv.pages), srv.pages[:1], float64(base)/(1<<20), float64(peak)/(1<<20), float64(end)/(1<<20), float64(sys)/(1<<20))

	assert.Len(t, srv.pages, (n+499)/500, "read page by page")
	for _, l := range srv.pages {
		assert.EqualValues(t, 500, l, "every request has a limit")
	}
	assert.Equal(t, len(srv.pages)-1, srv.conts, "every page after the first is asked for with the continue token")
	assert.Less(t, growth, int64(16<<20), "the live heap grew by %.1f MB reading %d pods: it must not grow with the cluster's pods", float64(growth)/(1<<20), n)
	assert.Less(t, sys, int64(64<<20), "the heap's high-water mark grew by %.1f MB reading %d pods", float64(sys)/(1<<20), n)

	require.Len(t, w.Pods, named, "the pods the pools name, and no other")
	p := w.Pods[lh+"/instance-manager-00500"]
	require.NotNil(t, p)
	assert.Equal(t, corev1.PodRunning, p.Status.Phase)
	assert.Equal(t, "node-200", p.Spec.NodeName)
	assert.Equal(t, map[string]string{NetworkStatusAnnotation: status("192.168.52.1")}, p.Annotations, "only network-status is kept")
	assert.Empty(t, p.Spec.Containers, "the spec is not kept")
	assert.Empty(t, p.ManagedFields)
	assert.True(t, w.NodesKnown)
	assert.Len(t, w.Nodes, 300)
	runtime.KeepAlive(w)
}
