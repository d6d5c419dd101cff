package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// A node list that fails keeps every node-gone case live; a pod list that
// fails fails the pass.
func TestReadWorld(t *testing.T) {
	pools := []shim.Pool{*fake.NewPool("p", "10.0.0.0/24", map[string]alloc{
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

func (n *nsRecording) Pods(ctx context.Context, ns string, want func(string) bool) ([]corev1.Pod, error) {
	n.namespaces = append(n.namespaces, ns)
	return n.cluster.Pods(ctx, ns, want)
}

func (n *nsRecording) Nodes(ctx context.Context) ([]string, error) {
	if n.nodesDown {
		return nil, errors.New("refused")
	}
	return n.cluster.Nodes(ctx)
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

// Up to 20 pods, the fresh look GETs each; more are listed again by
// namespace, so that a node with hundreds of pods costs a few requests.
func TestTheFreshLookIsBounded(t *testing.T) {
	for _, tt := range []struct {
		pods     int
		wantGETs int
	}{
		{freshGETs, freshGETs},
		{freshGETs + 1, 0},
	} {
		t.Run(strconv.Itoa(tt.pods), func(t *testing.T) {
			api := fake.New()
			allocs := map[string]alloc{}
			for i := 0; i < tt.pods; i++ {
				allocs[strconv.Itoa(10+i)] = alloc{ContainerID: fmt.Sprintf("dead%d", i), PodRef: fmt.Sprintf("%s/gone-%02d", lh, i)}
			}
			api.Put(fake.NewPool(poolName, "192.168.50.0/24", allocs))
			c := &countingCluster{cluster: newCluster()}
			r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: c}
			rep, err := r.Pass(context.Background())
			require.NoError(t, err)
			assert.Len(t, rep.Released, tt.pods)
			assert.Equal(t, tt.wantGETs, c.gets)
		})
	}
}

type countingCluster struct {
	*cluster
	gets int
}

func (c *countingCluster) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	c.gets++
	return c.cluster.Pod(ctx, ns, name)
}
