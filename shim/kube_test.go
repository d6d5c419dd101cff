package shim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	wbfake "github.com/k8snetworkplumbingwg/whereabouts/pkg/generated/clientset/versioned/fake"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// The API on a real server is a thin translation to client-go: what each
// call asks the server for.
func TestKubeAPIAsksTheServerForWhatItSays(t *testing.T) {
	pool := &Pool{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.0-24", Namespace: "kube-system"}}
	pool.Spec.Range = "192.168.50.0/24"
	pool.Spec.Allocations = map[string]IPAllocation{"4": {ContainerID: "c", PodRef: "ns/p"}}
	orip := &Reservation{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.4", Namespace: "kube-system", UID: "u1", ResourceVersion: "7"}}
	wb := wbfake.NewSimpleClientset(pool, orip)
	var actions []k8stesting.Action
	record := func(a k8stesting.Action) (bool, runtime.Object, error) {
		actions = append(actions, a)
		return false, nil, nil
	}
	wb.PrependReactor("*", "*", record)
	api := &kubeAPI{wb: wb.WhereaboutsV1alpha1()}
	ctx := context.Background()

	got, err := api.GetPool(ctx, "kube-system", pool.Name, Fresh)
	require.NoError(t, err)
	assert.Equal(t, pool.Spec, got.Spec)
	_, err = api.GetPool(ctx, "kube-system", pool.Name, Cache)
	require.NoError(t, err)
	ps, next, err := api.ListPools(ctx, "kube-system", Page{Limit: 3, Continue: "c1"})
	require.NoError(t, err)
	assert.Len(t, ps, 1)
	assert.Equal(t, "", next)
	_, err = api.PatchPool(ctx, "kube-system", pool.Name, Guarded("x", PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{"a": "b"}}))
	assert.Error(t, err, "the resourceVersion test fails: the patch is sent as a JSON patch")
	os, _, err := api.ListReservations(ctx, "kube-system", Page{Limit: 2})
	require.NoError(t, err)
	assert.Len(t, os, 1)
	o, err := api.GetReservation(ctx, "kube-system", orip.Name)
	require.NoError(t, err)
	assert.Equal(t, orip.Name, o.Name)
	_, err = api.PatchReservation(ctx, "kube-system", orip.Name, Guarded("7", PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{"a": "b"}}))
	require.NoError(t, err)
	require.NoError(t, api.DeleteReservation(ctx, "kube-system", orip.Name, Preconditions{UID: "u1", ResourceVersion: "7"}))

	require.Len(t, actions, 8)
	get := func(i int) k8stesting.GetActionImpl { return actions[i].(k8stesting.GetActionImpl) }
	list := func(i int) k8stesting.ListActionImpl { return actions[i].(k8stesting.ListActionImpl) }
	assert.Equal(t, "ippools", get(0).GetResource().Resource)
	assert.Equal(t, "192.168.50.0-24", get(0).GetName())
	assert.Equal(t, "kube-system", get(0).GetNamespace())
	assert.Equal(t, "ippools", get(1).GetResource().Resource)
	assert.Equal(t, "ippools", list(2).GetResource().Resource)
	patch := actions[3].(k8stesting.PatchActionImpl)
	assert.Equal(t, types.JSONPatchType, patch.GetPatchType())
	var ops []map[string]any
	require.NoError(t, json.Unmarshal(patch.GetPatch(), &ops))
	assert.Equal(t, "test", ops[0]["op"])
	assert.Equal(t, "overlappingrangeipreservations", list(4).GetResource().Resource)
	assert.Equal(t, "overlappingrangeipreservations", get(5).GetResource().Resource)
	assert.Equal(t, types.JSONPatchType, actions[6].(k8stesting.PatchActionImpl).GetPatchType())
	del := actions[7].(k8stesting.DeleteActionImpl)
	require.NotNil(t, del.DeleteOptions.Preconditions)
	assert.Equal(t, types.UID("u1"), *del.DeleteOptions.Preconditions.UID)
	assert.Equal(t, "7", *del.DeleteOptions.Preconditions.ResourceVersion)
}

