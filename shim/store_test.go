package shim

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/client/clientset/versioned/fake"
	wbkube "github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "kube-system"

type alloc = whereaboutsv1alpha1.IPAllocation

func pool(name, rng string, allocs map[string]alloc) *whereaboutsv1alpha1.IPPool {
	return &whereaboutsv1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1"},
		Spec:       whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs},
	}
}

func orip(name, podRef string) *whereaboutsv1alpha1.OverlappingRangeIPReservation {
	return &whereaboutsv1alpha1.OverlappingRangeIPReservation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec:       whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef},
	}
}

// storageNetwork is a pool as Longhorn pods leave it after crash loops.
func storageNetwork() []runtime.Object {
	return []runtime.Object{
		pool("192.168.50.0-24", "192.168.50.0/24", map[string]alloc{
			"3": {ContainerID: "current", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"5": {ContainerID: "old2", PodRef: "longhorn-system/im-a"},                   // written before v0.8: no ifname
			"6": {ContainerID: "old3", PodRef: "longhorn-system/im-a", IfName: "lhnet9"}, // the ifname changed since
			"7": {ContainerID: "other", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
			"8": {ContainerID: "old1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}, // same ID, another pod
		}),
		orip("192.168.50.3", "longhorn-system/im-a"),
		orip("192.168.50.4", "longhorn-system/im-a"),
		orip("192.168.50.5", "longhorn-system/im-a"),
		orip("192.168.50.6", "longhorn-system/im-b"), // a reservation of another pod: stays
		orip("192.168.50.7", "longhorn-system/im-b"),
		orip("192.168.50.8", "longhorn-system/im-b"),
	}
}

func newStore(objs ...runtime.Object) (*Store, *fake.Clientset) {
	cs := fake.NewSimpleClientset(objs...)
	s := New(cs.WhereaboutsV1alpha1(), ns)
	s.Backoff = wait.Backoff{Steps: 4, Duration: time.Millisecond}
	return s, cs
}

func poolOffsets(t *testing.T, cs *fake.Clientset, name string) []string {
	t.Helper()
	p, err := cs.WhereaboutsV1alpha1().IPPools(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, p.Spec.Allocations, "spec.allocations must never be written as null")
	var offs []string
	for off := range p.Spec.Allocations {
		offs = append(offs, off)
	}
	sort.Strings(offs)
	return offs
}

func oripNames(t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	l, err := cs.WhereaboutsV1alpha1().OverlappingRangeIPReservations(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var names []string
	for _, o := range l.Items {
		names = append(names, o.Name)
	}
	sort.Strings(names)
	return names
}

func releasedIPs(rs []Release) []string {
	var ips []string
	for _, r := range rs {
		ips = append(ips, r.IP.String())
	}
	sort.Strings(ips)
	return ips
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name      string
		pick      Picker
		wantIPs   []string
		wantPool  []string
		wantORIPs []string
	}{{
		name: "earlier sandboxes of the pod, any ifname, an empty one too",
		pick: EarlierSandboxes("longhorn-system/im-a", "current"),
		// .3 is the current sandbox's; .7 and .8 are another pod's, even with the ID old1.
		wantIPs:   []string{"192.168.50.4", "192.168.50.5", "192.168.50.6"},
		wantPool:  []string{"3", "7", "8"},
		wantORIPs: []string{"192.168.50.3", "192.168.50.6", "192.168.50.7", "192.168.50.8"},
	}, {
		name:      "the current sandbox is never its own earlier sandbox",
		pick:      EarlierSandboxes("longhorn-system/im-c", "current"),
		wantPool:  []string{"3", "4", "5", "6", "7", "8"},
		wantORIPs: []string{"192.168.50.3", "192.168.50.4", "192.168.50.5", "192.168.50.6", "192.168.50.7", "192.168.50.8"},
	}, {
		name:      "one attachment, exact ifname",
		pick:      Attachment("old1", "lhnet1"),
		wantIPs:   []string{"192.168.50.4", "192.168.50.8"},
		wantPool:  []string{"3", "5", "6", "7"},
		wantORIPs: []string{"192.168.50.3", "192.168.50.5", "192.168.50.6", "192.168.50.7"},
	}, {
		name:      "one attachment recorded without ifname",
		pick:      Attachment("old2", "lhnet1"),
		wantIPs:   []string{"192.168.50.5"},
		wantPool:  []string{"3", "4", "6", "7", "8"},
		wantORIPs: []string{"192.168.50.3", "192.168.50.4", "192.168.50.6", "192.168.50.7", "192.168.50.8"},
	}, {
		name:      "an attachment never seen releases nothing",
		pick:      Attachment("never", "lhnet1"),
		wantPool:  []string{"3", "4", "5", "6", "7", "8"},
		wantORIPs: []string{"192.168.50.3", "192.168.50.4", "192.168.50.5", "192.168.50.6", "192.168.50.7", "192.168.50.8"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cs := newStore(storageNetwork()...)
			rs, err := s.Release(context.Background(), "192.168.50.0-24", "", tt.pick)
			require.NoError(t, err)
			assert.Equal(t, tt.wantIPs, releasedIPs(rs))
			assert.Equal(t, tt.wantPool, poolOffsets(t, cs, "192.168.50.0-24"))
			assert.Equal(t, tt.wantORIPs, oripNames(t, cs))
		})
	}
}

func TestReleaseEverythingLeavesAnEmptyMap(t *testing.T) {
	s, cs := newStore(pool("10.0.0.0-30", "10.0.0.0/30", map[string]alloc{
		"1": {ContainerID: "a", PodRef: "ns/p", IfName: "eth1"},
	}))
	rs, err := s.Release(context.Background(), "10.0.0.0-30", "", EarlierSandboxes("ns/p", "b"))
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1"}, releasedIPs(rs))
	assert.Empty(t, poolOffsets(t, cs, "10.0.0.0-30")) // and not null: checked inside
}

func TestReleaseSendsAGuardedPatch(t *testing.T) {
	s, cs := newStore(storageNetwork()...)
	var patch string
	cs.PrependReactor("patch", "ippools", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		assert.Equal(t, "application/json-patch+json", string(pa.GetPatchType()))
		patch = string(pa.GetPatch())
		return false, nil, nil
	})
	_, err := s.Release(context.Background(), "192.168.50.0-24", "", Attachment("old1", "lhnet1"))
	require.NoError(t, err)
	assert.JSONEq(t, `[{"op":"test","path":"/metadata/resourceVersion","value":"1"},
		{"op":"remove","path":"/spec/allocations/4"},{"op":"remove","path":"/spec/allocations/8"}]`, patch)
}

func TestReleaseRetriesConflicts(t *testing.T) {
	gr := schema.GroupResource{Group: "whereabouts.cni.cncf.io", Resource: "ippools"}
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"409 conflict", apierrors.NewConflict(gr, "192.168.50.0-24", errors.New("the object has been modified"))},
		{"422 failed resourceVersion test", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "IPPool"}, "192.168.50.0-24", nil)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, cs := newStore(storageNetwork()...)
			gets, patches := 0, 0
			cs.PrependReactor("get", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
				gets++
				return false, nil, nil
			})
			cs.PrependReactor("patch", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
				patches++
				if patches <= 2 {
					// Another writer got there first; it took nothing of ours.
					return true, nil, tt.err
				}
				return false, nil, nil
			})
			rs, err := s.Release(context.Background(), "192.168.50.0-24", "", EarlierSandboxes("longhorn-system/im-a", "current"))
			require.NoError(t, err)
			assert.Equal(t, []string{"192.168.50.4", "192.168.50.5", "192.168.50.6"}, releasedIPs(rs))
			assert.Equal(t, []string{"3", "7", "8"}, poolOffsets(t, cs, "192.168.50.0-24"))
			assert.Equal(t, 3, patches)
			assert.GreaterOrEqual(t, gets, 3, "every attempt reads the pool fresh")
			assert.EqualValues(t, 2, s.Retried.Load())
		})
	}
}

