package reconcile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func TestWriteRows(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	WriteRows(&out, nil, now)
	assert.Equal(t, "nothing stale\n", out.String())

	rows := []Row{
		{Kind: "allocation", Pool: "p", IP: "10.0.0.4", PodRef: "ns/a", Container: "0123456789abcdef0123", IfName: "", Reason: PodGone, Since: now.Add(-90 * time.Second), Action: "release"},
		{Kind: "reservation", Pool: "-", IP: "10.0.0.9", PodRef: "ns/b", Container: "", IfName: "lhnet1", Reason: OrphanedORIP, Action: "wait 10m0s"},
		{Kind: "allocation", Pool: "p", IP: "10.0.0.5", PodRef: "ns/c", Container: "0123456789abcdef", IfName: "lhnet1", Reason: PodGone, Since: now, Action: "wait 10m0s"},
	}
	out.Reset()
	WriteRows(&out, rows, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, []string{"KIND", "POOL", "IP", "POD", "CONTAINER", "IFNAME", "REASON", "STALE", "FOR", "ACTION"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"allocation", "p", "10.0.0.4", "ns/a", "0123456789abcdef…", "-", "pod", "gone", "1m30s", "release"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"reservation", "-", "10.0.0.9", "ns/b", "-", "lhnet1", "no", "allocation", "holds", "its", "address", "for", "its", "pod", "first", "seen", "now", "wait", "10m0s"}, strings.Fields(lines[2]))
	assert.Equal(t, []string{"allocation", "p", "10.0.0.5", "ns/c", "0123456789abcdef", "lhnet1", "pod", "gone", "first", "seen", "now", "wait", "10m0s"}, strings.Fields(lines[3]), "a 16-byte ID whole")

	// Up to MaxRows, every row is printed and nothing is summed up (past it:
	// writerows_test.go).
	var many []Row
	for i := 0; i < MaxRows; i++ {
		many = append(many, Row{Kind: "allocation", Pool: "p", IP: "10.0.0." + strconv.Itoa(i), PodRef: "ns/x", Reason: PodGone, Action: "release"})
	}
	out.Reset()
	WriteRows(&out, many, now)
	assert.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), 1+MaxRows)
	assert.NotContains(t, out.String(), "more")
}

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
			api.Put(ipPool(poolName, "192.168.50.0/24", allocs))
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
			api.Put(ipPool(poolName, "192.168.50.0/24", allocs))
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

// A first sighting is recorded to the second, rounded up: a grace is never
// cut short by the rounding.
func TestSightingsAreRoundedUp(t *testing.T) {
	f := newFixture(t, running())
	f.now = f.now.Add(300 * time.Millisecond)
	_, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	since := decodeSightings(f.pool().Annotations[StaleSinceAnnotation])["4"].since
	assert.Equal(t, f.now.Truncate(time.Second).Add(time.Second), since)

	f.now = since.Add(f.r.Grace - time.Millisecond)
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "a millisecond short of the grace")
	f.now = since.Add(f.r.Grace)
	rep, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Len(t, rep.Released, 1, "the grace is over")

	assert.Equal(t, f.now, ceilSecond(f.now), "a whole second stays")
}
