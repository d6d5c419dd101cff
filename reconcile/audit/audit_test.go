package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

const (
	storage = "harvester-system/storagenetwork"
	lh      = "longhorn-system"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// nad is a NAD of a whereabouts range; extra are more ipam fields.
func nad(ref, rng string, extra map[string]any) reconcile.NAD {
	ns, name, _ := strings.Cut(ref, "/")
	ipam := map[string]any{"type": "whereabouts", "range": rng}
	for k, v := range extra {
		ipam[k] = v
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": "0.3.1", "type": "bridge", "ipam": ipam})
	return reconcile.NAD{Namespace: ns, Name: name, Config: string(b)}
}

// pool is an IPPool of range rng with entries "offset=pod/container".
func pool(name, rng string, entries ...string) shim.Pool {
	p := shim.Pool{}
	p.Name, p.Namespace, p.Spec.Range = name, "kube-system", rng
	p.Spec.Allocations = map[string]shim.IPAllocation{}
	for _, e := range entries {
		off, rest, _ := strings.Cut(e, "=")
		pod, container, _ := strings.Cut(rest, "#")
		p.Spec.Allocations[off] = shim.IPAllocation{PodRef: pod, ContainerID: container, IfName: "lhnet1"}
	}
	return p
}

func orip(name, pod string) shim.Reservation {
	o := shim.Reservation{}
	o.Name, o.Namespace, o.UID = name, "kube-system", types.UID("uid-"+name)
	o.Spec.PodRef = pod
	return o
}

// pod is a pod in phase; status maps a NAD ref to its addresses (nil: no
// network-status at all); asks are the NADs its networks annotation asks for.
type podSpec struct {
	ref      string
	phase    corev1.PodPhase
	asks     []string
	status   map[string][]string
	deleting bool
	host     bool
	created  int // seconds after t0
	raw      string
}

func (s podSpec) build() *corev1.Pod {
	ns, name, _ := strings.Cut(s.ref, "/")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(s.created) * time.Second)), Annotations: map[string]string{}}}
	p.Status.Phase = s.phase
	p.Spec.HostNetwork = s.host
	if s.deleting {
		d := metav1.NewTime(t0)
		p.DeletionTimestamp = &d
	}
	var asks []map[string]string
	for _, a := range s.asks {
		ans, an, _ := strings.Cut(a, "/")
		asks = append(asks, map[string]string{"namespace": ans, "name": an, "interface": "lhnet1"})
	}
	if len(asks) > 0 {
		b, _ := json.Marshal(asks)
		p.Annotations[NetworksAnnotation] = string(b)
	}
	if s.raw != "" {
		p.Annotations[NetworksAnnotation] = s.raw
	}
	if s.status != nil {
		st := []map[string]any{{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.52.0.9"}, "default": true}}
		for n, ips := range s.status {
			st = append(st, map[string]any{"name": n, "interface": "lhnet1", "ips": ips})
		}
		b, _ := json.Marshal(st)
		p.Annotations[reconcile.NetworkStatusAnnotation] = string(b)
	}
	return p
}

// healthy is two instance managers on the storage network, each with its
// entry, reservation and network-status.
func healthy() (Snapshot, []podSpec) {
	s := Snapshot{
		NADs:          []reconcile.NAD{nad(storage, "10.0.50.0/24", nil)},
		PoolNamespace: "kube-system",
		Pools:         []shim.Pool{pool("10.0.50.0-24", "10.0.50.0/24", "1="+lh+"/instance-manager-a#ca", "2="+lh+"/instance-manager-b#cb")},
		Reservations:  []shim.Reservation{orip("10.0.50.1", lh+"/instance-manager-a"), orip("10.0.50.2", lh+"/instance-manager-b")},
		Nodes:         2,
	}
	pods := []podSpec{
		{ref: lh + "/instance-manager-a", phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{storage: {"10.0.50.1"}}},
		{ref: lh + "/instance-manager-b", phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{storage: {"10.0.50.2"}}, created: 1},
	}
	return s, pods
}

// got is a finding as the table states it: kind, address and pods.
func got(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s %s %s %s", f.Kind, f.Network, f.Address, strings.Join(f.Pods, ",")))
	}
	return out
}

