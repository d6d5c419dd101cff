package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// TestNoSharedAddressAcrossNonOverlappingPools is issue 44's second
// reproduction: two NADs with overlapping ranges and
// enable_overlapping_ranges: false each hand out 10.0.50.1 from their own
// pool, as whereabouts does by design (its allocator consults the
// reservations only when the option is on: pkg/storage/kubernetes/ipam.go,
// IPManagement, v0.7.0 to v0.9.4; a flat file cannot turn it on or off,
// pkg/config LoadIPAMConfig keeps the NAD's), to one healthy Running pod
// each. That is no SharedAddress, and no pod is told to be deleted.
func TestNoSharedAddressAcrossNonOverlappingPools(t *testing.T) {
	off := map[string]any{"enable_overlapping_ranges": false}
	a, b := "default/rwx-a", "default/rwx-b"
	s := Snapshot{
		NADs:          []reconcile.NAD{nad(a, "10.0.50.0/24", off), nad(b, "10.0.50.0/28", off)},
		PoolNamespace: "kube-system",
		Pools: []shim.Pool{pool("10.0.50.0-24", "10.0.50.0/24", "1=default/vm-a#ca"),
			pool("10.0.50.0-28", "10.0.50.0/28", "1=default/vm-b#cb")},
		Nodes: 2,
	}
	for _, p := range []podSpec{
		{ref: "default/vm-a", phase: corev1.PodRunning, asks: []string{a}, status: map[string][]string{a: {"10.0.50.1"}}},
		{ref: "default/vm-b", phase: corev1.PodRunning, asks: []string{b}, status: map[string][]string{b: {"10.0.50.1"}}, created: 1},
	} {
		s.Pods = append(s.Pods, p.build())
	}
	assert.Empty(t, got(Judge(s, Options{}).Findings), "each pool is its own: whereabouts shares the address by design")

	// With the option on (its default) the two pools are one network: the
	// same world is two pods on one address.
	s.NADs = []reconcile.NAD{nad(a, "10.0.50.0/24", nil), nad(b, "10.0.50.0/28", nil)}
	s.Reservations = []shim.Reservation{orip("10.0.50.1", "default/vm-a")}
	fs := got(Judge(s, Options{}).Findings)
	assert.Contains(t, fs, "SharedAddress "+a+" 10.0.50.1 default/vm-b,default/vm-a")
}
