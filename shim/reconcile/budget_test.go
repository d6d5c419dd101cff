package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// Past the sightings' budget, the entries left out say they wait for the
// ones recorded before; the ones the pass recorded say how long their grace
// has to run, on the pass that recorded them and on the next, which writes
// nothing. (Found by the mutation tests: every entry not recorded by an
// earlier pass said it waited, the 9,438 just recorded included.)
func TestOnlyEntriesPastTheBudgetSayTheyWait(t *testing.T) {
	api := fake.New()
	allocs := map[string]alloc{}
	for i := 0; i < 12000; i++ {
		allocs[strconv.Itoa(10+i)] = alloc{ContainerID: fmt.Sprintf("dead%060d", i), PodRef: fmt.Sprintf("%s/gone-%05d", lh, i), IfName: "lhnet1"}
	}
	api.Put(ipPool("10.0.0.0-16", "10.0.0.0/16", allocs))
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: newCluster(), Grace: time.Minute, Now: func() time.Time { return now }}
	rep, err := r.Pass(context.Background())
	require.NoError(t, err)
	actions := map[string]int{}
	for _, row := range rep.Rows {
		actions[row.Action]++
	}
	recorded := len(decodeSightings(api.Pool("kube-system", "10.0.0.0-16").Annotations[StaleSinceAnnotation]))
	assert.Positive(t, recorded)
	assert.Less(t, recorded, 12000)
	assert.Equal(t, map[string]int{"wait 1m0s": recorded, "wait: sighted once the stale entries recorded before are released": 12000 - recorded}, actions)

	now = now.Add(20 * time.Second)
	rep, err = r.Pass(context.Background())
	require.NoError(t, err)
	actions = map[string]int{}
	for _, row := range rep.Rows {
		actions[row.Action]++
	}
	assert.Equal(t, map[string]int{"wait 40s": recorded, "wait: sighted once the stale entries recorded before are released": 12000 - recorded}, actions, "the next pass")
}