// judgeCase is a row of TestJudge: the healthy world changed, and the
// findings it gives.
type judgeCase struct {
	name   string
	change func(s *Snapshot, pods []podSpec) []podSpec
	want   []string
}

// snapshot is the case's world.
func (c judgeCase) snapshot() Snapshot {
	s, pods := healthy()
	if c.change != nil {
		pods = c.change(&s, pods)
	}
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	return s
}

// judgeCases are TestJudge's rows, which TestJudgeIgnoresListOrder plays
// shuffled too.
func judgeCases() []judgeCase {
	imA, imB, imC := lh+"/instance-manager-a", lh+"/instance-manager-b", lh+"/instance-manager-c"
	return []judgeCase{
		{name: "healthy: nothing", want: nil},
		{name: "two pods, one address, across overlapping pools of one network", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, created: 5})
		}, want: []string{"SharedAddress " + storage + " 10.0.50.1 " + imC + "," + imA}},
		{name: "two pods, one address, on their network-status", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Pools[0].Spec.Allocations["3"] = shim.IPAllocation{PodRef: imC, ContainerID: "cc"}
			s.Reservations = append(s.Reservations, orip("10.0.50.3", imC))
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{storage: {"10.0.50.1"}}, created: 5})
		}, want: []string{"SharedAddress " + storage + " 10.0.50.1 " + imC + "," + imA, "PodPoolMismatch " + storage + " 10.0.50.1 " + imC}},
		{name: "false alarm: the other holder is being deleted", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			pods[0].deleting = true
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, created: 5})
		}},
		{name: "false alarm: the other holder has terminated", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			return append(pods, podSpec{ref: imC, phase: corev1.PodSucceeded, created: 5})
		}},
		{name: "false alarm: one address in two networks (network_name)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/blue", "10.0.50.0/24", map[string]any{"network_name": "blue"}))
			s.Pools = append(s.Pools, pool("blue-10.0.50.0-24", "10.0.50.0/24", "1="+imC+"#cc"))
			s.Reservations = append(s.Reservations, orip("blue-10.0.50.1", imC))
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, asks: []string{"default/blue"}, status: map[string][]string{"default/blue": {"10.0.50.1"}}, created: 5})
		}},
		// whereabouts consults the reservations only where
		// enable_overlapping_ranges is on: where a NAD turns it off, its
		// pool hands out an address another pool holds, by design.
		{name: "false alarm: two NADs with reservations off hand out one address, each from its own pool", change: func(s *Snapshot, pods []podSpec) []podSpec {
			off := map[string]any{"enable_overlapping_ranges": false}
			s.NADs = []reconcile.NAD{nad(storage, "10.0.50.0/24", off), nad("default/small", "10.0.50.0/28", off)}
			s.Reservations = nil
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, asks: []string{"default/small"}, status: map[string][]string{"default/small": {"10.0.50.1"}}, created: 5})
		}},
		{name: "false alarm: a NAD with reservations off hands out an address a reserving NAD's pool holds", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", map[string]any{"enable_overlapping_ranges": false}))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, asks: []string{"default/small"}, status: map[string][]string{"default/small": {"10.0.50.1"}}, created: 5})
		}},
		{name: "two pods' network-status name one address of one pool, its NAD's reservations off", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs[0] = nad(storage, "10.0.50.0/24", map[string]any{"enable_overlapping_ranges": false})
			s.Reservations = nil
			s.Pools[0].Spec.Allocations["3"] = shim.IPAllocation{PodRef: imC, ContainerID: "cc"}
			return append(pods, podSpec{ref: imC, phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{storage: {"10.0.50.1"}}, created: 5})
		}, want: []string{"SharedAddress " + storage + " 10.0.50.1 " + imC + "," + imA, "PodPoolMismatch " + storage + " 10.0.50.1 " + imC}},
		{name: "a Running pod without its network on its network-status (#11639)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].status = map[string][]string{}
			return pods
		}, want: []string{"MissingAddress " + storage + "  " + imB}},
		// Multus lists the interface, with no address on it: the pod has
		// no address on the network all the same.
		{name: "a Running pod whose network-status lists the network's interface with no address", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].status = map[string][]string{storage: {}}
			return pods
		}, want: []string{"MissingAddress " + storage + "  " + imB}},
		{name: "a Running pod without any network-status", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].status = nil
			return pods
		}, want: []string{"MissingAddress " + storage + "  " + imB}},
		{name: "the short form of the networks annotation", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].asks, pods[1].raw, pods[1].status = nil, "harvester-system/storagenetwork@lhnet1", map[string][]string{}
			return pods
		}, want: []string{"MissingAddress " + storage + "  " + imB}},
		{name: "false alarm: an ADD in flight, pod not Running yet", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].phase, pods[1].status = corev1.PodPending, nil
			return pods
		}},
		{name: "false alarm: a pod being deleted, its DEL under way", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].deleting, pods[1].status = true, map[string][]string{}
			delete(s.Pools[0].Spec.Allocations, "2")
			return pods
		}},
		{name: "false alarm: a host-network pod", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].host, pods[1].status = true, nil
			return pods
		}},
		{name: "false alarm: a network whose IPAM is not whereabouts", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, reconcile.NAD{Namespace: "default", Name: "hl", Config: `{"type":"macvlan","ipam":{"type":"host-local","subnet":"10.9.0.0/24"}}`})
			pods[1].asks = append(pods[1].asks, "default/hl")
			return pods
		}},
		{name: "network-status names another address than the pool's entry", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].status = map[string][]string{storage: {"10.0.50.9"}}
			return pods
		}, want: []string{"PodPoolMismatch " + storage + " 10.0.50.9 " + imB}},
		{name: "network-status names an address the pool holds for nobody", change: func(s *Snapshot, pods []podSpec) []podSpec {
			delete(s.Pools[0].Spec.Allocations, "2")
			s.Reservations = s.Reservations[:1]
			return pods
		}, want: []string{"PodPoolMismatch " + storage + " 10.0.50.2 " + imB}},
		{name: "a pod's attachments are entries of two sandboxes", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/mig", "10.0.60.0/24", map[string]any{"network_name": "mig"}))
			s.Pools = append(s.Pools, pool("mig-10.0.60.0-24", "10.0.60.0/24", "1="+imB+"#old"))
			s.Reservations = append(s.Reservations, orip("mig-10.0.60.1", imB))
			pods[1].asks = append(pods[1].asks, "default/mig")
			pods[1].status["default/mig"] = []string{"10.0.60.1"}
			return pods
		}, want: []string{"PodPoolMismatch default/mig 10.0.60.1 " + imB}},
		{name: "false alarm: a network whose pools are in another namespace", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/elsewhere", "10.0.70.0/24", map[string]any{"network_name": "elsewhere"}))
			pods[1].asks = append(pods[1].asks, "default/elsewhere")
			pods[1].status["default/elsewhere"] = []string{"10.0.70.4"}
			return pods
		}},
		{name: "an entry without its reservation", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Reservations = s.Reservations[:1]
			return pods
		}, want: []string{"EntryReservationMismatch " + storage + " 10.0.50.2 " + imB}},
		// Found by the simulation (testcni/sim, seed 57 on v0.7.0): a pod
		// whose ADD failed after its reclaim deleted an earlier sandbox's
		// reservation, not yet its entry, waits Pending for its next
		// sandbox: that entry is a leak, the next ADD's or the
		// reconciler's, and the pod holds no address yet.
		{name: "false alarm: a Pending pod's entry without its reservation (no holder yet)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].phase, pods[1].status = corev1.PodPending, nil
			s.Reservations = s.Reservations[:1]
			return pods
		}},
		{name: "false alarm: a Pending pod's entry at an address a Running pod holds in an overlapping pool", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
			return append(pods, podSpec{ref: imC, phase: corev1.PodPending, created: 5})
		}},
		{name: "false alarm: a reservation of another pod at a Pending pod's entry", change: func(s *Snapshot, pods []podSpec) []podSpec {
			pods[1].phase, pods[1].status = corev1.PodPending, nil
			s.Reservations[1] = orip("10.0.50.2", lh+"/other")
			return pods
		}},
		// Found by the simulation (seed 174 on v0.7.0): an earlier
		// sandbox's entry, written by an ADD whose response was lost, its
		// reservation never made, beside a Running pod whose network-status
		// names another address: a leak the reconciler releases (not on
		// the status), not an address the pod holds.
		{name: "false alarm: a Running pod's earlier sandbox's entry without its reservation (a leak: the reconciler's)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Pools[0].Spec.Allocations["9"] = shim.IPAllocation{PodRef: imB, ContainerID: "old"}
			return pods
		}},
		{name: "false alarm: a Running pod's earlier sandbox's entry at an address another pod holds in an overlapping pool", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
			s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imB+"#old"))
			return pods
		}},
		{name: "false alarm: a reservation of another pod at a Running pod's earlier sandbox's entry", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Pools[0].Spec.Allocations["9"] = shim.IPAllocation{PodRef: imB, ContainerID: "old"}
			s.Reservations = append(s.Reservations, orip("10.0.50.9", lh+"/other"))
			return pods
		}},
		{name: "an entry of the sandbox on the network-status, on an interface the status leaves out, without its reservation", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Pools[0].Spec.Allocations["9"] = shim.IPAllocation{PodRef: imB, ContainerID: "cb", IfName: "lhnet2"}
			return pods
		}, want: []string{"EntryReservationMismatch " + storage + " 10.0.50.9 " + imB}},
		{name: "false alarm: no reservation anywhere in the network (turned off in the flat file)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Reservations = nil
			return pods
		}},
		{name: "false alarm: the NAD turns reservations off", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs[0] = nad(storage, "10.0.50.0/24", map[string]any{"enable_overlapping_ranges": false})
			s.Reservations = s.Reservations[:1]
			return pods
		}},
		{name: "false alarm: a gone pod's entry without reservation (a leak: the reconciler's)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Pools[0].Spec.Allocations["7"] = shim.IPAllocation{PodRef: lh + "/gone", ContainerID: "cg"}
			return pods
		}},
		{name: "false alarm: a reservation no entry holds (a leak: the reconciler's)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Reservations = append(s.Reservations, orip("10.0.50.9", lh+"/gone"))
			return pods
		}},
		{name: "a reservation held by another pod than the entry at its address", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Reservations[1] = orip("10.0.50.2", lh+"/other")
			return pods
		}, want: []string{"EntryReservationMismatch " + storage + " 10.0.50.2 " + imB + "," + lh + "/other"}},
		{name: "headroom: fewer free addresses than the Longhorn pods need", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs[0] = nad(storage, "10.0.50.0/29", nil) // 6 usable
			s.Pools[0].Spec.Range = "10.0.50.0/29"
			s.Pools[0].Name = "10.0.50.0-29"
			s.Nodes = 3
			s.Pools[0].Spec.Allocations["3"] = shim.IPAllocation{PodRef: lh + "/share-manager-v1", ContainerID: "cs"}
			s.Reservations = append(s.Reservations, orip("10.0.50.3", lh+"/share-manager-v1"))
			return append(pods, podSpec{ref: lh + "/share-manager-v1", phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{storage: {"10.0.50.3"}}})
		}, want: []string{"Headroom " + storage + "  "}},
		// The rule: an alert before the next node, not once it is
		// too late for it.
		{name: "headroom: exactly what the pods need now, none for the next node", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs[0] = nad(storage, "10.0.50.0/29", nil) // 6 usable, 2 held: 4 free
			s.Pools[0].Spec.Range = "10.0.50.0/29"
			s.Pools[0].Name = "10.0.50.0-29"
			s.Nodes = 4 // need: max(4 nodes, 2 instance managers)
			return pods
		}, want: []string{"Headroom " + storage + "  "}},
		{name: "headroom: enough free", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.Nodes = 3
			return pods
		}},
		{name: "NADs unknown: nothing that needs them", change: func(s *Snapshot, pods []podSpec) []podSpec {
			s.NADs, s.NADsErr = nil, errors.New("forbidden")
			pods[1].status = nil
			return pods
		}},
	}
}

