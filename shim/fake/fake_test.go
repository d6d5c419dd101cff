package fake_test

import (
	"context"
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// The semantics the store and the simulation rely on, as the API server has them.
func TestTheFakeServesAsTheAPIServerDoes(t *testing.T) {
	ctx := context.Background()
	api := fake.New()
	api.Put(&shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "10.0.0.0/24", Allocations: map[string]whereaboutsv1alpha1.IPAllocation{"1": {ContainerID: "c"}}}})
	p, err := api.GetPool(ctx, "ns", "p", shim.Fresh)
	require.NoError(t, err)
	rv := p.ResourceVersion

	// A patch whose test fails is 422 and changes nothing.
	_, err = api.PatchPool(ctx, "ns", "p", shim.Guarded("999", shim.PatchOp{Op: "remove", Path: "/spec/allocations/1"}))
	assert.True(t, apierrors.IsInvalid(err), "%v", err)
	// One whose test holds applies, with a new resourceVersion.
	got, err := api.PatchPool(ctx, "ns", "p", shim.Guarded(rv, shim.PatchOp{Op: "remove", Path: "/spec/allocations/1"}))
	require.NoError(t, err)
	assert.NotEqual(t, rv, got.ResourceVersion)
	assert.Empty(t, got.Spec.Allocations)

	// The watch cache lags as told, and says when what it served is stale.
	var stale []string
	api.StaleRead = func(c fake.Call) { stale = append(stale, c.Namespace+"/"+c.Name) }
	api.CacheLag = func() int { return 1 }
	cached, err := api.GetPool(ctx, "ns", "p", shim.Cache)
	require.NoError(t, err)
	assert.Len(t, cached.Spec.Allocations, 1, "one revision behind")
	assert.Equal(t, []string{"ns/p"}, stale)
	fresh, err := api.GetPool(ctx, "ns", "p", shim.Fresh)
	require.NoError(t, err)
	assert.Empty(t, fresh.Spec.Allocations)
	_, err = api.CreateReservation(context.Background(), "ns", &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.9"}})
	require.NoError(t, err)
	_, err = api.GetPool(ctx, "ns", "p", shim.Cache)
	require.NoError(t, err)
	assert.Equal(t, []string{"ns/p"}, stale, "behind the latest revision, but not behind the pool's: not stale")
	api.CacheLag, api.StaleRead = nil, nil

	// A delete with stale preconditions is 409; with current ones it applies.
	o, err := api.CreateReservation(context.Background(), "ns", &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.1"}})
	require.NoError(t, err)
	err = api.DeleteReservation(ctx, "ns", o.Name, shim.Preconditions{UID: o.UID, ResourceVersion: "1"})
	assert.True(t, apierrors.IsConflict(err), "%v", err)
	err = api.DeleteReservation(ctx, "ns", o.Name, shim.Preconditions{UID: "other", ResourceVersion: o.ResourceVersion})
	assert.True(t, apierrors.IsConflict(err), "%v", err)
	require.NoError(t, api.DeleteReservation(ctx, "ns", o.Name, shim.Preconditions{UID: o.UID, ResourceVersion: o.ResourceVersion}))
	err = api.DeleteReservation(ctx, "ns", o.Name, shim.Preconditions{})
	assert.True(t, apierrors.IsNotFound(err))

	// A lost response: applied, and the caller told it timed out.
	api.Hook = func(c *fake.Call) error { c.LoseResponse = c.Verb == "create"; return nil }
	_, err = api.CreateReservation(context.Background(), "ns", &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.2"}})
	assert.True(t, apierrors.IsTimeout(err), "%v", err)
	_, err = api.GetReservation(ctx, "ns", "10.0.0.2")
	assert.NoError(t, err, "it happened all the same")
	api.Hook = nil

	// Leases update only at their current version.
	l, err := api.CreateLease(ctx, &shim.Lease{ObjectMeta: metav1.ObjectMeta{Name: "whereabouts", Namespace: "ns"}})
	require.NoError(t, err)
	_, err = api.CreateLease(ctx, l)
	assert.True(t, apierrors.IsAlreadyExists(err))
	l2, err := api.UpdateLease(ctx, l)
	require.NoError(t, err)
	_, err = api.UpdateLease(ctx, l)
	assert.True(t, apierrors.IsConflict(err))
	assert.NotEqual(t, l.ResourceVersion, l2.ResourceVersion)

	// Limits: annotations, operations.
	big := make([]byte, 300*1024)
	for i := range big {
		big[i] = 'x'
	}
	_, err = api.PatchPool(ctx, "ns", "p", shim.Guarded(fresh.ResourceVersion, shim.PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{"a": string(big)}}))
	assert.True(t, apierrors.IsInvalid(err))
	assert.Contains(t, err.Error(), "Too long")
	ops := make([]shim.PatchOp, 10001)
	for i := range ops {
		ops[i] = shim.PatchOp{Op: "test", Path: "/metadata/name", Value: "p"}
	}
	_, err = api.PatchPool(ctx, "ns", "p", shim.Guarded(fresh.ResourceVersion, ops...))
	assert.ErrorContains(t, err, "maximum operations")
}

// With whereabouts v0.7.0's CRDs the API server prunes what they do not
// know: an entry's ifname and a reservation's.
func TestPruneIfNameStoresAsV070sCRDsDo(t *testing.T) {
	ctx := context.Background()
	api := fake.New()
	api.PruneIfName = true
	api.Put(fake.NewPool("p", "10.0.0.0/24", map[string]shim.IPAllocation{}))
	p := api.Pool("kube-system", "p")
	got, err := api.PatchPool(ctx, "kube-system", "p", shim.Guarded(p.ResourceVersion,
		shim.PatchOp{Op: "add", Path: "/spec/allocations/2", Value: shim.IPAllocation{ContainerID: "c", PodRef: "ns/pod", IfName: "lhnet1"}}))
	require.NoError(t, err)
	assert.Equal(t, shim.IPAllocation{ContainerID: "c", PodRef: "ns/pod"}, got.Spec.Allocations["2"])
	_, err = api.CreateReservation(ctx, "kube-system", &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.2"},
		Spec: shim.ReservationSpec{ContainerID: "c", PodRef: "ns/pod", IfName: "lhnet1"}})
	require.NoError(t, err)
	assert.Equal(t, shim.ReservationSpec{ContainerID: "c", PodRef: "ns/pod"}, api.AllReservations("kube-system")[0].Spec)
}

