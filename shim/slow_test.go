package shim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// A release in one turn (a node agent's) removes its entries by a patch of
// the whole pool, which on a large pool takes the API server longer than a
// request under the Lease may (2 s): 1.3-1.6 s for 10,000 entries on a
// quiet machine, more on a busy one (issue 46: 3 of 39 DELs failed where
// whereabouts alone failed none). The patch may take as long as any write
// (a guarded removal of the release's own entries is safe whenever it
// lands); the turn goes on only once the Lease is kept again: renewed,
// when nobody took it meanwhile, and every reservation is then deleted
// under the hold; otherwise lost, and judged again under a new one, never
// while another holds the Lease. Alone and in a Group.
func TestAReleaseInOneTurnOutlastsASlowPatchOfItsEntries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch time.Duration // how long the API server takes to patch the pool
		taken bool          // another holder takes the Lease meanwhile (past its 5 s)
	}{
		{name: "2.5 s", patch: 2500 * time.Millisecond},
		{name: "6 s, the Lease taken meanwhile", patch: 6 * time.Second, taken: true},
	} {
		for _, group := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s group %v", tc.name, group), func(t *testing.T) {
				api := fake.New()
				api.Put(storageNetwork()...)
				cp := newCopyAPI(api, true)
				c := &syncClock{now: testEpoch}
				o := shim.Options{Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2, Jitter: 1}, Clock: c,
					Random: func() float64 { return 0.5 }, Identity: "harvester-ipam-agent/test", LeaseRetry: time.Millisecond}
				ours := o.Identity
				if group {
					o.Group = &shim.Group{Identity: "harvester-ipam-agent/n1/g"}
					ours = o.Group.Identity
				}
				s := shim.New(cp, ns, o)
				var calls []string
				var deletesUnderAnother []string
				api.Hook = func(call *fake.Call) error {
					calls = append(calls, call.Verb+" "+call.Resource)
					switch {
					case call.Resource == fake.Pools && call.Verb == "patch":
						// The client gives up at its deadline, the write unapplied.
						if d, ok := call.Ctx.Deadline(); ok && time.Until(d) < tc.patch {
							return fmt.Errorf("patch pool %s: %w", call.Name, context.DeadlineExceeded)
						}
						c.advance(tc.patch)
						if tc.taken {
							// A waiter found the record unchanged for its 5 s and
							// took the Lease (whereabouts' 1.5 s duration).
							l := api.Lease(ns, names.Lease)
							other, secs := "whereabouts-n2", int32(1)
							now := metav1.NewMicroTime(c.Now())
							l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &other, &secs, &now
							_, err := api.UpdateLease(context.Background(), l)
							require.NoError(t, err)
						}
					case call.Resource == fake.Reservations && call.Verb == "delete":
						if l := api.Lease(ns, names.Lease); l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != ours {
							deletesUnderAnother = append(deletesUnderAnother, call.Name)
						}
					}
					return nil
				}
				p, onCopy, err := s.Look(context.Background(), storage, shim.Attachment("old1", "lhnet1", nil, nil))
				require.NoError(t, err)
				require.True(t, onCopy)
				plan, err := shim.PlanOf(p, "", shim.Attachment("old1", "lhnet1", nil, nil))
				require.NoError(t, err)
				removed, deleted, err := s.Release(context.Background(), plan)
				require.NoError(t, err)
				assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, ipsOf(removed))
				assert.Equal(t, []string{"192.168.50.4", "192.168.50.8"}, deleted)
				assert.Equal(t, []string{"3", "5", "6", "7"}, offsets(t, api, storage))
				assert.Empty(t, deletesUnderAnother, "no reservation deleted while another holds the Lease")
				// The Lease kept again after the patch, before the list.
				i := indexOf(calls, "patch ippools")
				require.GreaterOrEqual(t, i, 0, "%v", calls)
				assert.Equal(t, "update leases", calls[i+1], "%v", calls)
				if group {
					require.NoError(t, o.Group.Wait(context.Background()))
				}
			})
		}
	}
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}