func TestReleaseRereadsWhatChangedUnderIt(t *testing.T) {
	// Between our read and our write, the old sandbox's entry is replaced by
	// the current one (whereabouts v0.8 reuses a podref+ifname's address).
	s, cs := newStore(storageNetwork()...)
	patches := 0
	cs.PrependReactor("patch", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		if patches == 1 {
			p, _ := cs.Tracker().Get(schema.GroupVersionResource{Group: "whereabouts.cni.cncf.io", Version: "v1alpha1", Resource: "ippools"}, ns, "192.168.50.0-24")
			pp := p.(*whereaboutsv1alpha1.IPPool).DeepCopy()
			pp.Spec.Allocations["4"] = alloc{ContainerID: "current", PodRef: "longhorn-system/im-a", IfName: "lhnet2"}
			pp.ResourceVersion = "2"
			require.NoError(t, cs.Tracker().Update(schema.GroupVersionResource{Group: "whereabouts.cni.cncf.io", Version: "v1alpha1", Resource: "ippools"}, pp, ns))
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, "192.168.50.0-24", errors.New("modified"))
		}
		return false, nil, nil
	})
	rs, err := s.Release(context.Background(), "192.168.50.0-24", "", EarlierSandboxes("longhorn-system/im-a", "current"))
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.50.5", "192.168.50.6"}, releasedIPs(rs), "the entry now held by the current sandbox stays")
	assert.Equal(t, []string{"3", "4", "7", "8"}, poolOffsets(t, cs, "192.168.50.0-24"))
}

