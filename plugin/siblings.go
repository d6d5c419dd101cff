package plugin

import (
	"net"

	"github.com/harvester/harvester-ipam/plugin/checkpoint"
)

// siblings is what a sandbox's other attachments recorded, by pool: the
// addresses each recorded, and whether one recorded none (its ADD before
// its first choice, or after a crash: its entry cannot be told from
// another's). On a CRD that prunes the ifname (whereabouts v0.7.0) the
// container's entries are told apart only by these.
type siblings struct {
	ips    map[poolKey][]net.IP
	unsure map[poolKey]bool
	// unread: a record of the container did not read; every pool is unsure.
	unread bool
}

type poolKey struct{ namespace, pool string }

// readSiblings reads the records of containerID's attachments other than
// ifName, and returns them with the errors of those that did not read.
func readSiblings(cp checkpoint.Dir, containerID, ifName string) (siblings, []checkpoint.Record, []error) {
	s := siblings{ips: map[poolKey][]net.IP{}, unsure: map[poolKey]bool{}}
	recs, errs := cp.OfContainer(containerID)
	s.unread = len(errs) > 0
	var own []checkpoint.Record
	for _, rec := range recs {
		if rec.IfName == ifName {
			own = append(own, rec)
			continue
		}
		for _, pl := range rec.Pools {
			k := poolKey{rec.Namespace, pl.Name}
			if len(rec.IPs) == 0 {
				s.unsure[k] = true
			}
			s.ips[k] = append(s.ips[k], rec.Addresses()...)
		}
	}
	return s, own, errs
}

// of are the addresses the siblings recorded for a pool.
func (s siblings) of(namespace, pool string) []net.IP { return s.ips[poolKey{namespace, pool}] }

// unsureOf says whether a sibling's entry in a pool may be at an address
// it did not record.
func (s siblings) unsureOf(namespace, pool string) bool {
	return s.unread || s.unsure[poolKey{namespace, pool}]
}
