package reconcile

import (
	"fmt"
	"math/big"
	"net"
	"sort"
	"strings"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// NAD is a NetworkAttachmentDefinition as the reconciler reads it: where it
// is, and its CNI config (spec.config).
type NAD struct {
	Namespace, Name string
	Config          string
}

func (n NAD) ref() string { return n.Namespace + "/" + n.Name }

// nadRange is one range a NAD's whereabouts IPAM allocates from.
type nadRange struct {
	nad string // namespace/name
	conf.Range
}

// NADs is what the NADs say about the pools: which NAD names each pool, with
// what bounds and excludes. A pool's name is all it is matched by: a NAD
// names the pool whereabouts would keep its range in (conf/names.Pool),
// whatever pool namespace its kubeconfig picks, so a pool that any NAD could
// mean is named.
type NADs struct {
	// Known says the NADs were listed and every whereabouts one was read:
	// only then can a pool be said to be named by none.
	Known bool
	// Err is why they are not known.
	Err error
	// Count is how many NADs allocate from whereabouts' pools.
	Count   int
	byPool  map[string][]nadRange
	slicers []string // network_name of NADs with node_slice_size
}

// IndexNADs indexes the NADs a Cluster listed; listErr is the list's error
// (no CRD, forbidden, unreachable): then nothing is known. A NAD whose
// config cannot be read may be a whereabouts one naming any pool, so it
// makes the index not Known too, while the NADs that could be read still
// give their pools' sizes.
func IndexNADs(nads []NAD, listErr error) *NADs {
	x := &NADs{byPool: map[string][]nadRange{}}
	if listErr != nil {
		x.Err = listErr
		return x
	}
	var broken []string
	for _, n := range nads {
		ipams, err := conf.NetworkIPAMs([]byte(n.Config))
		if err != nil {
			broken = append(broken, fmt.Sprintf("%s: %v", n.ref(), err))
		}
		if len(ipams) > 0 {
			x.Count++
		}
		for _, ipam := range ipams {
			if ipam.NodeSliceSize != "" {
				x.slicers = append(x.slicers, ipam.NetworkName)
			}
			for _, r := range ipam.Ranges {
				x.byPool[r.Pool] = append(x.byPool[r.Pool], nadRange{nad: n.ref(), Range: r})
			}
		}
	}
	sort.Strings(broken)
	if len(broken) > 0 {
		x.Err = fmt.Errorf("NADs that cannot be read: %s", strings.Join(broken, "; "))
		return x
	}
	x.Known = true
	return x
}

// Naming are the NADs that name a pool, by namespace/name.
func (x *NADs) Naming(p *shim.Pool) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range x.byPool[p.Name] {
		if !seen[r.nad] {
			seen[r.nad] = true
			out = append(out, r.nad)
		}
	}
	sort.Strings(out)
	return out
}

// Orphaned says that no NAD names the pool, as far as can be known: never
// when the NADs are not known, and never for a pool that a node-sliced
// network (whereabouts v0.9's node_slice_size, whose pools are named by node)
// may own.
func (x *NADs) Orphaned(p *shim.Pool) bool {
	if x == nil || !x.Known || len(x.byPool[p.Name]) > 0 {
		return false
	}
	for _, network := range x.slicers {
		if names.MayHoldReservationsOf(p.Name, p.Spec.Range, network) {
			return false
		}
	}
	return true
}

// Usage is how full a pool is: what whereabouts may still hand out of it.
type Usage struct {
	// Size counts the addresses whereabouts may hand out: the range's usable
	// addresses (neither the network's nor the broadcast address), within
	// range_start and range_end, without the excludes.
	Size *big.Int
	// InUse counts the entries at those addresses: entries elsewhere (an
	// exclude added since) take nothing from Size.
	InUse int
	// Free is Size - InUse, never negative.
	Free *big.Int
	// Reclaimable counts the stale entries among InUse: what a pass of the
	// reconciler gives back.
	Reclaimable int
	// NAD is the NAD the bounds and excludes are from (of several naming the
	// pool, the one that leaves the fewest free); "" when no NAD naming the
	// pool was read: Size is then the range's.
	NAD string
}

// Usage measures a pool as the NADs that name it allocate from it, judged
// with its verdicts (for Reclaimable). A pool named by several NADs with
// different bounds is as full as the fullest: a pod of that NAD is the one
// that fails first.
func (x *NADs) Usage(p *shim.Pool, verdicts []Verdict) Usage {
	var ranges []nadRange
	if x != nil {
		ranges = x.byPool[p.Name]
	}
	if len(ranges) == 0 {
		return measure(p.Spec.Range, conf.Range{Range: p.Spec.Range}, verdicts, "")
	}
	var best Usage
	for i, r := range ranges {
		u := measure(p.Spec.Range, r.Range, verdicts, r.nad)
		if i == 0 || u.Free.Cmp(best.Free) < 0 || (u.Free.Cmp(best.Free) == 0 && u.Size.Cmp(best.Size) < 0) {
			best = u
		}
	}
	return best
}