func TestJudge(t *testing.T) {
	for _, tt := range judgeCases() {
		t.Run(tt.name, func(t *testing.T) {
			r := Judge(tt.snapshot(), Options{})
			assert.Equal(t, tt.want, got(r.Findings))
			for _, f := range r.Findings {
				assert.NotEmpty(t, f.Message)
				assert.NotEmpty(t, f.Command)
			}
		})
	}
}

func TestHeadroomFigures(t *testing.T) {
	s, pods := healthy()
	s.Nodes = 5
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	s.Pods = append(s.Pods, podSpec{ref: lh + "/backing-image-manager-x", phase: corev1.PodRunning, asks: []string{storage}}.build(),
		podSpec{ref: lh + "/share-manager-gone", phase: corev1.PodFailed, asks: []string{storage}}.build())
	r := Judge(s, Options{})
	// need: max(5 nodes, 2 instance managers) + 0 share + 1 backing-image;
	// free: 254 usable, 2 held (the backing-image manager has no entry: it
	// is also missing its address).
	assert.Equal(t, []Figures{{Network: storage, Free: 252, Need: 6}}, r.Figures)
	s.Nodes = -1
	r = Judge(s, Options{})
	assert.Equal(t, int64(3), r.Figures[0].Need, "nodes unknown: the instance managers running")
	require.NotEmpty(t, r.Findings)
	assert.Equal(t, MissingAddress, r.Findings[0].Kind)
	assert.Equal(t, "kubectl -n longhorn-system get backingimagemanagers.longhorn.io backing-image-manager-x -o yaml", r.Findings[0].Command,
		"a backing-image manager: its files' states first (TestAdviceIsSafeForEachKindOfPod)")
}

