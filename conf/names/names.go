// Package names makes, and reads back, the names whereabouts gives its
// objects: the IPPool of a range, the OverlappingRangeIPReservation of an
// address, its Lease. It is the one place these names are built, so that the
// plugin, the reconciler and the tests agree with whereabouts and with each
// other; tests hold it equal to whereabouts' own functions. It imports nothing
// heavy: the plugin links it.
package names

import (
	"net"
	"strings"
)

// Lease is the coordination.k8s.io Lease, in the pool namespace, on which
// whereabouts serialises its ADD and DEL (without node_slice_size).
const Lease = "whereabouts"

// normalize turns a range or an address into a name part: IPv6 colons become
// dashes (a trailing one gets a 0), and a CIDR's slash becomes a dash.
func normalize(s string) string {
	if strings.HasSuffix(s, ":") {
		s += "0"
	}
	s = strings.ReplaceAll(s, ":", "-")
	return strings.ReplaceAll(s, "/", "-")
}

// Pool is the IPPool whereabouts keeps a range in: "192.168.50.0/24" ->
// "192.168.50.0-24", "fd00:10::/64" -> "fd00-10---64", and with a
// network_name, "blue-192.168.50.0-24" (whereabouts' IPPoolName).
func Pool(ipRange, networkName string) string {
	if networkName == "" {
		return normalize(ipRange)
	}
	return networkName + "-" + normalize(ipRange)
}

// Reservation is the OverlappingRangeIPReservation whereabouts creates for an
// address: "192.168.50.4", "fd00-10--5", "blue-192.168.50.4" (whereabouts'
// NormalizeIP).
func Reservation(ip net.IP, networkName string) string {
	s := normalize(ip.String())
	if networkName == "" {
		return s
	}
	return networkName + "-" + s
}

// PoolPrefix is what a pool's name puts before its range: the network_name,
// or with whereabouts v0.9's node_slice_size, "<network_name>-<node>" (or the
// node alone for an unnamed network). ok is false for a name that does not
// end in its range: a pool whereabouts did not name.
func PoolPrefix(poolName, ipRange string) (prefix string, ok bool) {
	base := normalize(ipRange)
	if poolName == base {
		return "", true
	}
	prefix, ok = strings.CutSuffix(poolName, "-"+base)
	return prefix, ok && prefix != ""
}

// MayHoldReservationsOf says whether a pool may hold the addresses whose
// reservations whereabouts names under networkName: a pool of that network,
// or a node slice of it. In doubt (an unnamed network's node slices carry a
// node name as prefix; a pool named otherwise), it says yes: callers use it to
// keep a reservation, never to free one.
func MayHoldReservationsOf(poolName, ipRange, networkName string) bool {
	prefix, ok := PoolPrefix(poolName, ipRange)
	if !ok || networkName == "" {
		return true
	}
	return prefix == networkName || strings.HasPrefix(prefix, networkName+"-")
}

// ReservationNetworks are the network names under which a pool's addresses
// may be reserved: its prefix and each shorter dash-separated prefix of it
// (a node slice "blue-node1" reserves under "blue"), and the unnamed network.
// In doubt it names more, never fewer: the reconciler uses it to see that a
// reservation is held.
func ReservationNetworks(poolName, ipRange string) []string {
	prefix, ok := PoolPrefix(poolName, ipRange)
	if !ok {
		prefix = poolName
	}
	out := []string{""}
	for i := 0; i < len(prefix); i++ {
		if prefix[i] == '-' && i > 0 {
			out = append(out, prefix[:i])
		}
	}
	if prefix != "" {
		out = append(out, prefix)
	}
	return out
}

// IsReservationOf says whether name is the reservation whereabouts names for
// some address under networkName (Reservation(ip, networkName) == name).
func IsReservationOf(name, networkName string) bool {
	s := name
	if networkName != "" {
		var ok bool
		if s, ok = strings.CutPrefix(name, networkName+"-"); !ok {
			return false
		}
	}
	text := s
	if !strings.Contains(s, ".") {
		text = strings.ReplaceAll(s, "-", ":") // IPv6
	}
	ip := net.ParseIP(text)
	return ip != nil && Reservation(ip, networkName) == name
}