// span is a closed interval of addresses, as numbers.
type span struct{ lo, hi *big.Int }

// measure counts what whereabouts (pkg/allocate.IterateForAssignment) may
// hand out of the pool's range cidr under r's bounds and excludes.
func measure(cidr string, r conf.Range, verdicts []Verdict, nad string) Usage {
	u := Usage{Size: new(big.Int), Free: new(big.Int), NAD: nad}
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return u
	}
	ones, bits := n.Mask.Size()
	if bits-ones < 2 {
		return u // whereabouts finds no usable address in a /31 or /32 (/127, /128)
	}
	base := ipInt(n.IP)
	hostSize := new(big.Int).Lsh(big.NewInt(1), uint(bits-ones))
	lo := new(big.Int).Add(base, big.NewInt(1))
	hi := new(big.Int).Sub(new(big.Int).Add(base, hostSize), big.NewInt(2))
	// range_start, then range_end, count only within the usable part, as
	// whereabouts' GetIPRange reads them.
	if r.Start != nil && sameFamily(r.Start, n.IP) {
		if s := ipInt(r.Start); s.Cmp(lo) >= 0 && s.Cmp(hi) <= 0 {
			lo = s
		}
	}
	if r.End != nil && sameFamily(r.End, n.IP) {
		if e := ipInt(r.End); e.Cmp(lo) >= 0 && e.Cmp(hi) <= 0 {
			hi = e
		}
	}
	if hi.Cmp(lo) < 0 {
		return u
	}
	var excluded []span
	for _, x := range r.Exclude {
		xn := excludeNet(x)
		if xn == nil || !sameFamily(xn.IP, n.IP) {
			continue
		}
		xo, xb := xn.Mask.Size()
		s := ipInt(xn.IP)
		e := new(big.Int).Sub(new(big.Int).Add(s, new(big.Int).Lsh(big.NewInt(1), uint(xb-xo))), big.NewInt(1))
		if s.Cmp(lo) < 0 {
			s = lo
		}
		if e.Cmp(hi) > 0 {
			e = hi
		}
		if s.Cmp(e) <= 0 {
			excluded = append(excluded, span{s, e})
		}
	}
	excluded = merge(excluded)
	u.Size.Sub(hi, lo).Add(u.Size, big.NewInt(1))
	for _, s := range excluded {
		u.Size.Sub(u.Size, new(big.Int).Add(new(big.Int).Sub(s.hi, s.lo), big.NewInt(1)))
	}
	for _, v := range verdicts {
		if !sameFamily(v.IP, n.IP) {
			continue
		}
		a := ipInt(v.IP)
		if a.Cmp(lo) < 0 || a.Cmp(hi) > 0 || inSpans(a, excluded) {
			continue
		}
		u.InUse++
		if v.Stale() {
			u.Reclaimable++
		}
	}
	u.Free.Sub(u.Size, big.NewInt(int64(u.InUse)))
	if u.Free.Sign() < 0 {
		u.Free.SetInt64(0)
	}
	return u
}

// excludeNet reads an exclude as whereabouts does: a CIDR, or an address
// standing for itself alone.
func excludeNet(s string) *net.IPNet {
	if _, n, err := net.ParseCIDR(s); err == nil {
		return n
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return nil
	}
	if v4 := ip.To4(); v4 != nil {
		return &net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(128, 128)}
}

func merge(spans []span) []span {
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo.Cmp(spans[j].lo) < 0 })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 && s.lo.Cmp(new(big.Int).Add(out[n-1].hi, big.NewInt(1))) <= 0 {
			if s.hi.Cmp(out[n-1].hi) > 0 {
				out[n-1].hi = s.hi
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

func inSpans(a *big.Int, spans []span) bool {
	for _, s := range spans {
		if a.Cmp(s.lo) >= 0 && a.Cmp(s.hi) <= 0 {
			return true
		}
	}
	return false
}

func ipInt(ip net.IP) *big.Int {
	if v4 := ip.To4(); v4 != nil {
		return new(big.Int).SetBytes(v4)
	}
	return new(big.Int).SetBytes(ip.To16())
}

func sameFamily(a, b net.IP) bool { return (a.To4() == nil) == (b.To4() == nil) }
