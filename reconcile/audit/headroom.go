package audit

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// Longhorn's components on a network, by their label longhorn.io/component
// (or, without it, the start of their name).
const (
	componentLabel      = "longhorn.io/component"
	instanceManager     = "instance-manager"
	shareManager        = "share-manager"
	backingImageManager = "backing-image-manager"
)

func component(p *corev1.Pod) string {
	if c := p.Labels[componentLabel]; c != "" {
		return c
	}
	for _, c := range []string{instanceManager, shareManager, backingImageManager} {
		if strings.HasPrefix(p.Name, c+"-") {
			return c
		}
	}
	return ""
}

// headroom measures, for each network Longhorn's pods use, its free
// addresses against their need:
//
//	need = max(nodes, instance managers) + share managers + backing-image managers
//
// counting the live pods of the Longhorn namespace whose networks annotation
// asks for the network: one instance manager per node at least, and every
// share- and backing-image manager running. An upgrade starts each new
// instance manager beside the old one, and a share manager moves by a new
// pod beside the old: what is free must hold them all once more. A network
// whose free addresses are fewer is a Headroom finding; a new node adds one
// instance manager to the need.
func (x *index) headroom(nodes int, o Options) ([]Finding, []Figures) {
	type count struct{ ims, sms, bims int }
	counts := map[string]*count{}
	for ref, p := range x.pods {
		if p.Namespace != o.LonghornNamespace || !live(p) {
			continue
		}
		c := component(p)
		if c == "" {
			continue
		}
		for _, r := range dedupeRequests(x.requests[ref]) {
			if x.nets[r] == nil {
				continue
			}
			if counts[r] == nil {
				counts[r] = &count{}
			}
			switch c {
			case instanceManager:
				counts[r].ims++
			case shareManager:
				counts[r].sms++
			case backingImageManager:
				counts[r].bims++
			}
		}
	}
	refs := make([]string, 0, len(counts))
	for ref := range counts {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	var out []Finding
	figs := make([]Figures, 0, len(refs))
	for _, ref := range refs {
		c, nw := counts[ref], x.nets[ref]
		need := int64(max(nodes, c.ims) + c.sms + c.bims)
		free := x.free(nw)
		figs = append(figs, Figures{Network: ref, Free: free, Need: need})
		// A finding once the next node would find no address: free must
		// hold what the pods need at once and one instance manager more.
		if free > need {
			continue
		}
		nodesSaid := fmt.Sprintf("%d nodes", nodes)
		if nodes < 0 {
			nodesSaid = "nodes unknown"
		}
		out = append(out, Finding{Kind: Headroom, Network: ref, Pool: first(nw.pools), Free: free, Need: need,
			Message: fmt.Sprintf("network %s has %d free addresses; its Longhorn pods need %d at once (max(%s, %d instance managers) + %d share managers + %d backing-image managers), and a new node one more: an upgrade, which starts each new instance manager beside the old, or the next node may find no address. Release its stale entries (the command below shows them) or widen the range before either.",
				ref, free, need, nodesSaid, c.ims, c.sms, c.bims),
			Command: fmt.Sprintf("%s inspect --need %d", o.Diagnose, need)})
	}
	return out, figs
}

// free counts what whereabouts may still hand out of a network's pools (a
// pool not made yet: its whole range), as reconcile measures it.
func (x *index) free(nw *network) int64 {
	if x.verdicts == nil {
		x.byName = make(map[string]*shim.Pool, len(x.pools))
		for _, p := range x.pools {
			x.byName[p.Name] = p
		}
		x.verdicts = map[string][]reconcile.Verdict{}
		for _, e := range x.entries {
			x.verdicts[e.Pool] = append(x.verdicts[e.Pool], reconcile.Verdict{Allocation: e.Allocation})
		}
	}
	total := new(big.Int)
	for i, name := range nw.pools {
		p := x.byName[name]
		if p == nil {
			p = &shim.Pool{}
			p.Name, p.Spec.Range = name, nw.ranges[i]
		}
		total.Add(total, x.nads.Usage(p, x.verdicts[name]).Free)
	}
	if !total.IsInt64() {
		return math.MaxInt64
	}
	return total.Int64()
}

func dedupeRequests(rs []request) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.nad)
	}
	return dedupe(out)
}
