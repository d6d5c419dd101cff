package watch

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// Collector makes the audit's series from the last look at each scrape: a
// network that is gone is gone from them. The chart's alerts and dashboard
// use these names.
type Collector struct {
	mu       sync.Mutex
	open     []audit.Open
	figures  []audit.Figures
	networks []string
	looked   bool
	// following: at the last look every informer followed the cluster
	// (known once a look was tried).
	following, tried bool
}

var (
	findingsDesc = prometheus.NewDesc("harvester_ipam_audit_findings",
		"Open audit findings (seen in two looks, for longer than their grace) by kind and network (NAD namespace/name; \"none\": a pool no NAD names). Zero for every kind of every whereabouts network judged.",
		[]string{"kind", "network"}, nil)
	freeDesc = prometheus.NewDesc("harvester_ipam_audit_free",
		"Addresses whereabouts can still hand out on the network (every pool of its NAD), for networks Longhorn's pods use.",
		[]string{"network"}, nil)
	followingDesc = prometheus.NewDesc("harvester_ipam_audit_following",
		"1 when every informer the audit reads followed the cluster at the last look; 0 while one does not (an API server restart, each reconnecting on its own backoff): the audit judges nothing meanwhile, and the findings series show the last look it judged.",
		nil, nil)
	needDesc = prometheus.NewDesc("harvester_ipam_audit_need",
		"Addresses the network's Longhorn pods need at once: max(nodes, instance managers) + share managers + backing-image managers using it (docs/audit.md).",
		[]string{"network"}, nil)
)

// NewCollector is empty until the first look.
func NewCollector() *Collector { return &Collector{} }

func (c *Collector) set(open []audit.Open, figures []audit.Figures, networks []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open, c.figures, c.networks, c.looked = open, figures, networks, true
}

func (c *Collector) setFollowing(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.following, c.tried = ok, true
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- followingDesc
	ch <- findingsDesc
	ch <- freeDesc
	ch <- needDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tried {
		v := 0.0
		if c.following {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(followingDesc, prometheus.GaugeValue, v)
	}
	if !c.looked {
		return
	}
	type key struct{ kind, network string }
	counts := map[key]int{}
	for _, n := range c.networks {
		for _, k := range audit.Kinds {
			counts[key{string(k), n}] = 0
		}
	}
	for _, o := range c.open {
		counts[key{string(o.Kind), o.Network}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(findingsDesc, prometheus.GaugeValue, float64(n), k.kind, k.network)
	}
	for _, f := range c.figures {
		ch <- prometheus.MustNewConstMetric(freeDesc, prometheus.GaugeValue, float64(f.Free), f.Network)
		ch <- prometheus.MustNewConstMetric(needDesc, prometheus.GaugeValue, float64(f.Need), f.Network)
	}
}
