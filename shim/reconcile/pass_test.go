package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func TestClassifyORIPsIsSortedByName(t *testing.T) {
	var orips []shim.Reservation
	for _, n := range []string{"10.0.0.9", "10.0.0.10", "10.0.0.1", "10.0.0.5"} {
		orips = append(orips, shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: "ns/p"}})
	}
	vs, err := ClassifyORIPs(nil, orips)
	require.NoError(t, err)
	var got []string
	for _, v := range vs {
		got = append(got, v.ORIP.Name)
		assert.Equal(t, OrphanedORIP, v.Reason)
	}
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.10", "10.0.0.5", "10.0.0.9"}, got)
}

// What a pass says it does with each stale entry and reservation, through
// the grace period, with and without a dry run.
func TestThePassSaysWhatItDoes(t *testing.T) {
	type want struct{ alloc, orip string }
	for _, tt := range []struct {
		name   string
		grace  time.Duration
		dryRun bool
		passes []time.Duration // the clock before each pass, from the start
		want   []want          // the rows' actions, pass by pass
	}{
		{"grace 0: at once", 0, false, []time.Duration{0}, []want{{"release", "delete"}}},
		{"grace 0, dry run", 0, true, []time.Duration{0}, []want{{"would release", "would delete"}}},
		{"a grace: sighted, waited, released", 10 * time.Minute, false, []time.Duration{0, 4 * time.Minute, 10 * time.Minute},
			[]want{{"wait 10m0s", "wait 10m0s"}, {"wait 6m0s", "wait 6m0s"}, {"release", "delete"}}},
		{"a grace, dry run: nothing sighted", 10 * time.Minute, true, []time.Duration{0, 11 * time.Minute},
			[]want{{"wait 10m0s", "wait 10m0s"}, {"wait 10m0s", "wait 10m0s"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, running())
			start := f.now
			f.r.Grace, f.r.DryRun = tt.grace, tt.dryRun
			for i, at := range tt.passes {
				f.now = start.Add(at)
				rep, err := f.r.Pass(context.Background())
				require.NoError(t, err)
				require.Empty(t, rep.Errors)
				a, o := row(t, rep, "allocation"), row(t, rep, "reservation")
				assert.Equal(t, tt.want[i], want{a.Action, o.Action}, "pass %d", i+1)
				if tt.dryRun {
					assert.True(t, a.Since.IsZero(), "a dry run records no sighting")
				} else if tt.grace > 0 {
					assert.Equal(t, start, a.Since)
					assert.Equal(t, start, o.Since)
				}
				assert.Equal(t, Row{Kind: "allocation", Pool: poolName, IP: "192.168.50.4", PodRef: lh + "/gone", Container: "dead", IfName: "lhnet1", Reason: PodGone, Since: a.Since, Action: a.Action}, a)
				assert.Equal(t, Row{Kind: "reservation", Pool: "-", IP: "192.168.50.9", PodRef: lh + "/leftover", Reason: OrphanedORIP, Since: o.Since, Action: o.Action}, o)
				assert.Equal(t, 3, rep.ORIPs)
				assert.Equal(t, 1, rep.Pools)
				assert.Equal(t, 2, rep.Allocations)
				assert.Equal(t, 2, rep.Candidates())
			}
			if tt.dryRun {
				assert.Len(t, f.pool().Spec.Allocations, 2)
				assert.Len(t, f.orips(), 3)
				assert.NotContains(t, f.pool().Annotations, StaleSinceAnnotation)
			}
		})
	}
}

// The pool's figures after a pass, for the metrics: the oldest stale entry's
// age counts only sightings recorded before.
func TestPoolStats(t *testing.T) {
	f := newFixture(t, running())
	start := f.now
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Stats, 1)
	st := rep.Stats[0]
	assert.Equal(t, poolName, st.Pool)
	assert.Equal(t, "192.168.50.0/24", st.Range)
	assert.Equal(t, "252", st.Size.String(), "the range without the NAD's two excludes")
	assert.Equal(t, 2, st.Allocated)
	assert.Equal(t, 1, st.Stale)
	assert.Equal(t, "250", st.Free.String())
	assert.Equal(t, storageNAD.Namespace+"/"+storageNAD.Name, st.NAD)
	assert.Zero(t, st.OldestStale, "first seen now")
	f.now = start.Add(3 * time.Minute)
	rep, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3*time.Minute, rep.Stats[0].OldestStale)
}

