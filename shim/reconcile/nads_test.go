package reconcile

import (
	"bytes"
	"context"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

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
		pool: ipPool("192.168.50.0-27", "192.168.50.0/27", entries("1", "2")),
		size: 30, free: 28, inUse: 2,
	}, {
		name: "the NADs could not be listed: the same",
		pool: ipPool("192.168.50.0-27", "192.168.50.0/27", entries("1")), listErr: errors.New("forbidden"),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"192.168.50.0/27","exclude":["192.168.50.0/30"]}`)},
		size: 30, free: 29, inUse: 1,
	}, {
		name: "Harvester's excludes; an entry on an excluded address takes nothing",
		pool: ipPool("192.168.50.0-27", "192.168.50.0/27", entries("1", "3", "4")),
		nads: []NAD{nadOf("harvester-system", "sn", `{"type":"harvester-ipam","range":"192.168.50.0/27","exclude":["192.168.50.1/32","192.168.50.2"]}`)},
		size: 28, free: 26, inUse: 2, nad: "harvester-system/sn",
	}, {
		name: "overlapping excludes counted once; one past the range cut to it",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", entries("8")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.0/29","10.0.0.4/30","10.0.0.8/32","10.0.0.0/24"]}`)},
		size: 0, free: 0, inUse: 0, nad: "h/sn",
	}, {
		name: "range_start and range_end, an entry outside them",
		pool: ipPool("10.0.0.0-24", "10.0.0.0/24", entries("5", "50")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/24","range_start":"10.0.0.10","range_end":"10.0.0.59","exclude":["10.0.0.0/28"]}`)},
		size: 44, free: 43, inUse: 1, nad: "h/sn",
	}, {
		name: "bounds outside the usable part are ignored, as whereabouts ignores them",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.0","range_end":"10.0.1.1"}`)},
		size: 14, free: 14, nad: "h/sn",
	}, {
		name: "two NADs name the pool: the one that leaves fewer free",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", entries("1")),
		nads: []NAD{nadOf("a", "wide", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "narrow", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.8/29"]}`)},
		size: 7, free: 6, inUse: 1, nad: "b/narrow",
	}, {
		name: "more entries than size: free is never negative",
		pool: ipPool("10.0.0.0-30", "10.0.0.0/30", entries("1", "2")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/30","range_end":"10.0.0.1"}`)},
		size: 1, free: 0, inUse: 1, nad: "h/sn",
	}, {
		name: "range_start alone, no exclude under it",
		pool: ipPool("10.0.0.0-24", "10.0.0.0/24", entries("5", "50")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/24","range_start":"10.0.0.10"}`)},
		size: 245, free: 244, inUse: 1, nad: "h/sn",
	}, {
		name: "range_start on the last usable address: one address",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", nil),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","range_start":"10.0.0.14"}`)},
		size: 1, free: 1, nad: "h/sn",
	}, {
		name: "an entry on an exclude's last address takes nothing",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", entries("7", "8")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"10.0.0.0/28","exclude":["10.0.0.4/30"]}`)},
		size: 10, free: 9, inUse: 1, nad: "h/sn",
	}, {
		name: "IPv6: an entry in use, one address excluded",
		pool: ipPool("fd00-10---120", "fd00:10::/120", entries("1", "5")),
		nads: []NAD{nadOf("h", "sn", `{"type":"whereabouts","range":"fd00:10::/120","exclude":["fd00:10::5"]}`)},
		size: 253, free: 252, inUse: 1, nad: "h/sn",
	}, {
		name: "two NADs leave as many free: the one of the smaller size",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", entries("14")),
		nads: []NAD{nadOf("a", "wide", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "short", `{"type":"whereabouts","range":"10.0.0.0/28","range_end":"10.0.0.13"}`)},
		size: 13, free: 13, inUse: 0, nad: "b/short",
	}, {
		name: "two NADs alike: the first listed",
		pool: ipPool("10.0.0.0-28", "10.0.0.0/28", entries("1")),
		nads: []NAD{nadOf("a", "one", `{"type":"whereabouts","range":"10.0.0.0/28"}`), nadOf("b", "two", `{"type":"whereabouts","range":"10.0.0.0/28"}`)},
		size: 14, free: 13, inUse: 1, nad: "a/one",
	}, {
		name: "a /32 has nothing whereabouts would hand out",
		pool: ipPool("10.0.0.1-32", "10.0.0.1/32", nil), size: 0, free: 0,
	}, {
		name: "IPv6 /64 with an exclude",
		pool: ipPool("fd00-10---64", "fd00:10::/64", entries("1")),
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
	old := ipPool("10.9.0.0-24", "10.9.0.0/24", nil)
	slice := ipPool("blue-node1-10.8.0.0-24", "10.8.0.0/24", nil)
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

// An old range's pool, no NAD naming it (harvester/harvester#9501): with
// --delete-orphaned-pools it is recorded first, deleted after the grace once
// it holds no live entry, with an Event; never while it holds a live entry,
// never while the NADs are unknown, never without the flag, never by a dry run.
func TestOrphanedPoolIsDeletedAfterTheGrace(t *testing.T) {
	const old = "10.9.0.0-24"
	setup := func(t *testing.T, allocs map[string]alloc, pods ...*corev1.Pod) *fixture {
		f := newFixture(t, append([]*corev1.Pod{running()}, pods...)...)
		f.api.Put(ipPool(old, "10.9.0.0/24", allocs))
		f.r.DeleteOrphanedPools = true
		return f
	}
	pass := func(t *testing.T, f *fixture) *Report {
		t.Helper()
		rep, err := f.r.Pass(context.Background())
		require.NoError(t, err)
		return rep
	}
	// recordedAnHourAgo is the pool, recorded as orphaned by a pass an hour
	// ago: past the grace.
	recordedAnHourAgo := func(t *testing.T, allocs map[string]alloc) *fixture {
		t.Helper()
		f := setup(t, allocs)
		pass(t, f)
		f.now = f.now.Add(time.Hour)
		return f
	}
	poolRow := func(rep *Report) Row {
		for _, r := range rep.Rows {
			if r.Kind == "pool" {
				return r
			}
		}
		return Row{}
	}

	t.Run("empty: recorded, then deleted after the grace", func(t *testing.T) {
		f := setup(t, map[string]alloc{})
		rep := pass(t, f)
		assert.Equal(t, "wait 10m0s", poolRow(rep).Action)
		assert.Equal(t, f.now.Format(time.RFC3339), f.api.Pool("kube-system", old).Annotations[OrphanedSinceAnnotation])
		assert.True(t, rep.Stats[len(rep.Stats)-1].Orphaned || rep.Stats[0].Orphaned)
		f.now = f.now.Add(9 * time.Minute)
		assert.Equal(t, "wait 1m0s", poolRow(pass(t, f)).Action)
		require.NotNil(t, f.api.Pool("kube-system", old), "within the grace")
		f.now = f.now.Add(time.Minute)
		rep = pass(t, f)
		assert.Equal(t, []string{old}, rep.DeletedPools)
		assert.Nil(t, f.api.Pool("kube-system", old))
		assert.NotNil(t, f.pool(), "the named pool stays")
		var ev *corev1.Event
		for _, e := range f.c.events {
			if e.Reason == "OrphanedPoolDeleted" {
				ev = e
			}
		}
		require.NotNil(t, ev, "an Event on the pool")
		assert.Equal(t, old, ev.InvolvedObject.Name)
		assert.Contains(t, ev.Message, "deleted pool 10.9.0.0-24 (range 10.9.0.0/24): no NAD has named it since")
		assert.Equal(t, 4, f.c.nadLists, "the NADs listed each pass, and again before the delete")
	})
	t.Run("a live entry keeps it; once that pod is gone, it goes", func(t *testing.T) {
		f := setup(t, map[string]alloc{"7": {ContainerID: "c7", PodRef: lh + "/im-old", IfName: "lhnet1"}},
			pod(lh, "im-old", corev1.PodRunning, "node-a", status("10.9.0.7")))
		pass(t, f)
		f.now = f.now.Add(time.Hour)
		rep := pass(t, f)
		assert.Equal(t, "kept: holds 1 live entries", poolRow(rep).Action)
		require.NotNil(t, f.api.Pool("kube-system", old))
		delete(f.c.pods, lh+"/im-old")
		rep = pass(t, f)
		assert.Equal(t, []string{old}, rep.DeletedPools, "every entry stale: deleted, whatever their own grace")
	})
	t.Run("a pod back between the pass's look and the delete keeps it", func(t *testing.T) {
		f := recordedAnHourAgo(t, map[string]alloc{"7": {ContainerID: "c7", PodRef: lh + "/im-old", IfName: "lhnet1"}})
		f.c.beforePod = func(ref string) {
			if ref == lh+"/im-old" {
				f.c.pods[ref] = pod(lh, "im-old", corev1.PodRunning, "node-a", status("10.9.0.7"))
			}
		}
		rep := pass(t, f)
		assert.Empty(t, rep.DeletedPools)
		assert.Equal(t, "kept: changed since it was read (judged again next pass)", poolRow(rep).Action)
		require.NotNil(t, f.api.Pool("kube-system", old))
	})
	t.Run("written between the judgement and the delete: kept (409)", func(t *testing.T) {
		f := recordedAnHourAgo(t, map[string]alloc{})
		f.api.Hook = func(c *fake.Call) error {
			if c.Verb == "delete" && c.Resource == fake.Pools {
				p := f.api.Pool("kube-system", old)
				p.Spec.Allocations = map[string]alloc{"3": {ContainerID: "new", PodRef: lh + "/im-new", IfName: "lhnet1"}}
				_, err := f.api.UpdatePool("kube-system", p)
				require.NoError(t, err)
			}
			return nil
		}
		rep := pass(t, f)
		assert.Empty(t, rep.DeletedPools)
		assert.Empty(t, rep.Errors)
		require.NotNil(t, f.api.Pool("kube-system", old))
	})
	t.Run("the delete fails: the pass says so, the next one deletes", func(t *testing.T) {
		f := recordedAnHourAgo(t, map[string]alloc{})
		f.api.Hook = func(c *fake.Call) error {
			if c.Verb == "delete" && c.Resource == fake.Pools {
				return errors.New("etcdserver: request timed out")
			}
			return nil
		}
		rep := pass(t, f)
		require.Len(t, rep.Errors, 1)
		assert.ErrorContains(t, rep.Errors[0], "etcdserver: request timed out")
		require.NotNil(t, f.api.Pool("kube-system", old))
		f.api.Hook = nil
		rep = pass(t, f)
		assert.Empty(t, rep.Errors)
		assert.Equal(t, []string{old}, rep.DeletedPools)
	})
	t.Run("a NAD names it again: kept, its sighting forgotten", func(t *testing.T) {
		f := setup(t, map[string]alloc{})
		pass(t, f)
		f.c.nads = append(f.c.nads, nadOf("h", "back", `{"type":"whereabouts","range":"10.9.0.0/24"}`))
		f.now = f.now.Add(time.Hour)
		rep := pass(t, f)
		assert.Empty(t, rep.DeletedPools)
		assert.NotContains(t, f.api.Pool("kube-system", old).Annotations, OrphanedSinceAnnotation)
	})
	t.Run("a NAD appears right before the delete: kept", func(t *testing.T) {
		f := recordedAnHourAgo(t, map[string]alloc{})
		lists := f.c.nadLists
		f.c.beforePod = nil
		// The pass lists NADs once; the fresh look before the delete lists again.
		c := &appearing{cluster: f.c, after: lists + 2, nad: nadOf("h", "new", `{"type":"whereabouts","range":"10.9.0.0/24"}`)}
		f.r.Cluster = c
		rep := pass(t, f)
		assert.Empty(t, rep.DeletedPools)
		assert.Equal(t, "kept: a NAD names it on a fresh look", poolRow(rep).Action)
	})
	t.Run("the NADs cannot be read: nothing recorded, nothing deleted", func(t *testing.T) {
		f := setup(t, map[string]alloc{})
		f.c.nadErr = errors.New(`the server could not find the requested resource`)
		f.r.Grace = 0
		rep := pass(t, f)
		assert.Empty(t, rep.DeletedPools)
		assert.False(t, rep.NADs.Known)
		assert.NotContains(t, f.api.Pool("kube-system", old).Annotations, OrphanedSinceAnnotation)
		assert.False(t, rep.Stats[0].Orphaned)
	})
	t.Run("without the flag, or in a dry run: nothing written", func(t *testing.T) {
		for _, dry := range []bool{false, true} {
			f := setup(t, map[string]alloc{})
			f.r.DeleteOrphanedPools, f.r.DryRun, f.r.Grace = dry, dry, 0
			rep := pass(t, f)
			assert.Empty(t, rep.DeletedPools)
			assert.NotContains(t, f.api.Pool("kube-system", old).Annotations, OrphanedSinceAnnotation)
			if dry {
				assert.Equal(t, "wait 0s", poolRow(rep).Action)
			}
		}
	})
}

// appearing is a cluster whose NADs gain one from the after-th list on.
type appearing struct {
	*cluster
	after int
	nad   NAD
}

func (a *appearing) NADs(ctx context.Context) ([]NAD, error) {
	nads, err := a.cluster.NADs(ctx)
	if a.cluster.nadLists >= a.after {
		nads = append(nads, a.nad)
	}
	return nads, err
}

// inspect shows each pool's size and free with the NAD's excludes, the
// stale entries, and the pools no NAD names; --need names each pool that
// cannot fit N more, and what a pass would give back.
func TestInspectAndNeed(t *testing.T) {
	f := newFixture(t, running())
	f.api.Put(ipPool("10.9.0.0-30", "10.9.0.0/30", map[string]alloc{"1": {ContainerID: "x", PodRef: lh + "/gone-too", IfName: "lhnet1"}}))
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

	var b bytes.Buffer
	WriteInspect(&b, in)
	out := b.String()
	t.Log("\n" + out)
	assert.Contains(t, out, "192.168.50.0-24  192.168.50.0/24  252   2          1      250   harvester-system/storagenetwork-sg8d8")
	assert.Contains(t, out, "pools no NAD names")
	assert.Contains(t, out, "10.9.0.0-30  10.9.0.0/30  1        0     not recorded")

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
