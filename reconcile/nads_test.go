package reconcile

import (
	"errors"
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func nadOf(ns, name, ipam string) NAD {
	return NAD{Namespace: ns, Name: name, Config: `{"cniVersion":"0.3.1","type":"bridge","ipam":` + ipam + `}`}
}

// A pool's size is what whereabouts may hand out of it: the range's usable
// addresses within range_start and range_end, without the excludes of the
// NAD naming it; free is what is left after the entries inside that part.
func TestUsage(t *testing.T) {
	entries := func(offs ...string) map[string]alloc {
		m := map[string]alloc{}
		for _, o := range offs {
			m[o] = alloc{ContainerID: "c" + o, PodRef: lh + "/im-" + o, IfName: "lhnet1"}
		}
		return m
	}
	tests := []struct {
		name       string
		pool       *shim.Pool
		nads       []NAD
		listErr    error
		size, free int64
		inUse      int
		nad        string
	}{{
		name: "no NAD read: the range's usable addresses",
		pool: fake.NewPool("192.168.50.0-27", "192.168.50.0/27", entries("1", "2")),
		size: 30, free: 28, inUse: 2,
	}, {
		name: "the NADs could not be listed: the same",
		pool: fake.NewPool("192.168.50.0-27", "192.168.50.0/27", entries("1")), listErr: errors.New("forbidden"),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"192.168.50.0/27","exclude":["192.168.50.0/30"]}`)},
		size: 30, free: 29, inUse: 1,
	}, {
		name: "Harvester's excludes; an entry on an excluded address takes nothing",
		pool: fake.NewPool("192.168.50.0-27", "192.168.50.0/27", entries("1", "3", "4")),
		nads: []NAD{nadOf("harvester-system", "sn", `{"type":"harvester-ipam","range":"192.168.50.0/27","exclude":["192.168.50.1/32","192.168.50.2"]}`)},
		size: 28, free: 26, inUse: 2, nad: "harvester-system/sn",
	}, {
		name: "overlapping excludes counted once; one past the range cut to it",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("8")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.0/29","10.0.0.4/30","10.0.0.8/32","10.0.0.0/24"]}`)},
		size: 0, free: 0, inUse: 0, nad: "h/sn",
	}, {
		name: "range_start and range_end, an entry outside them",
		pool: fake.NewPool("10.0.0.0-24", "10.0.0.0/24", entries("5", "50")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/24","range_start":"10.0.0.10","range_end":"10.0.0.59","exclude":["10.0.0.0/28"]}`)},
		size: 44, free: 43, inUse: 1, nad: "h/sn",
	}, {
		name: "bounds outside the usable part are ignored, as whereabouts ignores them",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.0","range_end":"10.0.1.1"}`)},
		size: 14, free: 14, nad: "h/sn",
	}, {
		name: "a range_start past the usable part is ignored too",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.15"}`)},
		size: 14, free: 14, nad: "h/sn",
	}, {
		name: "two NADs name the pool: the one that leaves fewer free",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("1")),
		nads: []NAD{nadOf("a", "wide", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "narrow", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.8/29"]}`)},
		size: 7, free: 6, inUse: 1, nad: "b/narrow",
	}, {
		// The smaller one leaves more free: fewer free decides, not size.
		name: "two NADs name the pool: the one that leaves fewer free, though larger",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("1", "2", "3", "4", "5", "6")),
		nads: []NAD{nadOf("a", "low", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.8/29"]}`),
			nadOf("b", "high", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.0/29","10.0.0.14/32"]}`)},
		size: 7, free: 1, inUse: 6, nad: "a/low",
	}, {
		name: "an exclude wholly below range_start excludes nothing",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.8","exclude":["10.0.0.0/30"]}`)},
		size: 7, free: 7, nad: "h/sn",
	}, {
		name: "two excludes apart: the addresses between them count",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("3")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.1/32","10.0.0.5/32"]}`)},
		size: 12, free: 11, inUse: 1, nad: "h/sn",
	}, {
		name: "more entries than size: free is never negative",
		pool: fake.NewPool("10.0.0.0-30", "10.0.0.0/30", entries("1", "2")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/30","range_end":"10.0.0.1"}`)},
		size: 1, free: 0, inUse: 1, nad: "h/sn",
	}, {
		name: "range_start alone, no exclude under it",
		pool: fake.NewPool("10.0.0.0-24", "10.0.0.0/24", entries("5", "50")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/24","range_start":"10.0.0.10"}`)},
		size: 245, free: 244, inUse: 1, nad: "h/sn",
	}, {
		name: "range_start on the last usable address: one address",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.14"}`)},
		size: 1, free: 1, nad: "h/sn",
	}, {
		name: "an entry on an exclude's last address takes nothing",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("7", "8")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.4/30"]}`)},
		size: 10, free: 9, inUse: 1, nad: "h/sn",
	}, {
		name: "IPv6: an entry in use, one address excluded",
		pool: fake.NewPool("fd00-10---120", "fd00:10::/120", entries("1", "5")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"fd00:10::/120","exclude":["fd00:10::5"]}`)},
		size: 253, free: 252, inUse: 1, nad: "h/sn",
	}, {
		name: "two NADs leave as many free: the one of the smaller size",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("14")),
		nads: []NAD{nadOf("a", "wide", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "short", `{"type":"whereabouts","range":"10.0.0.0/28","range_end":"10.0.0.13"}`)},
		size: 13, free: 13, inUse: 0, nad: "b/short",
	}, {
		name: "two NADs alike: the first listed",
		pool: fake.NewPool("10.0.0.0-28", "10.0.0.0/28", entries("1")),
		nads: []NAD{nadOf("a", "one", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "two", `{"type":"whereabouts","range":"10.0.0.0/28"}`)},
		size: 14, free: 13, inUse: 1, nad: "a/one",
	}, {
		name: "a /32 has nothing whereabouts would hand out",
		pool: fake.NewPool("10.0.0.1-32", "10.0.0.1/32", nil), size: 0, free: 0,
	}, {
		name: "IPv6 /64 with an exclude",
		pool: fake.NewPool("fd00-10---64", "fd00:10::/64", entries("1")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"fd00:10::/64","exclude":["fd00:10::/120"]}`)},
		size: -1, nad: "h/sn",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs, err := Classify(tt.pool, world(true), nil)
			require.NoError(t, err)
			u := IndexNADs(tt.nads, tt.listErr).Usage(tt.pool, vs)
			assert.Equal(t, tt.nad, u.NAD)
			if tt.size < 0 { // 2^64 - 2 - 256 + 1 (the /120 holds the network address)
				want := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(2+255))
				assert.Equal(t, want.String(), u.Size.String())
				assert.Equal(t, 0, u.InUse, "::1 is excluded")
				return
			}
			assert.Equal(t, tt.size, u.Size.Int64(), "size")
			assert.Equal(t, tt.free, u.Free.Int64(), "free")
			assert.Equal(t, tt.inUse, u.InUse, "in use")
		})
	}
}

