package sim

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
)

// The simulated world as the audit reads a cluster (reconcile/index.go): the
// NADs, the pools and reservations as the API server holds them now, the
// pods as the API shows them, the nodes. Read outside any actor: it makes
// no request and draws nothing from the schedule's random source, so a
// schedule plays the same story with the audit and without.

// nadNamespace is where the simulated NADs are (as Harvester's are).
const nadNamespace = "harvester-system"

// snapshot is one look's read of the world, the NADs as auditNADs reads
// them.
func (w *world) snapshot(nads []reconcile.NAD) audit.Snapshot {
	s := audit.Snapshot{NADs: nads, PoolNamespace: poolNS, Pods: w.auditPods(), Nodes: w.liveNodes()}
	w.api.View(poolNS, func(pools []*shim.Pool, res map[string]*shim.Reservation) {
		// Shallow copies: the audit only reads, and nothing writes while
		// the checker runs (between two steps).
		s.Pools = make([]shim.Pool, 0, len(pools))
		for _, p := range pools {
			s.Pools = append(s.Pools, *p)
		}
		s.Reservations = make([]shim.Reservation, 0, len(res))
		for _, name := range sortedKeys(res) {
			s.Reservations = append(s.Reservations, *res[name])
		}
	})
	return s
}

// auditNADs are the NADs that exist: each network's config as the runtime
// hands it over, with whereabouts' enable_overlapping_ranges said (true,
// its default, unless the NAD turns it off).
func (w *world) auditNADs() []reconcile.NAD {
	var out []reconcile.NAD
	for _, n := range w.nets {
		if n.deleted {
			continue
		}
		var c map[string]any
		_ = json.Unmarshal(n.config(w), &c)
		c["ipam"].(map[string]any)["enable_overlapping_ranges"] = !n.noOverlap
		b, _ := json.Marshal(c)
		out = append(out, reconcile.NAD{Namespace: nadNamespace, Name: n.name, Config: string(b)})
	}
	return out
}

// auditPods are the pods the API shows: every pod that exists, and a pod
// deleted gracefully while its sandbox is being stopped (its DELs owed or
// under way), which the API shows with a deletionTimestamp until the
// kubelet is done. (The reconciler's and whereabouts' views, cluster.go,
// drop a pod at its deletion: they never needed the difference. A
// force-deleted pod is gone at once in every view.)
func (w *world) auditPods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range w.all {
		if p.exists || w.beingDeleted(p) {
			out = append(out, w.auditPod(p))
		}
	}
	return out
}

// beingDeleted says whether p, deleted gracefully, is still shown: its
// sandbox stopped but not yet torn down.
func (w *world) beingDeleted(p *pod) bool {
	return !p.exists && p.deletedGracefully && p.current != nil && p.current.state == sbDead && p.current.netns
}

// runningPod says whether p is shown Running: its current sandbox is live.
// A pod whose sandbox died (a crash, a reboot) is shown Pending until its
// next sandbox is live: the model's kubelet may take minutes to make it
// (its director's pace), where a real one takes seconds, and a Running pod
// whose network-status names a dead sandbox's addresses for minutes is not
// what a cluster shows.
func (w *world) runningPod(p *pod) bool {
	return p.exists && p.current != nil && p.current.state == sbLive
}

// auditPod is the pod object the API shows for p: what the audit reads of
// a pod (audit.TrimPod) and nothing more.
func (w *world) auditPod(p *pod) *corev1.Pod {
	o := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, UID: types.UID(fmt.Sprintf("uid-%d", p.uid)),
		CreationTimestamp: metav1.NewTime(p.created)}, Spec: corev1.PodSpec{NodeName: p.node}}
	o.Status.Phase = corev1.PodPending
	if w.runningPod(p) {
		o.Status.Phase = corev1.PodRunning
	}
	if !p.exists {
		// Being deleted: Running until the kubelet has stopped it.
		o.Status.Phase = corev1.PodRunning
		t := metav1.NewTime(w.s.now)
		o.DeletionTimestamp = &t
	}
	// What it asks for: its networks, by interface (what Multus attaches).
	var asks []map[string]string
	for _, ifn := range sortedKeys(p.nets) {
		asks = append(asks, map[string]string{"namespace": nadNamespace, "name": p.nets[ifn].name, "interface": ifn})
	}
	b, _ := json.Marshal(asks)
	o.Annotations = map[string]string{audit.NetworksAnnotation: string(b)}
	if p.status != nil {
		o.Annotations[reconcile.NetworkStatusAnnotation] = statusAnnotation(p)
	}
	return o
}

// statusAnnotation is Multus' network-status of p: the cluster network,
// then each interface it names, on the NAD its sandbox attached (a NAD
// replaced since is named as it was).
func statusAnnotation(p *pod) string {
	st := []map[string]any{{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.52.0.1"}, "default": true}}
	for _, ifn := range sortedKeys(p.status) {
		st = append(st, map[string]any{"name": nadNamespace + "/" + statusNet(p, ifn).name, "interface": ifn, "ips": p.status[ifn]})
	}
	b, _ := json.Marshal(st)
	return string(b)
}

// statusNet is the network of the interface ifn that p's status names.
func statusNet(p *pod, ifn string) *network {
	if sb := p.statusOf; sb != nil {
		for _, att := range sb.atts {
			if att.ifname == ifn {
				return att.net
			}
		}
	}
	return p.nets[ifn]
}
