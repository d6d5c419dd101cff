package shim

import (
	"sort"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
)

// EarlierSandboxes picks the allocations of podRef held by any sandbox other
// than keepID, whatever their ifname (an empty one, written before whereabouts
// v0.8, too). It never picks keepID's own, nor another pod's.
func EarlierSandboxes(podRef, keepID string) Picker {
	return func(allocs map[string]whereaboutsv1alpha1.IPAllocation) []string {
		if podRef == "" || keepID == "" {
			return nil
		}
		var out []string
		for off, a := range allocs {
			if a.PodRef == podRef && a.ContainerID != keepID {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}

// Attachment picks the allocation of one attachment, (containerID, ifName).
// An entry of that container without an ifname (written before whereabouts
// v0.8) is the attachment's too, when no entry names the ifname exactly.
func Attachment(containerID, ifName string) Picker {
	return func(allocs map[string]whereaboutsv1alpha1.IPAllocation) []string {
		if containerID == "" {
			return nil
		}
		var exact, legacy []string
		for off, a := range allocs {
			if a.ContainerID != containerID {
				continue
			}
			switch a.IfName {
			case ifName:
				exact = append(exact, off)
			case "":
				legacy = append(legacy, off)
			}
		}
		if len(exact) > 0 {
			sort.Strings(exact)
			return exact
		}
		sort.Strings(legacy)
		return legacy
	}
}

// Exactly picks the given entries only while each is still what the caller
// saw: same container ID, podref and ifname. A reconciler judges staleness on
// a snapshot; an entry that changed since is no longer the one it judged.
func Exactly(want map[string]whereaboutsv1alpha1.IPAllocation) Picker {
	return func(allocs map[string]whereaboutsv1alpha1.IPAllocation) []string {
		var out []string
		for off, w := range want {
			if a, ok := allocs[off]; ok && a == w {
				out = append(out, off)
			}
		}
		sort.Strings(out)
		return out
	}
}
