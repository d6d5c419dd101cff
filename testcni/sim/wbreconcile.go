package sim

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
)

// wbReconcile is one run of whereabouts' own reconciler (pkg/reconciler,
// the same rules in every version): it lists every pool, then every pod; an
// entry is orphaned unless a pod of its podref exists and names the entry's
// address in its network-status (a Pending pod without it is fetched again,
// three times, 250 ms apart); each pool's orphans go in one write guarded by
// the resourceVersion it listed (a conflict fails the run); then every
// reservation whose podref and address are on no such pod is deleted by
// name, without preconditions. Off by default (Options.WBReconciler): by
// that rule it frees a live entry whose address the status does not name
// (yet), whoever wrote the entry.
func (w *world) wbReconcile(a *actor) {
	ctx := context.Background()
	c := cluster{w}
	pools, _, err := w.api.ListPools(ctx, poolNS, shim.Page{})
	if err != nil || a.killed {
		return
	}
	pods, err := c.Pods(ctx, "longhorn-system", nil)
	if err != nil || a.killed {
		return
	}
	byRef := map[string]*corev1.Pod{}
	for i := range pods {
		byRef[pods[i].Namespace+"/"+pods[i].Name] = &pods[i]
	}
	onPod := func(ref, ip string) bool {
		p := byRef[ref]
		for tries := 0; ; tries++ {
			if p == nil {
				return false
			}
			if statusIPs(p)[ip] || p.Status.Phase != corev1.PodPending || tries == 3 {
				return statusIPs(p)[ip]
			}
			a.sleep(250 * time.Millisecond)
			ns, name, _ := strings.Cut(ref, "/")
			if p, err = c.Pod(ctx, ns, name); err != nil {
				p = nil
			}
		}
	}
	for i := range pools {
		p := &pools[i]
		as, err := shim.Allocations(p)
		if err != nil {
			continue
		}
		var gone []string
		first, _ := firstIP(p)
		for off, e := range p.Spec.Allocations {
			ip, _ := shim.OffsetIP(first, off)
			if e.PodRef != "" && ip != nil && !onPod(e.PodRef, ip.String()) {
				gone = append(gone, off)
			}
		}
		_ = as
		if len(gone) == 0 {
			continue
		}
		for _, off := range gone {
			delete(p.Spec.Allocations, off)
		}
		if _, err := w.api.UpdatePool(poolNS, p); err != nil {
			w.tr.add("whereabouts' reconciler: %v", err)
			return
		}
		w.tr.add("whereabouts' reconciler: released %v in %s", gone, p.Name)
		w.stats["whereabouts reconciler releases"] += len(gone)
	}
	res, _, err := w.api.ListReservations(ctx, poolNS, shim.Page{})
	if err != nil || a.killed {
		return
	}
	for _, o := range res {
		ip := strings.ReplaceAll(o.Name, "-", ":")
		if !onPod(o.Spec.PodRef, ip) {
			_ = w.api.DeleteReservation(ctx, poolNS, o.Name, shim.Preconditions{})
			w.tr.add("whereabouts' reconciler: deleted reservation %s of %s", o.Name, o.Spec.PodRef)
		}
	}
}

func statusIPs(p *corev1.Pod) map[string]bool {
	var st []struct {
		IPs     []string `json:"ips"`
		Default bool     `json:"default"`
	}
	_ = json.Unmarshal([]byte(p.Annotations["k8s.v1.cni.cncf.io/network-status"]), &st)
	out := map[string]bool{}
	for _, s := range st {
		if !s.Default {
			for _, ip := range s.IPs {
				out[ip] = true
			}
		}
	}
	return out
}

func firstIP(p *shim.Pool) (net.IP, error) {
	ip, _, err := net.ParseCIDR(p.Spec.Range)
	return ip, err
}
