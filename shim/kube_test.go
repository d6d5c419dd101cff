package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// The API on a real server is a thin translation to REST requests: what
// each call asks the server for, and the answers decoded.
func TestKubeAPIAsksTheServerForWhatItSays(t *testing.T) {
	pool := &Pool{TypeMeta: metav1.TypeMeta{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.0-24", Namespace: "kube-system", ResourceVersion: "5"}}
	pool.Spec.Range = "192.168.50.0/24"
	pool.Spec.Allocations = map[string]IPAllocation{"4": {ContainerID: "c", PodRef: "ns/p"}}
	orip := &Reservation{TypeMeta: metav1.TypeMeta{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "OverlappingRangeIPReservation"},
		ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.4", Namespace: "kube-system", UID: "u1", ResourceVersion: "7"}}
	orip.Spec.PodRef = "ns/p"
	type req struct{ method, path, query, contentType, body string }
	var reqs []req
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		reqs = append(reqs, req{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), strings.TrimSpace(string(b))})
		w.Header().Set("Content-Type", "application/json")
		var out any
		switch {
		case r.Method == http.MethodDelete:
			out = metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess}
		case strings.HasSuffix(r.URL.Path, "/ippools"):
			if r.Method == http.MethodPost {
				out = pool
			} else {
				out = &PoolList{TypeMeta: metav1.TypeMeta{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPoolList"},
					ListMeta: metav1.ListMeta{Continue: "c2"}, Items: []Pool{*pool}}
			}
		case strings.Contains(r.URL.Path, "/ippools/"):
			out = pool
		case strings.HasSuffix(r.URL.Path, "/overlappingrangeipreservations"):
			if r.Method == http.MethodPost {
				out = orip
			} else {
				out = &ReservationList{TypeMeta: metav1.TypeMeta{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "OverlappingRangeIPReservationList"},
					Items: []Reservation{*orip}}
			}
		default:
			out = orip
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()
	api, err := NewKubeAPI(&rest.Config{Host: srv.URL})
	require.NoError(t, err)
	ctx := context.Background()

	got, err := api.GetPool(ctx, "kube-system", pool.Name, Fresh)
	require.NoError(t, err)
	assert.Equal(t, pool.Spec, got.Spec)
	assert.Equal(t, "5", got.ResourceVersion)
	_, err = api.GetPool(ctx, "kube-system", pool.Name, Cache)
	require.NoError(t, err)
	ps, next, err := api.ListPools(ctx, "kube-system", Page{Limit: 3, Continue: "c1"})
	require.NoError(t, err)
	assert.Len(t, ps, 1)
	assert.Equal(t, "c2", next)
	_, err = api.PatchPool(ctx, "kube-system", pool.Name, Guarded("5", PatchOp{Op: "remove", Path: "/spec/allocations/4"}))
	require.NoError(t, err)
	_, err = api.CreatePool(ctx, "kube-system", &Pool{ObjectMeta: metav1.ObjectMeta{Name: "p2"}})
	require.NoError(t, err)
	require.NoError(t, api.DeletePool(ctx, "kube-system", "p2", Preconditions{UID: "u2", ResourceVersion: "9"}))
	os, _, err := api.ListReservations(ctx, "kube-system", Page{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, "ns/p", os[0].Spec.PodRef)
	o, err := api.GetReservation(ctx, "kube-system", orip.Name)
	require.NoError(t, err)
	assert.Equal(t, orip.Name, o.Name)
	_, err = api.CreateReservation(ctx, "kube-system", &Reservation{ObjectMeta: metav1.ObjectMeta{Name: "192.168.50.5"}})
	require.NoError(t, err)
	_, err = api.PatchReservation(ctx, "kube-system", orip.Name, Guarded("7", PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{"a": "b"}}))
	require.NoError(t, err)
	require.NoError(t, api.DeleteReservation(ctx, "kube-system", orip.Name, Preconditions{UID: "u1", ResourceVersion: "7"}))

	const base = "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/"
	const delBody = `{"kind":"DeleteOptions","apiVersion":"whereabouts.cni.cncf.io/v1alpha1","preconditions":{"uid":"%s","resourceVersion":"%s"}}`
	want := []req{
		{"GET", base + "ippools/192.168.50.0-24", "", "", ""},
		{"GET", base + "ippools/192.168.50.0-24", "resourceVersion=0", "", ""},
		{"GET", base + "ippools", "continue=c1&limit=3", "", ""},
		{"PATCH", base + "ippools/192.168.50.0-24", "", "application/json-patch+json",
			`[{"op":"test","path":"/metadata/resourceVersion","value":"5"},{"op":"remove","path":"/spec/allocations/4"}]`},
		{"POST", base + "ippools", "", "application/json",
			`{"kind":"IPPool","apiVersion":"whereabouts.cni.cncf.io/v1alpha1","metadata":{"name":"p2"},"spec":{"range":"","allocations":null}}`},
		{"DELETE", base + "ippools/p2", "", "application/json", fmt.Sprintf(delBody, "u2", "9")},
		{"GET", base + "overlappingrangeipreservations", "limit=2", "", ""},
		{"GET", base + "overlappingrangeipreservations/192.168.50.4", "", "", ""},
		{"POST", base + "overlappingrangeipreservations", "", "application/json",
			`{"kind":"OverlappingRangeIPReservation","apiVersion":"whereabouts.cni.cncf.io/v1alpha1","metadata":{"name":"192.168.50.5"},"spec":{"podref":""}}`},
		{"PATCH", base + "overlappingrangeipreservations/192.168.50.4", "", "application/json-patch+json",
			`[{"op":"test","path":"/metadata/resourceVersion","value":"7"},{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]`},
		{"DELETE", base + "overlappingrangeipreservations/192.168.50.4", "", "application/json", fmt.Sprintf(delBody, "u1", "7")},
	}
	require.Len(t, reqs, len(want))
	for i := range want {
		assert.Equal(t, want[i], reqs[i], "request %d", i)
	}
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
	// A list as of one of our own writes, or later: the first page only.
	_, _, _ = api.ListPools(context.Background(), "kube-system", Page{Limit: 3, NotOlderThan: "42"})
	_, _, _ = api.ListPools(context.Background(), "kube-system", Page{Limit: 3, NotOlderThan: "42", Continue: "c1"})
	assert.Equal(t, []string{"continue=c1&limit=3", "limit=2", "limit=3&resourceVersion=42&resourceVersionMatch=NotOlderThan", "continue=c1&limit=3"}, queries)
}

// roundTrip is an http.RoundTripper that records a request's query and
// answers nothing.
type roundTrip func(query string)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) {
	f(r.URL.RawQuery)
	return nil, errors.New("no server")
}