// OnChange is told of every change in order, a deletion with the state
// before it.
func TestOnChangeTellsEveryChangeInOrder(t *testing.T) {
	ctx := context.Background()
	api := fake.New()
	var seen []fake.Change
	api.OnChange = func(c fake.Change) { seen = append(seen, c) }
	api.Put(fake.NewPool("p", "10.0.0.0/24", nil))
	p := api.Pool("kube-system", "p")
	_, err := api.PatchPool(ctx, "kube-system", "p", shim.Guarded(p.ResourceVersion,
		shim.PatchOp{Op: "add", Path: "/spec/allocations", Value: map[string]shim.IPAllocation{"1": {ContainerID: "c", PodRef: "ns/pod"}}}))
	require.NoError(t, err)
	require.NoError(t, api.DeletePool(ctx, "kube-system", "p", shim.Preconditions{}))
	require.Len(t, seen, 3)
	for i, c := range seen {
		assert.Equal(t, fake.Pools, c.Resource)
		assert.Equal(t, "p", c.Name)
		if i > 0 {
			assert.Greater(t, c.Rev, seen[i-1].Rev)
			assert.Same(t, seen[i-1].Object, c.Previous)
		}
	}
	assert.Nil(t, seen[0].Previous)
	assert.Len(t, seen[1].Object.(*shim.Pool).Spec.Allocations, 1)
	assert.Nil(t, seen[2].Object, "a deletion")
	assert.Empty(t, api.ResourceVersion(fake.Pools, "kube-system", "p"), "gone now")
}
