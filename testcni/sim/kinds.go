package sim

import (
	"math/rand/v2"
	"strings"
)

// The NADs whereabouts users make beside Harvester's storage network, each
// in some of the schedules (Options.NADKinds), with pods of their own:
//
//   - two pools, one network: a NAD with both range and ipRanges, an
//     address of each per attachment, now and then under a network_name,
//     now and then the second network of a pod on the storage network
//     (where Multus' partial network-status may leave it out);
//   - dual stack: ipRanges alone, an IPv4 and an IPv6 range;
//   - reservations off: two NADs on overlapping ranges with
//     enable_overlapping_ranges: false, a pod on each: whereabouts then
//     hands each the same address from its own pool, by design, which
//     neither the safety check nor the audit may call two pods on one
//     address.
//
// Which kinds a schedule has is drawn from a random source of its own, as
// the pods' nodes are: a schedule without any plays the story it played
// before the kinds joined the model.

// nadKind is one kind of NAD: what it adds to the world.
type nadKind struct {
	name string
	add  func(w *world, r *rand.Rand)
}

// nadKinds are the kinds, each in a schedule with probability kindChance.
var nadKinds = []nadKind{
	{"two pools, one network", addTwoPools},
	{"dual stack", addDualStack},
	{"reservations off, overlapping", addReservationsOff},
}

const kindChance = 0.3

// addKinds adds the NAD kinds r draws, and says which.
func (w *world) addKinds(r *rand.Rand) []string {
	var added []string
	for _, k := range nadKinds {
		if r.Float64() < kindChance {
			k.add(w, r)
			added = append(added, k.name)
		}
	}
	if len(added) > 0 {
		w.tr.add("NADs beside the storage network: %s", strings.Join(added, "; "))
		for _, k := range added {
			w.stats["schedules with NADs of kind: "+k]++
		}
	}
	return added
}

// addTwoPools is a NAD with range and ipRanges: two pools, one network.
func addTwoPools(w *world, r *rand.Rand) {
	n := &network{name: "multinetwork", rng: "10.0.3.0/28", exclude: []string{"10.0.3.1/32"},
		more: []ipRange{{"10.0.4.0/28", []string{"10.0.4.1/32"}}}}
	if r.IntN(2) == 0 {
		n.netName = "multi"
	}
	w.addNet(n)
	p := w.newPod("vm-multi-f", w.nodes[r.IntN(len(w.nodes))].name)
	p.nets = map[string]*network{"net1": n}
	if r.IntN(2) == 0 {
		p.nets["lhnet1"] = w.nets[0]
	}
}

// addDualStack is a NAD of ipRanges alone, IPv4 and IPv6.
func addDualStack(w *world, r *rand.Rand) {
	n := &network{name: "dualnetwork", more: []ipRange{{"10.0.5.0/28", []string{"10.0.5.1/32"}}, {"fd00:5::/120", []string{"fd00:5::1/128"}}}}
	if r.IntN(2) == 0 {
		n.netName = "dual"
	}
	w.addNet(n)
	p := w.newPod("vm-dual-g", w.nodes[r.IntN(len(w.nodes))].name)
	p.nets = map[string]*network{"net1": n}
}

// addReservationsOff is two NADs on overlapping ranges, each with
// enable_overlapping_ranges: false, and a pod on each.
func addReservationsOff(w *world, r *rand.Rand) {
	a := &network{name: "rwx-a", rng: "10.0.2.0/27", exclude: []string{"10.0.2.1/32"}, noOverlap: true}
	b := &network{name: "rwx-b", rng: "10.0.2.0/28", exclude: []string{"10.0.2.1/32"}, noOverlap: true}
	w.addNet(a)
	w.addNet(b)
	first := r.IntN(len(w.nodes))
	pa := w.newPod("share-a-h", w.nodes[first].name)
	pa.nets = map[string]*network{"net1": a}
	pb := w.newPod("share-b-i", w.nodes[(first+r.IntN(2))%len(w.nodes)].name)
	pb.nets = map[string]*network{"net1": b}
}

// addNet adds a network of harvester-ipam's: CNI GC may run on it too.
func (w *world) addNet(n *network) {
	w.nets = append(w.nets, n)
	w.gcNets = append(w.gcNets, n)
}
