package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim/fake"
)

// An old range's pool, no NAD naming it (harvester/harvester#9501): with
// --delete-orphaned-pools it is recorded first, deleted after the grace once
// it holds no live entry, with an Event; never while it holds a live entry,
// never while the NADs are unknown, never without the flag, never by a dry run.
func TestOrphanedPoolIsDeletedAfterTheGrace(t *testing.T) {
	const old = "10.9.0.0-24"
	setup := func(t *testing.T, allocs map[string]alloc, pods ...*corev1.Pod) *fixture {
		f := newFixture(t, append([]*corev1.Pod{running()}, pods...)...)
		f.api.Put(fake.NewPool(old, "10.9.0.0/24", allocs))
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
