package reconcile

import (
	"bytes"
	"context"
	"errors"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
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
		{"a stale entry without ifname", []PoolSummary{{Name: "p1", Range: "10.0.0.0/24", Usage: usage(254, 253, ""), Allocated: 1, Stale: 1,
			Stales: []Verdict{func() Verdict { v := stale; v.IfName = ""; return v }()}}},
			[]string{"POOL IP POD CONTAINER IFNAME REASON", "p1 10.0.0.5 " + lh + "/gone dead - pod gone"}, nil},
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
	one := make([]Row, MaxRows+1)
	for i := range one {
		one[i] = Row{Kind: "allocation", Pool: "p", IP: "10.0.1." + strconv.Itoa(i), PodRef: "ns/x", Reason: PodGone, Action: "release"}
	}
	var b bytes.Buffer
	WriteRows(&b, one, now)
	assert.True(t, strings.HasSuffix(b.String(), "\n... and 1 more: 1 pod gone, release\n"), "one row past MaxRows is counted too")

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

func TestWriteRows(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	WriteRows(&out, nil, now)
	assert.Equal(t, "nothing stale\n", out.String())

	rows := []Row{
		{Kind: "allocation", Pool: "p", IP: "10.0.0.4", PodRef: "ns/a", Container: "0123456789abcdef0123", IfName: "", Reason: PodGone, Since: now.Add(-90 * time.Second), Action: "release"},
		{Kind: "reservation", Pool: "-", IP: "10.0.0.9", PodRef: "ns/b", Container: "", IfName: "lhnet1", Reason: OrphanedORIP, Action: "wait 10m0s"},
		{Kind: "allocation", Pool: "p", IP: "10.0.0.5", PodRef: "ns/c", Container: "0123456789abcdef", IfName: "lhnet1", Reason: PodGone, Since: now, Action: "wait 10m0s"},
		{Kind: "allocation", Pool: "p", IP: "10.0.0.6", PodRef: "ns/d", Container: "0123456789abcdef0", IfName: "lhnet1", Reason: PodGone, Since: now, Action: "wait 10m0s"},
	}
	out.Reset()
	WriteRows(&out, rows, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5)
	assert.Equal(t, "0123456789abcdef…", strings.Fields(lines[4])[4], "a 17-byte ID cut")
	assert.Equal(t, []string{"KIND", "POOL", "IP", "POD", "CONTAINER", "IFNAME", "REASON", "STALE", "FOR", "ACTION"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"allocation", "p", "10.0.0.4", "ns/a", "0123456789abcdef…", "-", "pod", "gone", "1m30s", "release"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"reservation", "-", "10.0.0.9", "ns/b", "-", "lhnet1", "no", "allocation", "holds", "its", "address", "for", "its", "pod", "first", "seen", "now", "wait", "10m0s"}, strings.Fields(lines[2]))
	assert.Equal(t, []string{"allocation", "p", "10.0.0.5", "ns/c", "0123456789abcdef", "lhnet1", "pod", "gone", "first", "seen", "now", "wait", "10m0s"}, strings.Fields(lines[3]), "a 16-byte ID whole")

	out.Reset()
	WriteRows(&out, rows[:1], now)
	assert.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), 2, "one row is a row: the header and it")

	// Up to MaxRows, every row is printed and nothing is summed up (past it:
	// TestWriteRowsCountsTheRowsPastMaxRows).
	var many []Row
	for i := 0; i < MaxRows; i++ {
		many = append(many, Row{Kind: "allocation", Pool: "p", IP: "10.0.0." + strconv.Itoa(i), PodRef: "ns/x", Reason: PodGone, Action: "release"})
	}
	out.Reset()
	WriteRows(&out, many, now)
	assert.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), 1+MaxRows)
	assert.NotContains(t, out.String(), "more")
}

// inspect shows each pool's size and free with the NAD's excludes, the
// stale entries, and the pools no NAD names; --need names each pool that
// cannot fit N more, and what a pass would give back.
func TestInspectAndNeed(t *testing.T) {
	f := newFixture(t, running())
	f.api.Put(fake.NewPool("10.9.0.0-30", "10.9.0.0/30", map[string]alloc{"1": {ContainerID: "x", PodRef: lh + "/gone-too", IfName: "lhnet1"}}))
	in, err := f.r.Inspect(context.Background())
	require.NoError(t, err)
	require.Len(t, in.Pools, 2)
	sn := in.Pools[1]
	assert.Equal(t, poolName, sn.Name)
	assert.Equal(t, []string{"harvester-system/storagenetwork-sg8d8"}, sn.NADs)
	assert.Equal(t, int64(252), sn.Size.Int64())
	assert.Equal(t, int64(250), sn.Free.Int64())
	assert.Equal(t, 1, sn.Reclaimable)
	assert.True(t, in.Pools[0].Orphaned)
	require.Len(t, sn.Stales, sn.Stale, "every stale entry counted is listed")
	require.NotEmpty(t, sn.Stales)

	var b bytes.Buffer
	WriteInspect(&b, in)
	out := b.String()
	t.Log("\n" + out)
	assert.Contains(t, out, "192.168.50.0-24  192.168.50.0/24  252   2          1      250   harvester-system/storagenetwork-sg8d8")
	assert.Contains(t, out, "pools no NAD names")
	assert.Contains(t, out, "10.9.0.0-30  10.9.0.0/30  1        0     not recorded")
	assert.Contains(t, out, "stale allocations")
	assert.Contains(t, out, sn.Stales[0].PodRef)

	assert.Empty(t, in.CannotFit(250), "the orphaned pool allocates nothing more")
	short := in.CannotFit(251)
	require.Len(t, short, 1)
	b.Reset()
	WriteNeed(&b, 251, short)
	assert.Contains(t, b.String(), "pool 192.168.50.0-24 (192.168.50.0/24, NAD harvester-system/storagenetwork-sg8d8): 250 free now, 1 more once the reconciler releases its stale entries: then it fits")
	b.Reset()
	WriteNeed(&b, 252, in.CannotFit(252))
	assert.Contains(t, b.String(), "widen the range or remove excludes before adding 252")

	f.c.nadErr = errors.New("forbidden")
	in, err = f.r.Inspect(context.Background())
	require.NoError(t, err)
	b.Reset()
	WriteInspect(&b, in)
	assert.Contains(t, b.String(), "NADs not read (forbidden): sizes are the ranges' without excludes, and no pool is judged orphaned")
	assert.Len(t, in.CannotFit(2), 1, "unknown NADs: every pool is checked")
}
