package reconcile

import (
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type alloc = whereaboutsv1alpha1.IPAllocation

func pod(ns, name string, phase corev1.PodPhase, node, status string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	if status != "" {
		p.Annotations = map[string]string{NetworkStatusAnnotation: status}
	}
	return p
}

func world(nodesKnown bool, pods ...*corev1.Pod) World {
	w := World{Pods: map[string]*corev1.Pod{}, Nodes: map[string]bool{"node-a": true}, NodesKnown: nodesKnown}
	for _, p := range pods {
		w.Pods[p.Namespace+"/"+p.Name] = p
	}
	return w
}

const lh = "longhorn-system"

func status(ips ...string) string {
	s := `[{"name":"k8s-pod-network","ips":["10.52.0.67"],"default":true}`
	for _, ip := range ips {
		s += `,{"name":"harvester-system/storagenetwork","interface":"lhnet1","ips":["` + ip + `"]}`
	}
	return s + "]"
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name   string
		allocs map[string]alloc
		world  World
		want   map[string]Reason // offset -> reason
	}{{
		name:   "a running pod on a live node keeps its address",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		world:  world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", status("192.168.50.4"))),
		want:   map[string]Reason{"4": Live},
	}, {
		name:   "the pod is gone",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a"}},
		world:  world(true),
		want:   map[string]Reason{"4": PodGone},
	}, {
		name: "the pod terminated",
		allocs: map[string]alloc{
			"4": {ContainerID: "c1", PodRef: lh + "/done"},
			"5": {ContainerID: "c2", PodRef: lh + "/failed"},
		},
		world: world(true, pod(lh, "done", corev1.PodSucceeded, "node-a", ""), pod(lh, "failed", corev1.PodFailed, "node-a", "")),
		want:  map[string]Reason{"4": PodTerminated, "5": PodTerminated},
	}, {
		name:   "the pod's node no longer exists",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a"}},
		world:  world(true, pod(lh, "im-a", corev1.PodRunning, "node-gone", status("192.168.50.4"))),
		want:   map[string]Reason{"4": NodeGone},
	}, {
		name:   "the node list failed: in doubt, live",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a"}},
		world:  world(false, pod(lh, "im-a", corev1.PodRunning, "node-gone", status("192.168.50.4"))),
		want:   map[string]Reason{"4": Live},
	}, {
		name: "a newer sandbox holds another address, and the status names it",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a", IfName: "lhnet1"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a", IfName: "lhnet1"},
		},
		world: world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", status("192.168.50.7"))),
		want:  map[string]Reason{"4": Superseded, "7": Live},
	}, {
		name: "two sandboxes but no network-status yet: both live",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", "")),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name: "two sandboxes, a status naming neither: both live",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", status("10.9.9.9"))),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name: "two sandboxes, an unreadable status: both live",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", "{not json")),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name: "a pending pod with no network-status keeps everything",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: world(true, pod(lh, "im-a", corev1.PodPending, "node-gone", "")),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name:   "no podref: never proven stale",
		allocs: map[string]alloc{"4": {ContainerID: "c1"}, "5": {ContainerID: "c2", PodRef: "noslash"}},
		world:  world(true),
		want:   map[string]Reason{"4": Live, "5": Live},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &whereaboutsv1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.0-24"},
				Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24", Allocations: tt.allocs}}
			vs, err := Classify(p, tt.world)
			require.NoError(t, err)
			got := map[string]Reason{}
			for _, v := range vs {
				got[v.Offset] = v.Reason
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestClassifyORIPs(t *testing.T) {
	pools := []whereaboutsv1alpha1.IPPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.0-24"}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24",
			Allocations: map[string]alloc{"4": {ContainerID: "c", PodRef: lh + "/a"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "blue-fd00-10---64"}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "fd00:10::/64",
			Allocations: map[string]alloc{"5": {ContainerID: "c", PodRef: lh + "/b"}}}},
	}
	orip := func(name, podRef string) whereaboutsv1alpha1.OverlappingRangeIPReservation {
		return whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef}}
	}
	vs, err := ClassifyORIPs(pools, []whereaboutsv1alpha1.OverlappingRangeIPReservation{
		orip("192.168.50.4", lh+"/a"),     // backed
		orip("192.168.50.4", lh+"/other"), // the address is held, but for another pod
		orip("192.168.50.9", lh+"/a"),     // nobody holds .9
		orip("blue-fd00-10--5", lh+"/b"),  // backed, under network_name blue
		orip("fd00-10--5", lh+"/b"),       // the same address without the network name: not backed
	})
	require.NoError(t, err)
	got := map[string]Reason{}
	for _, v := range vs {
		got[v.ORIP.Name+" "+v.ORIP.Spec.PodRef] = v.Reason
	}
	assert.Equal(t, map[string]Reason{
		"192.168.50.4 " + lh + "/a":     Live,
		"192.168.50.4 " + lh + "/other": OrphanedORIP,
		"192.168.50.9 " + lh + "/a":     OrphanedORIP,
		"blue-fd00-10--5 " + lh + "/b":  Live,
		"fd00-10--5 " + lh + "/b":       OrphanedORIP,
	}, got)
}

func TestNetworkName(t *testing.T) {
	for _, tt := range []struct{ name, rng, want string }{
		{"192.168.50.0-24", "192.168.50.0/24", ""},
		{"blue-192.168.50.0-24", "192.168.50.0/24", "blue"},
		{"storage-net-fd00-10---64", "fd00:10::/64", "storage-net"},
	} {
		p := &whereaboutsv1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: tt.name}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: tt.rng}}
		assert.Equal(t, tt.want, NetworkName(p), tt.name)
	}
}
