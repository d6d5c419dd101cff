package conf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"

	netutils "k8s.io/utils/net"

	"github.com/harvester/harvester-ipam/conf/names"
)

// Range is one range of an ipam object as whereabouts allocates from it:
// its pool, the CIDR, the bounds range_start and range_end put on it, and
// its excludes.
type Range struct {
	// Pool is the IPPool whereabouts keeps the range in (names.Pool).
	Pool string
	// Range is the CIDR, canonical ("192.168.50.0/24"), as the pool records it.
	Range string
	// Start and End are range_start and range_end (or the two ends of a
	// "first-last/prefix" range); nil when unset.
	Start, End net.IP
	// Exclude are the range's excludes as written (CIDRs or addresses).
	Exclude []string
}

// IPAM is what IPAMRanges reads of an ipam object.
type IPAM struct {
	Type        string
	NetworkName string
	// NodeSliceSize is whereabouts v0.9's node_slice_size: its allocations
	// live in per-node pools, not in Ranges' pools.
	NodeSliceSize string
	Ranges        []Range
}

// IsWhereabouts says whether an ipam type allocates from whereabouts'
// pools: whereabouts itself, or harvester-ipam in front of it.
func IsWhereabouts(ipamType string) bool {
	return ipamType == DefaultDelegate || ipamType == PluginType
}

// IPAMRanges reads the ranges of an ipam JSON object as whereabouts' loader
// (pkg/config.LoadIPAMConfig) reads them: "range" (also
// "first-last/prefix") with range_start, range_end and exclude, then each
// of ipRanges with its own; network_name names the pools. Unlike Load it
// opens no file and needs no kubeconfig: the reconciler reads NADs with it.
// It does not merge whereabouts' flat file, which may only add defaults
// (an exclude set there and nowhere in the NAD is not seen).
func IPAMRanges(ipam []byte) (IPAM, error) {
	type rng struct {
		Range      string   `json:"range"`
		RangeStart string   `json:"range_start"`
		RangeEnd   string   `json:"range_end"`
		Exclude    []string `json:"exclude"`
	}
	var in struct {
		Type          string `json:"type"`
		NetworkName   string `json:"network_name"`
		NodeSliceSize string `json:"node_slice_size"`
		rng
		IPRanges []rng `json:"ipRanges"`
	}
	var out IPAM
	if err := json.Unmarshal(ipam, &in); err != nil {
		return out, fmt.Errorf("ipam: %w", err)
	}
	out.Type, out.NetworkName, out.NodeSliceSize = in.Type, in.NetworkName, in.NodeSliceSize
	all := in.IPRanges
	if in.Range != "" {
		all = append([]rng{in.rng}, all...)
	}
	for _, r := range all {
		parsed, err := parseRange(r.Range, r.RangeStart, r.RangeEnd)
		if err != nil {
			return out, err
		}
		parsed.Exclude = r.Exclude
		parsed.Pool = names.Pool(parsed.Range, in.NetworkName)
		out.Ranges = append(out.Ranges, parsed)
	}
	return out, nil
}

// parseRange reads one range as whereabouts' loader does.
func parseRange(s, start, end string) (Range, error) {
	var r Range
	if first, cidr, ok := strings.Cut(s, "-"); ok {
		startIP := netutils.ParseIPSloppy(first)
		if startIP == nil {
			return r, fmt.Errorf("range %q: invalid start address %q", s, first)
		}
		last, n, err := netutils.ParseCIDRSloppy(cidr)
		if err != nil {
			return r, fmt.Errorf("range %q: %w", s, err)
		}
		if !n.Contains(startIP) {
			return r, fmt.Errorf("range %q: %s is outside %s", s, startIP, n)
		}
		return Range{Range: n.String(), Start: startIP, End: last}, nil
	}
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return r, fmt.Errorf("range %q: %w", s, err)
	}
	r.Range = n.String()
	// whereabouts reads range_start and range_end as addresses and ignores
	// them when they fall outside the range's usable part.
	if start != "" {
		if r.Start = netutils.ParseIPSloppy(start); r.Start == nil {
			return r, fmt.Errorf("range %s: range_start %q is not an address", s, start)
		}
	}
	if end != "" {
		if r.End = netutils.ParseIPSloppy(end); r.End == nil {
			return r, fmt.Errorf("range %s: range_end %q is not an address", s, end)
		}
	}
	return r, nil
}

// NetworkIPAMs reads the whereabouts ipam objects (IsWhereabouts) of a CNI
// network config, a single plugin's ("ipam" at the top) or a conflist's
// (each of "plugins"); other IPAMs are skipped unread.
func NetworkIPAMs(config []byte) ([]IPAM, error) {
	var top struct {
		IPAM    json.RawMessage   `json:"ipam"`
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(config, &top); err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	raws := []json.RawMessage{top.IPAM}
	for _, p := range top.Plugins {
		var plugin struct {
			IPAM json.RawMessage `json:"ipam"`
		}
		if err := json.Unmarshal(p, &plugin); err != nil {
			return nil, fmt.Errorf("network config plugin: %w", err)
		}
		raws = append(raws, plugin.IPAM)
	}
	var out []IPAM
	for _, raw := range raws {
		if len(raw) == 0 || isNull(raw) || !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
			continue
		}
		var typed struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(raw, &typed); err != nil {
			return out, fmt.Errorf("ipam.type: %w", err)
		}
		if !IsWhereabouts(typed.Type) {
			continue
		}
		ipam, err := IPAMRanges(raw)
		if err != nil {
			return out, err
		}
		out = append(out, ipam)
	}
	return out, nil
}
