package sim

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/reconcile"
)

// ---- the reconciler's view of the cluster (reconcile.Cluster)

type cluster struct{ w *world }

func (c cluster) yield() error {
	a := c.w.s.cur
	if a.killed {
		return errKilled
	}
	a.at = c.w.s.now.Add(time.Millisecond)
	a.yield()
	if a.killed {
		panic(goExit{})
	}
	if !c.w.quiet && c.w.s.now.Before(c.w.faultsUntil) && c.w.s.chance(0.2) {
		return apierrors.NewServiceUnavailable("etcdserver: request timed out")
	}
	return nil
}

func (c cluster) podObject(p *pod) *corev1.Pod {
	o := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, UID: "u"}, Spec: corev1.PodSpec{NodeName: p.node}}
	o.Status.Phase = corev1.PodPending
	if p.phase == podRunning {
		o.Status.Phase = corev1.PodRunning
	}
	if p.status != nil {
		var st []map[string]any
		st = append(st, map[string]any{"name": "cluster-network", "ips": []string{"10.52.0.1"}, "default": true})
		for _, ifn := range sortedKeys(p.status) {
			st = append(st, map[string]any{"name": "harvester-system/" + p.nets[ifn].name, "interface": ifn, "ips": p.status[ifn]})
		}
		b, _ := json.Marshal(st)
		o.Annotations = map[string]string{"k8s.v1.cni.cncf.io/network-status": string(b)}
	}
	return o
}

func (c cluster) Pods(_ context.Context, ns string, want func(name string) bool) ([]corev1.Pod, error) {
	if err := c.yield(); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, ref := range sortedKeys(c.w.pods) {
		if p := c.w.pods[ref]; p.exists && p.ns == ns && (want == nil || want(p.name)) {
			out = append(out, *c.podObject(p))
		}
	}
	return out, nil
}

func (c cluster) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if err := c.yield(); err != nil {
		return nil, err
	}
	if p, ok := c.w.pods[ns+"/"+name]; ok && p.exists {
		return c.podObject(p), nil
	}
	return nil, nil
}

func (c cluster) Nodes(context.Context) ([]string, error) {
	if err := c.yield(); err != nil {
		return nil, err
	}
	var out []string
	for _, n := range c.w.nodes {
		if n.exists {
			out = append(out, n.name)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (c cluster) Node(_ context.Context, name string) (bool, error) {
	if err := c.yield(); err != nil {
		return false, err
	}
	for _, n := range c.w.nodes {
		if n.name == name {
			return n.exists, nil
		}
	}
	return false, nil
}

func (c cluster) Event(context.Context, *corev1.Event) error { return nil }

// NADs are the networks whose NAD exists.
func (c cluster) NADs(context.Context) ([]reconcile.NAD, error) {
	if err := c.yield(); err != nil {
		return nil, err
	}
	var out []reconcile.NAD
	for _, n := range c.w.nets {
		if !n.deleted {
			out = append(out, reconcile.NAD{Namespace: "harvester-system", Name: n.name, Config: string(n.config(c.w))})
		}
	}
	return out, nil
}
