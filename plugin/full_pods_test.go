package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kubePods lists a namespace's pods page by page, on the kubeconfig, at most
// explainPodPages pages; what fails says so.
func TestKubePods(t *testing.T) {
	page := func(cont string, names ...string) string {
		items := make([]map[string]any, 0, len(names))
		for _, n := range names {
			items = append(items, map[string]any{"metadata": map[string]any{"name": n, "namespace": "longhorn-system"}, "status": map[string]any{"phase": "Running"}})
		}
		b, _ := json.Marshal(map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": map[string]any{"continue": cont}, "items": items})
		return string(b)
	}
	for _, tt := range []struct {
		name      string
		pages     func(n int) (int, string) // the answer to the n-th request (from 0)
		badConfig bool
		wantPods  []string
		wantReqs  int32
		wantErr   string
	}{
		{"one page", func(int) (int, string) { return 200, page("", "im-a", "im-b") }, false, []string{"im-a", "im-b"}, 1, ""},
		{"two pages", func(n int) (int, string) {
			if n == 0 {
				return 200, page("next", "im-a")
			}
			return 200, page("", "im-b")
		}, false, []string{"im-a", "im-b"}, 2, ""},
		{"pages without end: ten read, then given up", func(n int) (int, string) {
			if n >= explainPodPages {
				return 500, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"read past the bound","code":500}`
			}
			return 200, page(fmt.Sprint("next", n), fmt.Sprint("im-", n))
		}, false, nil, explainPodPages, "too many pods to list here"},
		{"forbidden", func(int) (int, string) {
			return 403, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden: cannot list resource \"pods\"","reason":"Forbidden","code":403}`
		}, false, nil, 1, `pods is forbidden: cannot list resource "pods"`},
		{"a kubeconfig that does not load", nil, true, nil, 0, "cannot load kubeconfig"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var reqs atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := reqs.Add(1) - 1
				assert.Equal(t, "/api/v1/namespaces/longhorn-system/pods", r.URL.Path)
				code, body := tt.pages(int(n))
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				_, _ = w.Write([]byte(body))
			}))
			defer srv.Close()
			kc := filepath.Join(t.TempDir(), "kubeconfig")
			text := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"" + srv.URL + "\"}}]\nusers: [{name: u, user: {token: t0ken}}]\ncontexts: [{name: w, context: {cluster: c, user: u}}]\ncurrent-context: w\n"
			if tt.badConfig {
				text = "contexts: [\n"
			}
			require.NoError(t, os.WriteFile(kc, []byte(text), 0o600))

			pods, err := kubePods(context.Background(), kc, "longhorn-system")
			assert.Equal(t, tt.wantReqs, reqs.Load(), "requests")
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				assert.Nil(t, pods)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, p := range pods {
				names = append(names, p.Name)
			}
			assert.Equal(t, tt.wantPods, names)
		})
	}
}