// The reconciler's summary says how many NADs allocate from whereabouts'
// pools: whereabouts' and harvester-ipam's, not another IPAM's.
func TestIndexNADsCountsTheNADsOnWhereabouts(t *testing.T) {
	nads := []NAD{
		nadOf("a", "wb", `{"type":"whereabouts","range":"10.0.0.0/24"}`),
		nadOf("b", "hi", `{"type":"harvester-ipam","range":"10.1.0.0/24"}`),
		nadOf("b", "hi6", `{"type":"harvester-ipam","range":"fd00:10::/120"}`),
		nadOf("c", "hl", `{"type":"host-local","subnet":"10.2.0.0/24"}`),
		{Namespace: "d", Name: "no-ipam", Config: `{"cniVersion":"0.3.1","type":"macvlan"}`},
	}
	x := IndexNADs(nads, nil)
	assert.True(t, x.Known)
	assert.Equal(t, 3, x.Count)
	assert.Equal(t, 0, IndexNADs(nil, nil).Count)
}

// Only NADs that were all read can say a pool is named by none.
func TestOrphaned(t *testing.T) {
	old := fake.NewPool("10.9.0.0-24", "10.9.0.0/24", nil)
	slice := fake.NewPool("blue-node1-10.8.0.0-24", "10.8.0.0/24", nil)
	sn := nadOf("h", "sn", `{"type":"whereabouts","range":"192.168.50.0/24"}`)
	tests := []struct {
		name    string
		nads    []NAD
		listErr error
		pool    *shim.Pool
		want    bool
	}{
		{name: "no NAD names it", nads: []NAD{sn}, pool: old, want: true},
		{name: "no NAD at all", pool: old, want: true},
		{name: "a NAD names it", nads: []NAD{sn, nadOf("x", "old", `{"type":"whereabouts","range":"10.9.0.0/24"}`)}, pool: old},
		{name: "named by a NAD of another IPAM type does not count", nads: []NAD{nadOf("x", "hl", `{"type":"host-local","range":"10.9.0.0/24"}`)}, pool: old, want: true},
		{name: "the list failed", nads: []NAD{sn}, listErr: errors.New("the server could not find the requested resource"), pool: old},
		{name: "a NAD that cannot be read may name it", nads: []NAD{sn, {Namespace: "x", Name: "broken", Config: `{"ipam":`}}, pool: old},
		{name: "a node-sliced network may own it", nads: []NAD{nadOf("x", "fast", `{"type":"whereabouts","network_name":"blue","node_slice_size":"/28","range":"10.8.0.0/16"}`)}, pool: slice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, IndexNADs(tt.nads, tt.listErr).Orphaned(tt.pool))
		})
	}
}
