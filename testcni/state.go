package testcni

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// Allocations reads a network's pool from the API server, sorted by address;
// none when the pool does not exist.
func (n *Network) Allocations(ctx context.Context) ([]shim.Allocation, error) {
	p, err := n.rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace).Get(ctx, n.PoolName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pool %s: %w", n.PoolName(), err)
	}
	return shim.Allocations(p)
}

// Of are the allocations of one pod.
func Of(allocs []shim.Allocation, podRef string) []shim.Allocation {
	var out []shim.Allocation
	for _, a := range allocs {
		if a.PodRef == podRef {
			out = append(out, a)
		}
	}
	return out
}

// ORIP is an OverlappingRangeIPReservation as the tests look at it.
type ORIP struct{ Name, PodRef, IfName string }

// ORIPs lists the reservations of this network's range (by name).
func (n *Network) ORIPs(ctx context.Context) ([]ORIP, error) {
	l, err := n.rig.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(n.Tenant.PoolNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	_, ipnet, err := net.ParseCIDR(n.Range)
	if err != nil {
		return nil, err
	}
	var out []ORIP
	for _, o := range l.Items {
		name := o.Name
		if n.NetworkName != "" {
			var ok bool
			if name, ok = strings.CutPrefix(name, n.NetworkName+"-"); !ok {
				continue
			}
		}
		ip := net.ParseIP(strings.ReplaceAll(name, "-", ":"))
		if ip == nil {
			ip = net.ParseIP(name)
		}
		if ip != nil && ipnet.Contains(ip) {
			out = append(out, ORIP{Name: o.Name, PodRef: o.Spec.PodRef, IfName: o.Spec.IfName})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Verify checks the invariants of docs/invariants.md (1, 3 and 5) on a network's pool: one
// allocation per live sandbox (with its container ID, ifname and the address
// its ADD returned), none for any other sandbox of the given pods, no address
// held twice, and every reservation matching an allocation's podref and back.
// It returns what is wrong, nothing when all holds.
func (n *Network) Verify(ctx context.Context, live []*Sandbox, pods []Pod) ([]string, error) {
	allocs, err := n.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	orips, err := n.ORIPs(ctx)
	if err != nil {
		return nil, err
	}
	var bad []string
	byIP := map[string]shim.Allocation{}
	for _, a := range allocs {
		if prev, dup := byIP[a.IP.String()]; dup {
			bad = append(bad, fmt.Sprintf("%s held twice: %s and %s", a.IP, prev, a))
		}
		byIP[a.IP.String()] = a
	}
	// An allocation belongs to a sandbox's attachment when the container IDs
	// match and the ifname does; without an ifname (whereabouts before v0.8
	// writes none), when it is at the address the attachment's ADD returned,
	// or, that unknown, when the container has no other attachment.
	owner := func(a shim.Allocation) *Sandbox {
		var byID []*Sandbox
		for _, s := range live {
			if a.ContainerID != s.ContainerID {
				continue
			}
			byID = append(byID, s)
			if a.IfName == s.IfName || (a.IfName == "" && s.IP() == a.IP.String()) {
				return s
			}
		}
		if a.IfName == "" && len(byID) == 1 && byID[0].IP() == "" {
			return byID[0]
		}
		return nil
	}
	resultIPs := map[string]*Sandbox{}
	for _, s := range live {
		var mine []shim.Allocation
		for _, a := range allocs {
			if owner(a) == s {
				mine = append(mine, a)
			}
		}
		switch {
		case len(mine) != 1:
			bad = append(bad, fmt.Sprintf("live sandbox %s of %s holds %d allocations, not 1", s.ContainerID, s.Pod.Ref(), len(mine)))
		case mine[0].PodRef != s.Pod.Ref():
			bad = append(bad, fmt.Sprintf("live sandbox %s holds %s under pod %s, not %s", s.ContainerID, mine[0].IP, mine[0].PodRef, s.Pod.Ref()))
		case s.IP() != "" && mine[0].IP.String() != s.IP():
			bad = append(bad, fmt.Sprintf("live sandbox %s got %s from ADD but holds %s", s.ContainerID, s.IP(), mine[0].IP))
		}
		if ip := s.IP(); ip != "" {
			if other, dup := resultIPs[ip]; dup {
				bad = append(bad, fmt.Sprintf("%s was given to two live sandboxes: %s and %s", ip, other.ContainerID, s.ContainerID))
			}
			resultIPs[ip] = s
		}
	}
	watched := map[string]bool{}
	for _, p := range pods {
		watched[p.Ref()] = true
	}
	for _, a := range allocs {
		if watched[a.PodRef] && owner(a) == nil {
			bad = append(bad, fmt.Sprintf("leaked: %s belongs to no live sandbox", a))
		}
	}
	oripByName := map[string]ORIP{}
	for _, o := range orips {
		oripByName[o.Name] = o
	}
	for _, a := range allocs {
		name := names.Reservation(a.IP, n.NetworkName)
		o, ok := oripByName[name]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("no reservation %s for %s", name, a))
		case o.PodRef != a.PodRef:
			bad = append(bad, fmt.Sprintf("reservation %s is for %s, but the pool gives %s to %s", name, o.PodRef, a.IP, a.PodRef))
		}
		delete(oripByName, name)
	}
	for _, o := range oripByName {
		bad = append(bad, fmt.Sprintf("reservation %s of %s has no allocation in pool %s", o.Name, o.PodRef, n.PoolName()))
	}
	sort.Strings(bad)
	return bad, nil
}

// Table renders allocations for people: IP, pod, container ID, ifname.
func Table(allocs []shim.Allocation) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  IP\tPOD\tCONTAINER ID\tIFNAME")
	for _, a := range allocs {
		ifn := a.IfName
		if ifn == "" {
			ifn = "-"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", a.IP, a.PodRef, short(a.ContainerID), ifn)
	}
	w.Flush()
	return b.String()
}

func short(id string) string {
	if len(id) > 20 {
		return id[:20] + "…"
	}
	return id
}

// WaitCached waits until the API server's watch cache, which harvester-ipam's
// ADD reads first, shows the sandbox's allocation: a test that needs the
// reclaim to see an earlier sandbox must not race the cache.
func (n *Network) WaitCached(ctx context.Context, s *Sandbox) error {
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := n.rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace).Get(ctx, n.PoolName(), metav1.GetOptions{ResourceVersion: "0"})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, a := range p.Spec.Allocations {
			if a.ContainerID == s.ContainerID {
				return true, nil
			}
		}
		return false, nil
	})
}