func TestRequestsOf(t *testing.T) {
	for raw, want := range map[string][]request{
		`[{"namespace":"a","name":"n","interface":"x"},{"name":"m"}]`: {{nad: "a/n", iface: "x"}, {nad: "ns/m"}},
		"a/n@x, m":  {{nad: "a/n", iface: "x"}, {nad: "ns/m"}},
		"":          nil,
		"[not json": nil,
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Annotations: map[string]string{NetworksAnnotation: raw}}}
		assert.Equal(t, want, requestsOf(p), raw)
	}
}

func TestTrimPodKeepsWhatTheAuditReads(t *testing.T) {
	s, pods := healthy()
	pods[1].status = map[string][]string{}
	full := pods[1].build()
	full.Labels = map[string]string{componentLabel: instanceManager, "other": "x"}
	full.Annotations["big"] = strings.Repeat("x", 1000)
	full.Spec.Containers = []corev1.Container{{Name: "c", Image: "i"}}
	s.Pods = []*corev1.Pod{pods[0].build(), TrimPod(full)}
	trimmed := s.Pods[1]
	assert.NotContains(t, trimmed.Annotations, "big")
	assert.Empty(t, trimmed.Spec.Containers)
	assert.Equal(t, []string{"MissingAddress " + storage + "  " + lh + "/instance-manager-b"}, got(Judge(s, Options{}).Findings))
}

// An upgrade starts each new instance manager beside the old one: one not
// Running yet (Pending, its sandbox being made) needs its address too, and
// counts in the need.
func TestHeadroomCountsInstanceManagersNotRunningYet(t *testing.T) {
	s, pods := healthy()
	s.Nodes = 2
	pods = append(pods, podSpec{ref: lh + "/instance-manager-new", phase: corev1.PodPending, asks: []string{storage}, created: 9})
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	r := Judge(s, Options{})
	require.Len(t, r.Figures, 1)
	assert.Equal(t, int64(3), r.Figures[0].Need, "max(2 nodes, 3 instance managers, one of them Pending)")
}
