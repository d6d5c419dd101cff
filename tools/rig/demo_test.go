package main

import (
	"net"
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// The demo is a product claim: a scenario that does not come out as claimed
// must fail it, whichever side is wrong.
func TestRowFailures(t *testing.T) {
	for _, tt := range []struct {
		name       string
		aloneLeaks bool
		alone, hi  tally
		problems   []string
		want       int
	}{
		{"as claimed", true, tally{2, 1}, tally{1, 1}, nil, 0},
		{"harvester-ipam leaked", true, tally{2, 1}, tally{2, 1}, nil, 1},
		{"whereabouts alone did not leak", true, tally{1, 1}, tally{1, 1}, nil, 1},
		{"whereabouts alone leaked where it should not", false, tally{2, 1}, tally{1, 1}, nil, 1},
		{"an invariant broken", false, tally{1, 1}, tally{1, 1}, []string{"no reservation"}, 1},
	} {
		r := row{delegate: testcni.V093, name: tt.name, alone: tt.alone, shimmed: tt.hi, aloneLeaks: tt.aloneLeaks, problems: tt.problems}
		if got := r.failures(); len(got) != tt.want {
			t.Errorf("%s: %d failures %q, want %d", tt.name, len(got), got, tt.want)
		}
	}
}

func TestTallyOf(t *testing.T) {
	pod := longhorn("instance-manager-a")
	other := longhorn("instance-manager-b")
	entry := func(ip, id, podRef, ifName string) shim.Allocation {
		return shim.Allocation{IP: net.ParseIP(ip), IPAllocation: whereaboutsv1alpha1.IPAllocation{ContainerID: id, PodRef: podRef, IfName: ifName}}
	}
	allocs := []shim.Allocation{
		entry("10.0.0.3", "old", pod.Ref(), ""),       // v0.7.0's, a dead sandbox
		entry("10.0.0.4", "cur", pod.Ref(), "lhnet1"), // the live sandbox's
		entry("10.0.0.5", "cur", pod.Ref(), "lhnet2"), // the live sandbox, another interface
		entry("10.0.0.6", "x", other.Ref(), "lhnet1"), // not the scenario's pod
		entry("10.0.0.7", "cur2", pod.Ref(), ""),      // no ifname: counts for its container
	}
	got := tallyOf(allocs, []testcni.Pod{pod}, map[string]string{"cur": "lhnet1", "cur2": "lhnet1"})
	if want := (tally{held: 4, live: 2}); got != want {
		t.Errorf("tallyOf = %+v, want %+v", got, want)
	}
}
