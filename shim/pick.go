package shim

import (
	"errors"
	"net"
	"sort"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
)

// ErrEarlierSandbox is an allocation refused, nothing written, because the
// pool it would be written on holds an entry of an earlier sandbox of the
// pod: the ADD's reclaim decided "no earlier sandbox" on a copy that was
// behind. The ADD releases it on a fresh read and allocates again.
var ErrEarlierSandbox = errors.New("the pool holds an entry of an earlier sandbox of the pod that the ADD's reclaim did not see")

// Picker chooses, from a pool as read, the offsets of the entries to
// release, sorted. It is called again on every fresh read, so it decides from
// what it is given, not from what an earlier read showed.
type Picker func(p *Pool) []string

// EarlierSandboxes picks the allocations of podRef held by any sandbox other
// than keepID, whatever their ifname (an empty one, written before
// whereabouts v0.8, too), but those on the interface handedOver names:
// whereabouts v0.8.0 and later (and the node agent's allocator) hand the
// pod's entry on an interface to its next sandbox's ADD on that interface,
// in the write that allocates, so that the pod keeps its address and is
// never seen without it. handedOver "" picks them all. It never picks
// keepID's own, nor another pod's.
func EarlierSandboxes(podRef, keepID, handedOver string) Picker {
	return func(p *Pool) []string {
		if podRef == "" || keepID == "" {
			return nil
		}
		var out []string
		for off, a := range p.Spec.Allocations {
			if a.PodRef == podRef && a.ContainerID != keepID && (handedOver == "" || a.IfName != handedOver) {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}

// EarlierOnInterface picks what EarlierSandboxes(podRef, keepID, ifName)
// leaves: the entries of podRef's earlier sandboxes on interface ifName,
// which whereabouts hands to the ADD on ifName. One still there after that ADD allocated was not handed
// over (a whereabouts that does not) and is released then.
func EarlierOnInterface(podRef, keepID, ifName string) Picker {
	return func(p *Pool) []string {
		if podRef == "" || keepID == "" || ifName == "" {
			return nil
		}
		var out []string
		for off, a := range p.Spec.Allocations {
			if a.PodRef == podRef && a.ContainerID != keepID && a.IfName == ifName {
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
	// Ambiguous says that the container has an entry without an ifname that
	// nothing tells is the attachment's: it is not picked.
	Ambiguous bool
}

// FindAttachment finds the entries of the attachment (containerID, ifName)
// in p: the container's entries that name the ifname, and those without an
// ifname (whereabouts before v0.8 writes none) at the addresses a checkpoint
// recorded at ADD (ips) and no other attachment of the container to p
// recorded (siblings). An entry naming another ifname is another
// interface's; an entry without an ifname at no recorded address cannot be
// told apart from another interface's (a sandbox may attach twice to one
// pool, and a DEL may come again after the first released its own), nor can
// one at an address both recorded (an address is recorded before it is
// written, and one chosen on a stale copy and never written may be the
// address the pool gave the sibling since): neither is picked, and
// Ambiguous says that one is there.
func FindAttachment(p *Pool, containerID, ifName string, ips, siblings []net.IP) Found {
	var f Found
	if containerID == "" {
		return f
	}
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		first = nil // no address can be matched; ifnames still can
	}
	var mine []string
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
		case first != nil && len(ips) > 0:
			switch {
			case !atOneOf(first, off, ips):
				// at an address the attachment did not get: another interface's
			case atOneOf(first, off, siblings):
				f.Ambiguous = true
			default:
				mine = append(mine, off)
			}
		default:
			f.Ambiguous = true
		}
	}
	sort.Strings(mine)
	f.Offsets, f.Others = mine, total-len(mine)
	return f
}

func atOneOf(first net.IP, off string, ips []net.IP) bool {
	ip, err := OffsetIP(first, off)
	return err == nil && containsIP(ips, ip)
}

func containsIP(ips []net.IP, ip net.IP) bool {
	for _, x := range ips {
		if x.Equal(ip) {
			return true
		}
	}
	return false
}

// LostAttachment picks what an ADD of the attachment (containerID, ifName)
// may have allocated when it was lost midway (a node agent that took it and
// died): what FindAttachment finds, and also the container's entries without
// an ifname at no address in others, the addresses the sandbox's other
// attachments to this pool recorded. whereabouts v0.7.0 writes no ifname,
// and such an ADD may die after whereabouts wrote its entry, before the
// address was recorded. When unsure (another attachment of the sandbox to
// this pool recorded no address: its entry cannot be told from this one's),
// those entries are left, as FindAttachment leaves them.
func LostAttachment(containerID, ifName string, ips, others []net.IP, unsure bool) Picker {
	return func(p *Pool) []string {
		f := FindAttachment(p, containerID, ifName, ips, others)
		if !f.Ambiguous || unsure {
			return f.Offsets
		}
		first, _, err := net.ParseCIDR(p.Spec.Range)
		if err != nil {
			return f.Offsets
		}
		out := f.Offsets
		for off, a := range p.Spec.Allocations {
			if a.ContainerID == containerID && a.IfName == "" && !atOneOf(first, off, ips) && !atOneOf(first, off, others) {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}

// Attachment picks what FindAttachment finds.
func Attachment(containerID, ifName string, ips, siblings []net.IP) Picker {
	return func(p *Pool) []string { return FindAttachment(p, containerID, ifName, ips, siblings).Offsets }
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
