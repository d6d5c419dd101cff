package reconcile

import (
	"context"
	"fmt"
	"sort"
	"strings"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// listPools reads every pool of the namespace, fresh from the API server.
func (r *Reconciler) listPools(ctx context.Context) ([]whereaboutsv1alpha1.IPPool, error) {
	var out []whereaboutsv1alpha1.IPPool
	opts := metav1.ListOptions{Limit: r.pageSize()}
	for {
		cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
		l, err := r.Store.Client().IPPools(r.Store.Namespace()).List(cctx, opts)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list pools in %s: %w", r.Store.Namespace(), err)
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

func (r *Reconciler) listORIPs(ctx context.Context) ([]whereaboutsv1alpha1.OverlappingRangeIPReservation, error) {
	var out []whereaboutsv1alpha1.OverlappingRangeIPReservation
	opts := metav1.ListOptions{Limit: r.pageSize()}
	for {
		cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
		l, err := r.Store.Client().OverlappingRangeIPReservations(r.Store.Namespace()).List(cctx, opts)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list reservations in %s: %w", r.Store.Namespace(), err)
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

// readWorld lists the pods of every namespace the pools name, and the nodes.
// Pods are listed per namespace, page by page: the requests grow with the
// namespaces and the pods, not with the allocations. A failed pod list fails
// the pass (nothing can be judged); a failed node list only keeps every
// node-gone case live.
func (r *Reconciler) readWorld(ctx context.Context, pools []whereaboutsv1alpha1.IPPool) (World, error) {
	nss := map[string]bool{}
	for _, p := range pools {
		for _, a := range p.Spec.Allocations {
			if ns, _, ok := strings.Cut(a.PodRef, "/"); ok && ns != "" {
				nss[ns] = true
			}
		}
	}
	names := make([]string, 0, len(nss))
	for ns := range nss {
		names = append(names, ns)
	}
	sort.Strings(names)

	w := World{Pods: map[string]*corev1.Pod{}, Nodes: map[string]bool{}}
	for _, ns := range names {
		opts := metav1.ListOptions{Limit: r.pageSize()}
		for {
			cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
			l, err := r.Kube.CoreV1().Pods(ns).List(cctx, opts)
			cancel()
			if err != nil {
				return World{}, fmt.Errorf("list pods in %s: %w", ns, err)
			}
			for i := range l.Items {
				p := &l.Items[i]
				w.Pods[p.Namespace+"/"+p.Name] = p
			}
			if l.Continue == "" {
				break
			}
			opts.Continue = l.Continue
		}
	}
	opts := metav1.ListOptions{Limit: r.pageSize()}
	w.NodesKnown = true
	for {
		cctx, cancel := context.WithTimeout(ctx, r.Store.CallTimeout)
		l, err := r.Kube.CoreV1().Nodes().List(cctx, opts)
		cancel()
		if err != nil {
			w.NodesKnown = false
			break
		}
		for _, n := range l.Items {
			w.Nodes[n.Name] = true
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	return w, nil
}
