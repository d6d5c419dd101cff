package shim

import (
	"net"
	"sort"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
)

// Picker chooses, from a pool as read, the offsets of the entries to
// release, sorted. It is called again on every fresh read, so it decides from
// what it is given, not from what an earlier read showed.
type Picker func(p *Pool) []string

// EarlierSandboxes picks the allocations of podRef held by any sandbox other
// than keepID, whatever their ifname (an empty one, written before
// whereabouts v0.8, too). It never picks keepID's own, nor another pod's.
func EarlierSandboxes(podRef, keepID string) Picker {
	return func(p *Pool) []string {
		if podRef == "" || keepID == "" {
			return nil
		}
		var out []string
		for off, a := range p.Spec.Allocations {
			if a.PodRef == podRef && a.ContainerID != keepID {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}

// Found is what a pool holds for one attachment.
type Found struct {
	// Offsets are the attachment's entries.
	Offsets []string
	// Others counts the container's entries that are not the attachment's:
	// another interface of the same sandbox.
	Others int
	// Ambiguous says that the container has several entries without an
	// ifname and nothing tells which is the attachment's: none is picked.
	Ambiguous bool
}

// FindAttachment finds the entries of the attachment (containerID, ifName)
// in p: the container's entries that name the ifname, and those without an
// ifname (whereabouts before v0.8 writes none) at the addresses a checkpoint
// recorded at ADD (ips). An entry naming another ifname is another
// interface's, never this one's. Without recorded addresses, an entry of the
// container without an ifname is the attachment's when it is the
// container's only entry in the pool; with two, which one is this
// attachment's cannot be told: none is picked, and Ambiguous says so.
func FindAttachment(p *Pool, containerID, ifName string, ips []net.IP) Found {
	var f Found
	if containerID == "" {
		return f
	}
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		first = nil // no address can be matched; ifnames still can
	}
	var mine, unnamed []string
	total := 0
	for off, a := range p.Spec.Allocations {
		if a.ContainerID != containerID {
			continue
		}
		total++
		switch {
		case a.IfName == ifName:
			mine = append(mine, off)
		case a.IfName != "":
			// another interface of the sandbox
		case len(ips) > 0:
			if first == nil {
				continue
			}
			if ip, err := OffsetIP(first, off); err == nil && containsIP(ips, ip) {
				mine = append(mine, off)
			}
		default:
			unnamed = append(unnamed, off)
		}
	}
	if len(mine) == 0 && len(unnamed) > 0 {
		if len(unnamed) == 1 && total == 1 {
			mine = unnamed
		} else {
			f.Ambiguous = true
		}
	}
	sort.Strings(mine)
	f.Offsets, f.Others = mine, total-len(mine)
	return f
}

func containsIP(ips []net.IP, ip net.IP) bool {
	for _, x := range ips {
		if x.Equal(ip) {
			return true
		}
	}
	return false
}

// Attachment picks what FindAttachment finds.
func Attachment(containerID, ifName string, ips []net.IP) Picker {
	return func(p *Pool) []string { return FindAttachment(p, containerID, ifName, ips).Offsets }
}

// Exactly picks the given entries only while each is still what the caller
// saw: same container ID, podref and ifname. A plan is made on one read; an
// entry that changed since is no longer the one it chose.
func Exactly(want map[string]whereaboutsv1alpha1.IPAllocation) Picker {
	return func(p *Pool) []string {
		var out []string
		for off, w := range want {
			if a, ok := p.Spec.Allocations[off]; ok && a == w {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}
