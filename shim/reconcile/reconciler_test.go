package reconcile

import (
	"context"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	wbfake "github.com/k8snetworkplumbingwg/whereabouts/pkg/client/clientset/versioned/fake"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/harvester/harvester-ipam/shim"
)

type fixture struct {
	r    *Reconciler
	wb   *wbfake.Clientset
	kube *kubefake.Clientset
	now  time.Time
}

func newFixture(t *testing.T, pods ...runtime.Object) *fixture {
	wb := wbfake.NewSimpleClientset(
		&whereaboutsv1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.0-24", Namespace: "kube-system", ResourceVersion: "1"},
			Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24", Allocations: map[string]alloc{
				"4": {ContainerID: "dead", PodRef: lh + "/gone", IfName: "lhnet1"},
				"5": {ContainerID: "live", PodRef: lh + "/running", IfName: "lhnet1"},
			}}},
		&whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.4", Namespace: "kube-system", ResourceVersion: "1"},
			Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: lh + "/gone"}},
		&whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.5", Namespace: "kube-system", ResourceVersion: "1"},
			Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: lh + "/running"}},
		&whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.9", Namespace: "kube-system", ResourceVersion: "1"},
			Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: lh + "/leftover"}},
	)
	objs := append([]runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}}, pods...)
	kube := kubefake.NewSimpleClientset(objs...)
	f := &fixture{wb: wb, kube: kube, now: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
	f.r = &Reconciler{Kube: kube, Store: shim.New(wb.WhereaboutsV1alpha1(), "kube-system"), Grace: 10 * time.Minute, Now: func() time.Time { return f.now }}
	return f
}

func (f *fixture) pool(t *testing.T) *whereaboutsv1alpha1.IPPool {
	p, err := f.wb.WhereaboutsV1alpha1().IPPools("kube-system").Get(context.Background(), "192.168.50.0-24", metav1.GetOptions{})
	require.NoError(t, err)
	return p
}

func (f *fixture) orips(t *testing.T) []string {
	l, err := f.wb.WhereaboutsV1alpha1().OverlappingRangeIPReservations("kube-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var names []string
	for _, o := range l.Items {
		names = append(names, o.Name)
	}
	return names
}

func running() runtime.Object {
	return pod(lh, "running", corev1.PodRunning, "node-a", status("192.168.50.5"))
}

func TestPassWaitsForTheGracePeriod(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()

	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "first sighting: nothing released")
	assert.Len(t, rep.Rows, 2, "the dead pod's allocation and the leftover reservation")
	assert.Contains(t, f.pool(t).Annotations[StaleSinceAnnotation], `"4":{"id":"dead","since":"2026-11-21T12:00:00Z"`)
	assert.Len(t, f.pool(t).Spec.Allocations, 2)

	f.now = f.now.Add(9 * time.Minute)
	rep, err = f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "within the grace period")
	assert.Empty(t, rep.DeletedORIPs)
	assert.Contains(t, f.pool(t).Annotations[StaleSinceAnnotation], "2026-11-21T12:00:00Z", "the first sighting is kept, not renewed")

	f.now = f.now.Add(time.Minute)
	rep, err = f.r.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Released, 1)
	assert.Equal(t, "192.168.50.4", rep.Released[0].IP.String())
	assert.Equal(t, "192.168.50.4", rep.Released[0].ORIP)
	assert.Equal(t, []string{"192.168.50.9"}, rep.DeletedORIPs)
	p := f.pool(t)
	assert.Equal(t, map[string]alloc{"5": {ContainerID: "live", PodRef: lh + "/running", IfName: "lhnet1"}}, p.Spec.Allocations)
	assert.NotContains(t, p.Annotations, StaleSinceAnnotation, "nothing stale is left to remember")
	assert.Equal(t, []string{"192.168.50.5"}, f.orips(t))

	evs, err := f.kube.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, evs.Items, 2)
	var msgs []string
	for _, e := range evs.Items {
		msgs = append(msgs, e.Reason+": "+e.Message)
	}
	assert.Contains(t, msgs, `StaleAllocationReleased: released 192.168.50.4 of pod longhorn-system/gone (container dead, ifname "lhnet1"), reservation 192.168.50.4 deleted`)
}

func TestPassKeepsWhatCameBackToLife(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()
	_, err := f.r.Pass(ctx)
	require.NoError(t, err)
	// The pod is (re)created, pending, before the grace period ends.
	_, err = f.kube.CoreV1().Pods(lh).Create(ctx, pod(lh, "gone", corev1.PodPending, "", ""), metav1.CreateOptions{})
	require.NoError(t, err)
	f.now = f.now.Add(time.Hour)
	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released)
	assert.Len(t, f.pool(t).Spec.Allocations, 2)
	assert.NotContains(t, f.pool(t).Annotations, StaleSinceAnnotation, "no longer stale: forgotten")
}

func TestDryRunChangesNothing(t *testing.T) {
	f := newFixture(t, running())
	f.r.DryRun = true
	before := f.pool(t)
	for i := 0; i < 3; i++ {
		rep, err := f.r.Pass(context.Background())
		require.NoError(t, err)
		assert.Len(t, rep.Rows, 2)
		assert.Empty(t, rep.Released)
		f.now = f.now.Add(time.Hour)
	}
	assert.Equal(t, before, f.pool(t))
	assert.Len(t, f.orips(t), 3)
	for _, a := range f.kube.Actions() {
		assert.Equal(t, "list", a.GetVerb(), "a dry run only reads: %v", a)
	}
	for _, a := range f.wb.Actions() {
		assert.Contains(t, []string{"list", "get"}, a.GetVerb(), "a dry run only reads: %v", a)
	}
}
