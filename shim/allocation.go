package shim

import (
	"fmt"
	"net"
	"sort"
	"strconv"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/iphelpers"
)

// IPAllocation is an entry of spec.allocations as whereabouts writes it.
type IPAllocation = whereaboutsv1alpha1.IPAllocation

// Allocation is one entry of an IPPool's spec.allocations, with its address.
type Allocation struct {
	Pool   string
	Offset string
	IP     net.IP
	whereaboutsv1alpha1.IPAllocation
}

func (a Allocation) String() string {
	return fmt.Sprintf("%s (pool %s, container %s, pod %s, ifname %q)", a.IP, a.Pool, a.ContainerID, a.PodRef, a.IfName)
}

// Allocations lists a pool's entries with their addresses, sorted by address.
func Allocations(p *Pool) ([]Allocation, error) {
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		return nil, fmt.Errorf("pool %s has range %q: %w", p.Name, p.Spec.Range, err)
	}
	out := make([]Allocation, 0, len(p.Spec.Allocations))
	for off, a := range p.Spec.Allocations {
		ip, err := OffsetIP(first, off)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		out = append(out, Allocation{Pool: p.Name, Offset: off, IP: ip, IPAllocation: a})
	}
	sort.Slice(out, func(i, j int) bool { return iphelpers.CompareIPs(out[i].IP, out[j].IP) < 0 })
	return out, nil
}

// OffsetIP is the address at a decimal offset from a pool's first address, as
// whereabouts stores allocations.
func OffsetIP(first net.IP, offset string) (net.IP, error) {
	n, err := strconv.ParseUint(offset, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("allocation offset %q is not a decimal number", offset)
	}
	ip := iphelpers.IPAddOffset(first, n)
	if ip == nil {
		return nil, fmt.Errorf("allocation offset %s is outside the address family of %s", offset, first)
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return ip, nil
}

// entries are the allocations of p at the given offsets, in their order.
func entries(p *Pool, offsets []string) ([]Allocation, error) {
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		return nil, fmt.Errorf("pool %s has range %q: %w", p.Name, p.Spec.Range, err)
	}
	out := make([]Allocation, 0, len(offsets))
	for _, off := range offsets {
		a, ok := p.Spec.Allocations[off]
		if !ok {
			continue
		}
		ip, err := OffsetIP(first, off)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		out = append(out, Allocation{Pool: p.Name, Offset: off, IP: ip, IPAllocation: a})
	}
	return out, nil
}