// A failed release is the pool's error in the report; the pass goes on.
func TestAFailedReleaseIsReported(t *testing.T) {
	f := newFixture(t, running())
	f.r.Grace = 0
	f.c.beforePod = func(string) {}
	fc := &failingPods{cluster: f.c}
	f.r.Cluster = fc
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Errors, 1)
	assert.ErrorContains(t, rep.Errors[0], "release stale entries of pool "+poolName+": get pod: refused")
	assert.Len(t, f.pool().Spec.Allocations, 2, "nothing released without the fresh look")
	assert.Equal(t, []string{"192.168.50.9"}, rep.DeletedORIPs, "the reservations are judged on")
}

// failingPods fails every fresh GET of a pod.
type failingPods struct{ *cluster }

func (failingPods) Pod(context.Context, string, string) (*corev1.Pod, error) {
	return nil, errors.New("get pod: refused")
}

// The fresh look reads each pod once and each of their nodes once; a node it
// cannot read counts as there (in doubt, live), and is tried again for the
// next pod.
func TestTheFreshLookReadsEachNodeOnce(t *testing.T) {
	for _, tt := range []struct {
		name        string
		nodeErr     error
		wantRelease int
		wantReads   int
	}{
		{"the node is gone: released", nil, 2, 1},
		{"the node cannot be read: kept", errors.New("refused"), 0, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t,
				pod(lh, "x", corev1.PodRunning, "node-gone", status("192.168.50.4")),
				pod(lh, "y", corev1.PodRunning, "node-gone", status("192.168.50.5")))
			p := f.pool()
			p.Spec.Allocations = map[string]alloc{"4": {ContainerID: "cx", PodRef: lh + "/x"}, "5": {ContainerID: "cy", PodRef: lh + "/y"}}
			_, err := f.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
			f.r.Grace = 0
			nc := &nodeCounting{cluster: f.c, err: tt.nodeErr}
			f.r.Cluster = nc
			rep, err := f.r.Pass(context.Background())
			require.NoError(t, err)
			assert.Len(t, rep.Released, tt.wantRelease)
			assert.Equal(t, tt.wantReads, nc.nodes, "reads of node-gone")
		})
	}
}

type nodeCounting struct {
	*cluster
	nodes int
	err   error
}

func (n *nodeCounting) Node(ctx context.Context, name string) (bool, error) {
	n.nodes++
	if n.err != nil {
		return false, n.err
	}
	return n.cluster.Node(ctx, name)
}

// A node list that fails keeps every node-gone case live; a pod list that
// fails fails the pass.
func TestReadWorld(t *testing.T) {
	pools := []shim.Pool{*ipPool("p", "10.0.0.0/24", map[string]alloc{
		"1": {PodRef: "a/x"}, "2": {PodRef: "b/y"}, "3": {PodRef: "noslash"}, "4": {PodRef: "/z"},
	})}
	c := &nsRecording{cluster: newCluster(pod("a", "x", corev1.PodRunning, "", ""), pod("b", "y", corev1.PodRunning, "", ""))}
	r := &Reconciler{Cluster: c}
	w, err := r.readWorld(context.Background(), pools)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, c.namespaces, "the namespaces the podrefs name, in order, each once")
	assert.Len(t, w.Pods, 2)
	assert.True(t, w.NodesKnown)
	assert.True(t, w.Nodes["node-a"])

	c.nodesDown = true
	w, err = r.readWorld(context.Background(), pools)
	require.NoError(t, err)
	assert.False(t, w.NodesKnown)
}

type nsRecording struct {
	*cluster
	namespaces []string
	nodesDown  bool
}

func (n *nsRecording) Pods(ctx context.Context, ns string) ([]corev1.Pod, error) {
	n.namespaces = append(n.namespaces, ns)
	return n.cluster.Pods(ctx, ns)
}

func (n *nsRecording) Nodes(ctx context.Context) ([]string, error) {
	if n.nodesDown {
		return nil, errors.New("refused")
	}
	return n.cluster.Nodes(ctx)
}

// A dry run does not forget the sighting of a reservation backed again.
func TestADryRunKeepsOrphanSightings(t *testing.T) {
	f := newFixture(t, running())
	o := f.api.AllReservations("kube-system")[1]
	require.Equal(t, "192.168.50.5", o.Name)
	o.Annotations = map[string]string{OrphanSinceAnnotation: f.now.Format(time.RFC3339)}
	f.api.Put(&o)
	f.r.DryRun = true
	writes := 0
	f.api.Hook = func(c *fake.Call) error {
		if c.Verb != "get" && c.Verb != "list" {
			writes++
		}
		return nil
	}
	_, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, writes)
	assert.Contains(t, f.api.AllReservations("kube-system")[1].Annotations, OrphanSinceAnnotation)

	f.r.DryRun = false
	_, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.NotContains(t, f.api.AllReservations("kube-system")[1].Annotations, OrphanSinceAnnotation, "backed: forgotten")
}
