package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubePods decodes only names and phases from the server's PodList, follows
// its continue tokens, and passes the server's refusal on in its own words.
func TestKubePodsReadsNamesAndPhasesPageByPage(t *testing.T) {
	pages := map[string]corev1.PodList{
		"": {ListMeta: metav1.ListMeta{Continue: "page2"}, Items: []corev1.Pod{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "im-a"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "im-b"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		}},
		"page2": {Items: []corev1.Pod{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "im-c"}, Status: corev1.PodStatus{Phase: corev1.PodFailed}},
		}},
	}
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.Path+"?limit="+r.URL.Query().Get("limit")+"&continue="+r.URL.Query().Get("continue"))
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/v1/namespaces/longhorn-system/pods" {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
				Message: `pods is forbidden: User "whereabouts" cannot list resource "pods" in the namespace "other"`})
			return
		}
		l := pages[r.URL.Query().Get("continue")]
		l.Kind, l.APIVersion = "PodList", "v1"
		_ = json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "whereabouts.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL), 0o600))

	pods, err := kubePods(context.Background(), kubeconfig, "longhorn-system")
	require.NoError(t, err)
	assert.Equal(t, []Pod{
		{Namespace: "longhorn-system", Name: "im-a", Phase: "Running"},
		{Namespace: "longhorn-system", Name: "im-b", Phase: "Succeeded"},
		{Namespace: "longhorn-system", Name: "im-c", Phase: "Failed"},
	}, pods)
	assert.Equal(t, []string{
		"/api/v1/namespaces/longhorn-system/pods?limit=500&continue=",
		"/api/v1/namespaces/longhorn-system/pods?limit=500&continue=page2",
	}, asked)

	_, err = kubePods(context.Background(), kubeconfig, "other")
	require.Error(t, err)
	assert.Equal(t, `pods is forbidden: User "whereabouts" cannot list resource "pods" in the namespace "other"`, err.Error())
}