// Leases go through a REST client that knows only Leases: the requests a
// typed client would make, and the answers decoded, a 404 as NotFound.
func TestKubeAPILeases(t *testing.T) {
	type req struct{ method, path, holder string }
	var reqs []req
	var agents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		agents = append(agents, r.UserAgent())
		var l coordinationv1.Lease
		_ = json.NewDecoder(r.Body).Decode(&l)
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		reqs = append(reqs, req{r.Method, r.URL.Path, holder})
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: `leases.coordination.k8s.io "whereabouts" not found`,
				Details: &metav1.StatusDetails{Name: "whereabouts", Group: "coordination.k8s.io", Kind: "leases"}})
			return
		}
		l.APIVersion, l.Kind = "coordination.k8s.io/v1", "Lease"
		l.ResourceVersion = "42"
		_ = json.NewEncoder(w).Encode(&l)
	}))
	defer srv.Close()
	api, err := NewKubeAPI(&rest.Config{Host: srv.URL, UserAgent: "harvester-ipam"})
	require.NoError(t, err)
	ctx := context.Background()

	_, err = api.GetLease(ctx, "kube-system", "whereabouts")
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
	holder := "node-a"
	l, err := api.CreateLease(ctx, &Lease{ObjectMeta: metav1.ObjectMeta{Name: "whereabouts", Namespace: "kube-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}})
	require.NoError(t, err)
	assert.Equal(t, "42", l.ResourceVersion)
	require.NotNil(t, l.Spec.HolderIdentity)
	assert.Equal(t, "node-a", *l.Spec.HolderIdentity)
	l, err = api.UpdateLease(ctx, l)
	require.NoError(t, err)
	assert.Equal(t, "whereabouts", l.Name)
	assert.Equal(t, []req{
		{"GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/whereabouts", ""},
		{"POST", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", "node-a"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/whereabouts", "node-a"},
	}, reqs)
	// The server's audit log names the plugin as the kubeconfig's config
	// does; a config without one gets client-go's default, never none.
	assert.Equal(t, []string{"harvester-ipam", "harvester-ipam", "harvester-ipam"}, agents)
	agents = nil
	bare, err := NewKubeAPI(&rest.Config{Host: srv.URL})
	require.NoError(t, err)
	_, _ = bare.GetLease(ctx, "kube-system", "whereabouts")
	assert.Equal(t, []string{rest.DefaultKubernetesUserAgent()}, agents)
}

// The Cache read asks for resourceVersion "0" (the watch cache); a Fresh one
// for none (a quorum read). The fake clientset drops GetOptions, so this is
// checked on the request client-go builds.
func TestAFreshReadIsAQuorumRead(t *testing.T) {
	for _, tt := range []struct {
		from Source
		want string
	}{
		{Fresh, ""},
		{Cache, "resourceVersion=0"},
	} {
		var query string
		api, err := NewKubeAPI(&rest.Config{Host: "http://127.0.0.1:1", Transport: roundTrip(func(q string) { query = q })})
		require.NoError(t, err)
		_, _ = api.GetPool(context.Background(), "kube-system", "p", tt.from)
		assert.Equal(t, tt.want, query)
	}
	// Pages are asked for as such.
	var queries []string
	api, err := NewKubeAPI(&rest.Config{Host: "http://127.0.0.1:1", Transport: roundTrip(func(q string) { queries = append(queries, q) })})
	require.NoError(t, err)
	_, _, _ = api.ListPools(context.Background(), "kube-system", Page{Limit: 3, Continue: "c1"})
	_, _, _ = api.ListReservations(context.Background(), "kube-system", Page{Limit: 2})
	assert.Equal(t, []string{"continue=c1&limit=3", "limit=2"}, queries)
}

// roundTrip is an http.RoundTripper that records a request's query and
// answers nothing.
type roundTrip func(query string)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) {
	f(r.URL.RawQuery)
	return nil, errors.New("no server")
}