func TestReleaseGivesUpAfterBoundedRetries(t *testing.T) {
	s, cs := newStore(storageNetwork()...)
	patches := 0
	cs.PrependReactor("patch", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, "192.168.50.0-24", errors.New("modified"))
	})
	_, err := s.Release(context.Background(), "192.168.50.0-24", "", EarlierSandboxes("longhorn-system/im-a", "current"))
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "the last error is returned: %v", err)
	assert.Contains(t, err.Error(), "release 192.168.50.4, 192.168.50.5, 192.168.50.6 from pool kube-system/192.168.50.0-24")
	assert.Equal(t, 4, patches)
	assert.Equal(t, []string{"3", "4", "5", "6", "7", "8"}, poolOffsets(t, cs, "192.168.50.0-24"))
}

func TestReleaseOfAMissingPoolIsNothing(t *testing.T) {
	s, _ := newStore()
	rs, err := s.Release(context.Background(), "192.168.50.0-24", "", Attachment("a", "eth1"))
	require.NoError(t, err)
	assert.Empty(t, rs)
}

func TestReleaseReportsAnUnreachableStore(t *testing.T) {
	s, cs := newStore(storageNetwork()...)
	cs.PrependReactor("get", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	})
	_, err := s.Release(context.Background(), "192.168.50.0-24", "", Attachment("old1", "lhnet1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "get pool kube-system/192.168.50.0-24")
	assert.Contains(t, err.Error(), "connection refused")
}

func TestORIPKeptWhenThePodHoldsTheAddressAgain(t *testing.T) {
	// The reservation of a released address stays when the same pod holds the
	// address again by the time we reach it (a new sandbox took it).
	s, cs := newStore(storageNetwork()...)
	cs.PrependReactor("get", "overlappingrangeipreservations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		gvr := schema.GroupVersionResource{Group: "whereabouts.cni.cncf.io", Version: "v1alpha1", Resource: "ippools"}
		p, _ := cs.Tracker().Get(gvr, ns, "192.168.50.0-24")
		pp := p.(*whereaboutsv1alpha1.IPPool).DeepCopy()
		if _, ok := pp.Spec.Allocations["4"]; !ok {
			pp.Spec.Allocations["4"] = alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
			require.NoError(t, cs.Tracker().Update(gvr, pp, ns))
		}
		return false, nil, nil
	})
	rs, err := s.Release(context.Background(), "192.168.50.0-24", "", Attachment("old1", "lhnet1"))
	require.NoError(t, err)
	require.Len(t, rs, 2)
	assert.Contains(t, oripNames(t, cs), "192.168.50.4")
}

func TestNamesMatchWhereabouts(t *testing.T) {
	for _, tt := range []struct{ ip, network string }{
		{"192.168.50.4", ""},
		{"192.168.50.4", "storage"},
		{"fd00:10::5", ""},
		{"fd00:10::", "blue"},
		{"2001:db8::1:0", ""},
	} {
		ip := net.ParseIP(tt.ip)
		assert.Equal(t, wbkube.NormalizeIP(ip, tt.network), ORIPName(ip, tt.network), "%s %q", tt.ip, tt.network)
	}
}

func TestAllocationsAddresses(t *testing.T) {
	tests := []struct {
		rng, off, want string
		wantErr        bool
	}{
		{"192.168.50.0/24", "4", "192.168.50.4", false},
		{"192.168.50.0/24", "255", "192.168.50.255", false},
		{"10.0.0.0/8", "65537", "10.1.0.1", false},
		{"fd00:10::/64", "17", "fd00:10::11", false},
		{"192.168.50.0/24", "x", "", true},
		{"192.168.50.0/24", "-1", "", true},
	}
	for _, tt := range tests {
		p := pool("p", tt.rng, map[string]alloc{tt.off: {ContainerID: "c", PodRef: "ns/p"}})
		as, err := Allocations(p)
		if tt.wantErr {
			assert.Error(t, err, "%s + %s", tt.rng, tt.off)
			continue
		}
		require.NoError(t, err)
		require.Len(t, as, 1)
		assert.Equal(t, tt.want, as[0].IP.String())
	}
}

