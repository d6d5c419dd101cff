package install

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Only an uninstall gives the name back: the DaemonSet gone, being deleted,
// or the installer's service account gone with it. A rollout, a restart, a
// shutdown, or a DaemonSet that cannot be read keeps it.
func TestRemoving(t *testing.T) {
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	present := &appsv1.DaemonSet{}
	deleting := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: time.Unix(1e9, 0)}}}
	notFound := apierrors.NewNotFound(gr, "harvester-ipam")
	unauthorized := apierrors.NewUnauthorized("token refused")
	forbidden := apierrors.NewForbidden(gr, "harvester-ipam", errors.New("no role"))
	refused := errors.New("dial tcp 10.43.0.1:443: connect: connection refused")
	type answer struct {
		ds  *appsv1.DaemonSet
		err error
	}
	tests := []struct {
		name      string
		answers   []answer
		uninstall bool
		reads     int
		why       string
	}{
		{"in place: a rollout, a restart, a shutdown", []answer{{present, nil}}, false, 1, "is in place"},
		{"gone", []answer{{nil, notFound}}, true, 1, "is gone"},
		{"being deleted (foreground)", []answer{{deleting, nil}}, true, 1, "is being deleted (since 2001-09-09T01:46:40Z)"},
		{"its service account gone too", []answer{{nil, unauthorized}}, true, 1, "service account is gone"},
		{"its role gone first, then its account", []answer{{nil, forbidden}, {nil, unauthorized}}, true, 2, "service account is gone"},
		{"unreachable, then in place", []answer{{nil, refused}, {present, nil}}, false, 2, "is in place"},
		{"unreachable", []answer{{nil, refused}, {nil, refused}, {nil, refused}}, false, 3, "could not be read (dial tcp"},
		// helm deletes the Role with the DaemonSet, and the ServiceAccount
		// after them; the API server keeps accepting a token it authenticated
		// within 10 s, so the 403s last that long before the 401.
		{"its role gone, its account's token still cached for 10 s", append(repeat(answer{nil, forbidden}, 11), answer{nil, unauthorized}), true, 12, "service account is gone"},
		{"access refused for good", repeat(answer{nil, forbidden}, 20), false, 15, "could not be read"},
		{"no answer", []answer{{nil, context.DeadlineExceeded}, {nil, context.DeadlineExceeded}, {nil, context.DeadlineExceeded}}, false, 3, "no answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads, slept := 0, 0
			o := &Owner{Namespace: "kube-system", Name: "harvester-ipam", Get: func(context.Context) (*appsv1.DaemonSet, error) {
				a := tt.answers[min(reads, len(tt.answers)-1)]
				reads++
				return a.ds, a.err
			}}
			r := o.Removing(context.Background(), func(time.Duration) { slept++ })
			assert.Equal(t, tt.uninstall, r.Uninstall, r.Why)
			assert.Equal(t, tt.reads, reads, "reads of the DaemonSet")
			assert.Equal(t, tt.reads-1, slept, "a pause between reads, none after the last")
			assert.Contains(t, r.Why, tt.why)
		})
	}
}

// NewOwner reads the DaemonSet named, through the kubeconfig given (the
// pod's service account when none is), each read bounded.
func TestNewOwnerReadsItsDaemonSet(t *testing.T) {
	var gone atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/apps/v1/namespaces/kube-system/daemonsets/harvester-ipam" || gone.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"harvester-ipam","namespace":"kube-system"}}`))
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600))

	_, err := NewOwner(kc, "", "harvester-ipam")
	assert.ErrorContains(t, err, "needs a namespace and a name")
	_, err = NewOwner(filepath.Join(t.TempDir(), "missing"), "kube-system", "harvester-ipam")
	assert.ErrorContains(t, err, "a client to read DaemonSet kube-system/harvester-ipam")

	o, err := NewOwner(kc, "kube-system", "harvester-ipam")
	require.NoError(t, err)
	nosleep := func(time.Duration) {}
	r := o.Removing(context.Background(), nosleep)
	assert.False(t, r.Uninstall, r.Why)
	assert.Contains(t, r.Why, "DaemonSet kube-system/harvester-ipam is in place")
	gone.Store(true)
	r = o.Removing(context.Background(), nosleep)
	assert.True(t, r.Uninstall, r.Why)
	assert.Contains(t, r.Why, "is gone")
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}
