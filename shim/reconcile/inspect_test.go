package reconcile

import (
	"bytes"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
)

// inspect's view has a section for stale entries and one for orphaned pools,
// each only when it has a row; a pool no NAD is known for shows "-", an
// orphaned one "none".
func TestWriteInspectShowsASectionOnlyWithRows(t *testing.T) {
	since := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	usage := func(size, free int64, nad string) Usage {
		return Usage{Size: big.NewInt(size), Free: big.NewInt(free), NAD: nad}
	}
	stale := Verdict{Allocation: shim.Allocation{Pool: "p1", Offset: "5", IP: net.ParseIP("10.0.0.5").To4(),
		IPAllocation: shim.IPAllocation{ContainerID: "dead", PodRef: lh + "/gone", IfName: "lhnet1"}}, Reason: PodGone}
	for _, tt := range []struct {
		name     string
		pools    []PoolSummary
		want     []string // lines, blanks collapsed
		wantNone []string
	}{
		{"nothing stale, nothing orphaned", []PoolSummary{{Name: "p1", Range: "10.0.0.0/24", Usage: usage(254, 253, ""), Allocated: 1}},
			[]string{"POOL RANGE SIZE ALLOCATED STALE FREE NAD", "p1 10.0.0.0/24 254 1 0 253 -"},
			[]string{"stale allocations", "POOL IP POD", "pools no NAD names"}},
		{"a stale entry", []PoolSummary{{Name: "p1", Range: "10.0.0.0/24", Usage: usage(254, 253, "harvester-system/sn"), Allocated: 1, Stale: 1, Stales: []Verdict{stale}}},
			[]string{"p1 10.0.0.0/24 254 1 1 253 harvester-system/sn",
				"stale allocations (released by a pass once stale for the grace period):",
				"POOL IP POD CONTAINER IFNAME REASON", "p1 10.0.0.5 " + lh + "/gone dead lhnet1 pod gone"},
			[]string{"pools no NAD names"}},
		{"orphaned pools, one sighted", []PoolSummary{
			{Name: "p2", Range: "10.2.0.0/24", Usage: usage(254, 254, ""), Orphaned: true, OrphanedSince: since},
			{Name: "p3", Range: "10.3.0.0/24", Usage: usage(254, 252, ""), Allocated: 2, Orphaned: true}},
			[]string{"p2 10.2.0.0/24 254 0 0 254 none",
				"POOL RANGE ENTRIES LIVE ORPHANED SINCE",
				"p2 10.2.0.0/24 0 0 2026-11-21T12:00:00Z", "p3 10.3.0.0/24 2 2 not recorded"},
			[]string{"stale allocations"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			WriteInspect(&b, &Inspection{Namespace: "kube-system", Pools: tt.pools, NADs: &NADs{Known: true}})
			var lines []string
			for _, l := range strings.Split(b.String(), "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			for _, w := range tt.want {
				assert.Contains(t, lines, w)
			}
			for _, w := range tt.wantNone {
				assert.NotContains(t, b.String(), w)
			}
		})
	}
}

// Past MaxRows the rest are counted by reason and action. (Found by the
// mutation tests: the count read the rows after they were cut to MaxRows,
// and never printed.)
func TestWriteRowsCountsTheRowsPastMaxRows(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	var many []Row
	for i := 0; i < MaxRows+3; i++ {
		r := Row{Kind: "allocation", Pool: "p", IP: "10.0.0." + strconv.Itoa(i), PodRef: "ns/x", Reason: PodGone, Action: "release"}
		if i == MaxRows+2 {
			r.Reason, r.Action = NodeGone, "wait 1m0s"
		}
		many = append(many, r)
	}
	var out bytes.Buffer
	WriteRows(&out, many, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 1+MaxRows+1, "the header, MaxRows rows, and the count of the rest")
	assert.Equal(t, "... and 3 more: 1 node gone, wait 1m0s; 2 pod gone, release", lines[len(lines)-1])
}
