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

// failingCluster fails every Event.
type failingCluster struct{ *cluster }

func (failingCluster) Event(context.Context, *corev1.Event) error {
	return errors.New("events are forbidden")
}

// A pass that releases many entries of a pool tells of the first nine one
// by one and sums up the rest in a tenth Event; Events that cannot be
// created are counted, and lose nothing.
func TestEventsAreBoundedAndCounted(t *testing.T) {
	for _, n := range []int{maxEvents, maxEvents + 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			api := fake.New()
			allocs := map[string]alloc{}
			for i := 0; i < n; i++ {
				allocs[strconv.Itoa(10+i)] = alloc{ContainerID: fmt.Sprintf("dead%d", i), PodRef: fmt.Sprintf("%s/gone-%02d", lh, i), IfName: "lhnet1"}
			}
			api.Put(fake.NewPool(poolName, "192.168.50.0/24", allocs))
			c := newCluster()
			r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: c}
			rep, err := r.Pass(context.Background())
			require.NoError(t, err)
			require.Len(t, rep.Released, n)
			require.Len(t, c.events, min(n, maxEvents))
			for i, ev := range c.events {
				assert.Equal(t, poolName, ev.InvolvedObject.Name)
				assert.Equal(t, "IPPool", ev.InvolvedObject.Kind)
				assert.Equal(t, "harvester-ipam-reconciler", ev.Source.Component)
				assert.Equal(t, corev1.EventTypeNormal, ev.Type)
				if i < maxEvents-1 || n == maxEvents {
					assert.Equal(t, "StaleAllocationReleased", ev.Reason)
					assert.Contains(t, ev.Message, fmt.Sprintf("released 192.168.50.%d of pod %s/gone-%02d (container dead%d, ifname \"lhnet1\")", 10+i, lh, i, i))
				}
			}
			if n > maxEvents {
				last := c.events[maxEvents-1]
				assert.Equal(t, "StaleAllocationsReleased", last.Reason)
				assert.Equal(t, fmt.Sprintf("released %d more stale allocations (pods %s/gone-09, %s/gone-10, %s/gone-11, %s/gone-12, %s/gone-13, ...)", n-maxEvents+1, lh, lh, lh, lh, lh), last.Message)
			}
			assert.Zero(t, r.EventErrors)
		})
	}

	f := newFixture(t, running())
	f.r.Grace = 0
	f.r.Cluster = failingCluster{f.c}
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Len(t, rep.Released, 1)
	assert.Equal(t, []string{"192.168.50.9"}, rep.DeletedORIPs)
	assert.Equal(t, 2, f.r.EventErrors, "one release, one orphan: both Events refused")
}
