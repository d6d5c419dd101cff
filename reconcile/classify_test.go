package reconcile

import (
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
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
	running := func(st string) World { return world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", st)) }
	tests := []struct {
		name   string
		allocs map[string]alloc
		other  map[string]alloc // entries of another pool (192.168.60.0/24)
		world  World
		want   map[string]Reason // offset -> reason
	}{{
		name:   "a running pod on a live node, on its network-status, keeps its address",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		world:  running(status("192.168.50.4")),
		want:   map[string]Reason{"4": Live},
	}, {
		// Whatever wrote it, an address with blanks around it is the address.
		name:   "an address in the network-status with blanks around it",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		world:  running(status(" 192.168.50.4 ")),
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
		world: running(status("192.168.50.7")),
		want:  map[string]Reason{"4": Superseded, "7": Live},
	}, {
		// Hole 2: the sibling is the same sandbox's other interface.
		name: "two interfaces of one sandbox, the status names one: the sibling is live",
		allocs: map[string]alloc{
			"4": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet1"},
			"7": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet2"},
		},
		world: running(status("192.168.50.4")),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name:   "a sibling in another pool, on the status",
		allocs: map[string]alloc{"7": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet2"}},
		other:  map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		world:  running(status("192.168.60.4")),
		want:   map[string]Reason{"7": Live},
	}, {
		// Hole 7: the range changed; the pod runs on with a new pool's address.
		name:   "a running pod whose status names another pool's address only",
		allocs: map[string]alloc{"4": {ContainerID: "old", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		other:  map[string]alloc{"9": {ContainerID: "new", PodRef: lh + "/im-a", IfName: "lhnet1"}},
		world:  running(status("192.168.60.9")),
		want:   map[string]Reason{"4": NotOnStatus},
	}, {
		name: "two sandboxes, a status naming neither: both stale",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: running(status("10.9.9.9")),
		want:  map[string]Reason{"4": NotOnStatus, "7": NotOnStatus},
	}, {
		name: "two sandboxes but no network-status yet: both live",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: running(""),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name: "an unreadable status: live",
		allocs: map[string]alloc{
			"4": {ContainerID: "old", PodRef: lh + "/im-a"},
			"7": {ContainerID: "new", PodRef: lh + "/im-a"},
		},
		world: running("{not json"),
		want:  map[string]Reason{"4": Live, "7": Live},
	}, {
		name:   "an IPv6 address written another way on the status",
		allocs: map[string]alloc{"4": {ContainerID: "c1", PodRef: lh + "/im-a"}},
		world:  world(true, pod(lh, "im-a", corev1.PodRunning, "node-a", `[{"ips":[" 192.168.050.4", "fd00::1"]}]`)),
		want:   map[string]Reason{"4": NotOnStatus},
	}, {
		name: "a pending pod keeps everything",
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
			p := fake.NewPool("192.168.50.0-24", "192.168.50.0/24", tt.allocs)
			pools := []shim.Pool{*p}
			if tt.other != nil {
				pools = append(pools, *fake.NewPool("192.168.60.0-24", "192.168.60.0/24", tt.other))
			}
			vs, err := Classify(p, tt.world, SandboxesOf(pools))
			require.NoError(t, err)
			got := map[string]Reason{}
			for _, v := range vs {
				got[v.Offset] = v.Reason
				if v.Reason == Live {
					assert.NotEmpty(t, v.Why, "a live verdict says why")
				}
			}
			assert.Equal(t, tt.want, got)
		})
	}
	_, err := Classify(fake.NewPool("bad", "nonsense", map[string]alloc{"1": {}}), World{}, nil)
	assert.Error(t, err)
}

func TestClassifyORIPs(t *testing.T) {
	pools := []shim.Pool{
		*fake.NewPool("192.168.50.0-24", "192.168.50.0/24", map[string]alloc{"4": {ContainerID: "c", PodRef: lh + "/a"}}),
		*fake.NewPool("blue-fd00-10---64", "fd00:10::/64", map[string]alloc{"5": {ContainerID: "c", PodRef: lh + "/b"}}),
		*fake.NewPool("green-node-1-10.0.0.64-26", "10.0.0.64/26", map[string]alloc{"2": {ContainerID: "c", PodRef: lh + "/c"}}),
	}
	orip := func(name, podRef string) shim.Reservation {
		return shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef}}
	}
	vs, err := ClassifyORIPs(pools, []shim.Reservation{
		orip("192.168.50.4", lh+"/a"),     // backed
		orip("192.168.50.4", lh+"/other"), // the address is held, but for another pod
		orip("192.168.50.9", lh+"/a"),     // nobody holds .9
		orip("blue-fd00-10--5", lh+"/b"),  // backed, under network_name blue
		orip("fd00-10--5", lh+"/b"),       // unnamed: the blue pool may be an unnamed network's node slice: in doubt, held
		orip("red-fd00-10--5", lh+"/b"),   // another network: not backed
		orip("green-10.0.0.66", lh+"/c"),  // backed by a node slice of network green
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
		"fd00-10--5 " + lh + "/b":       Live,
		"red-fd00-10--5 " + lh + "/b":   OrphanedORIP,
		"green-10.0.0.66 " + lh + "/c":  Live,
	}, got)
	_, err = ClassifyORIPs([]shim.Pool{*fake.NewPool("x", "bad", map[string]alloc{"1": {}})}, nil)
	assert.Error(t, err)
}

func TestNetworkName(t *testing.T) {
	for _, tt := range []struct{ name, rng, want string }{
		{"192.168.50.0-24", "192.168.50.0/24", ""},
		{"blue-192.168.50.0-24", "192.168.50.0/24", "blue"},
		{"storage-net-fd00-10---64", "fd00:10::/64", "storage-net"},
	} {
		assert.Equal(t, tt.want, NetworkName(fake.NewPool(tt.name, tt.rng, nil)), tt.name)
	}
}

func TestClassifyORIPsIsSortedByName(t *testing.T) {
	var orips []shim.Reservation
	for _, n := range []string{"10.0.0.9", "10.0.0.10", "10.0.0.1", "10.0.0.5"} {
		orips = append(orips, shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: "ns/p"}})
	}
	vs, err := ClassifyORIPs(nil, orips)
	require.NoError(t, err)
	var got []string
	for _, v := range vs {
		got = append(got, v.ORIP.Name)
		assert.Equal(t, OrphanedORIP, v.Reason)
	}
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.10", "10.0.0.5", "10.0.0.9"}, got)
}
