package reconcile

import (
	"context"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
)

// readWorld lists the pods of every namespace the pools name, and the nodes.
// Pods are listed per namespace, page by page: the requests grow with the
// namespaces and the pods, not with the allocations; of each page only the
// pods the pools name are kept, trimmed, so that memory grows with the
// allocations, not with the cluster's pods. A failed pod list fails
// the pass (nothing can be judged); a failed node list only keeps every
// node-gone case live.
func (r *Reconciler) readWorld(ctx context.Context, pools []shim.Pool) (World, error) {
	return readWorldFrom(ctx, r.Cluster, pools)
}

func readWorldFrom(ctx context.Context, c Cluster, pools []shim.Pool) (World, error) {
	nss := map[string]map[string]bool{} // namespace: the pods' names
	for _, p := range pools {
		for _, a := range p.Spec.Allocations {
			if ns, name, ok := strings.Cut(a.PodRef, "/"); ok && ns != "" {
				if nss[ns] == nil {
					nss[ns] = map[string]bool{}
				}
				nss[ns][name] = true
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
		named := nss[ns]
		pods, err := c.Pods(ctx, ns, func(name string) bool { return named[name] })
		if err != nil {
			return World{}, err
		}
		for i := range pods {
			p := &pods[i]
			w.Pods[p.Namespace+"/"+p.Name] = p
		}
	}
	nodes, err := c.Nodes(ctx)
	if err == nil {
		w.NodesKnown = true
		for _, n := range nodes {
			w.Nodes[n] = true
		}
	}
	return w, nil
}

// freshGETs bounds the pods a fresh look GETs one by one; more are listed
// again, namespace by namespace, so a pass's requests stay bounded by
// namespaces when a node with hundreds of pods goes.
const freshGETs = 20

// freshWorld looks again at the pods (and their nodes) of the due entries,
// right before they are released, from the API server even when the first
// look came from a cache.
func (r *Reconciler) freshWorld(ctx context.Context, due map[string]shim.IPAllocation) (World, error) {
	fresh := freshOf(r.Cluster)
	pods := map[string]bool{}
	for _, a := range due {
		pods[a.PodRef] = true
	}
	if len(pods) > freshGETs {
		allocs := make(map[string]shim.IPAllocation, len(due))
		for off, a := range due {
			allocs[off] = a
		}
		p := shim.Pool{}
		p.Spec.Allocations = allocs
		return readWorldFrom(ctx, fresh, []shim.Pool{p})
	}
	refs := make([]string, 0, len(pods))
	for ref := range pods {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	w := World{Pods: map[string]*corev1.Pod{}, Nodes: map[string]bool{}, NodesKnown: true}
	for _, ref := range refs {
		ns, name, ok := strings.Cut(ref, "/")
		if !ok {
			continue
		}
		pod, err := fresh.Pod(ctx, ns, name)
		if err != nil {
			return World{}, err
		}
		if pod == nil {
			continue
		}
		w.Pods[ref] = pod
		if node := pod.Spec.NodeName; node != "" {
			if _, done := w.Nodes[node]; !done {
				exists, err := fresh.Node(ctx, node)
				if err != nil {
					w.NodesKnown = false // in doubt: the node may exist
					continue
				}
				w.Nodes[node] = exists
			}
		}
	}
	return w, nil
}