func TestReleaseOfManyGoesInBoundedPatches(t *testing.T) {
	allocs := map[string]alloc{"1": {ContainerID: "current", PodRef: "ns/p", IfName: "eth1"}}
	for i := 2; i < 2502; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: "old-" + strconv.Itoa(i), PodRef: "ns/p", IfName: "eth1"}
	}
	s, cs := newStore(pool("10.0.0.0-16", "10.0.0.0/16", allocs))
	var sizes []int
	cs.PrependReactor("patch", "ippools", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var ops []map[string]any
		require.NoError(t, json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &ops))
		sizes = append(sizes, len(ops)-1)
		// Each patch makes a new resourceVersion, as the API server does.
		gvr := schema.GroupVersionResource{Group: "whereabouts.cni.cncf.io", Version: "v1alpha1", Resource: "ippools"}
		obj, _ := cs.Tracker().Get(gvr, ns, "10.0.0.0-16")
		p := obj.(*whereaboutsv1alpha1.IPPool).DeepCopy()
		for _, op := range ops[1:] {
			delete(p.Spec.Allocations, strings.TrimPrefix(op["path"].(string), "/spec/allocations/"))
		}
		p.ResourceVersion = strconv.Itoa(len(sizes) + 1)
		require.NoError(t, cs.Tracker().Update(gvr, p, ns))
		return true, p, nil
	})
	rs, err := s.Release(context.Background(), "10.0.0.0-16", "", EarlierSandboxes("ns/p", "current"))
	require.NoError(t, err)
	assert.Len(t, rs, 2500)
	assert.Equal(t, []int{1000, 1000, 500}, sizes, "the API server takes at most 10,000 operations a patch")
	assert.Equal(t, []string{"1"}, poolOffsets(t, cs, "10.0.0.0-16"))
}

func TestORIPChangedUnderTheDeleteIsJudgedAgain(t *testing.T) {
	s, cs := newStore(storageNetwork()...)
	deletes := 0
	cs.PrependReactor("delete", "overlappingrangeipreservations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.DeleteAction).GetName() != "192.168.50.4" {
			return false, nil, nil
		}
		deletes++
		if deletes == 1 {
			// Recreated for another pod between our read and our delete.
			gvr := schema.GroupVersionResource{Group: "whereabouts.cni.cncf.io", Version: "v1alpha1", Resource: "overlappingrangeipreservations"}
			o := orip("192.168.50.4", "longhorn-system/im-b")
			o.ResourceVersion = "2"
			require.NoError(t, cs.Tracker().Update(gvr, o, ns))
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "overlappingrangeipreservations"}, "192.168.50.4", errors.New("precondition failed"))
		}
		return false, nil, nil
	})
	rs, err := s.Release(context.Background(), "192.168.50.0-24", "", Attachment("old1", "lhnet1"))
	require.NoError(t, err)
	require.Len(t, rs, 2)
	assert.Contains(t, oripNames(t, cs), "192.168.50.4", "another pod's reservation now: kept")
	assert.Equal(t, 1, deletes, "no second delete of the other pod's reservation")
}

func TestReleaseReservation(t *testing.T) {
	tests := []struct {
		name, ip, podRef string
		wantDeleted      string
	}{
		{"left behind: the pool no longer gives it to the pod", "192.168.50.9", "longhorn-system/leftover", "192.168.50.9"},
		{"the pod holds the address again", "192.168.50.4", "longhorn-system/im-a", ""},
		{"another pod's reservation", "192.168.50.7", "longhorn-system/im-a", ""},
		{"no reservation at all", "192.168.50.77", "longhorn-system/im-a", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := append(storageNetwork(), orip("192.168.50.9", "longhorn-system/leftover"))
			s, cs := newStore(objs...)
			got, err := s.ReleaseReservation(context.Background(), "192.168.50.0-24", "", net.ParseIP(tt.ip), tt.podRef, "c")
			require.NoError(t, err)
			assert.Equal(t, tt.wantDeleted, got)
			names := oripNames(t, cs)
			if tt.wantDeleted != "" {
				assert.NotContains(t, names, tt.wantDeleted)
			} else {
				assert.Len(t, names, 7, "nothing deleted")
			}
		})
	}
}

func TestInCarriesSettingsToAnotherNamespace(t *testing.T) {
	s, _ := newStore()
	var hooked []string
	s.Hook = func(p string) { hooked = append(hooked, p) }
	assert.Same(t, s, s.In(""), "no namespace: the same store")
	assert.Same(t, s, s.In(ns), "its own namespace: the same store")
	o := s.In("harvester-system")
	assert.Equal(t, "harvester-system", o.Namespace())
	assert.Equal(t, s.Backoff, o.Backoff)
	assert.Equal(t, s.CallTimeout, o.CallTimeout)
	require.NotNil(t, o.Hook, "a crash-test hook follows the store")
	o.Hook("x")
	assert.Equal(t, []string{"x"}, hooked)
}
