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

// kubePods lists a namespace's pods page by page (500 a page, following the
// continue token), on the kubeconfig, at most explainPodPages pages, and
// decodes names and phases only; what fails says so in the server's words.
func TestKubePods(t *testing.T) {
	running := func(name string) Pod { return Pod{Namespace: "longhorn-system", Name: name, Phase: "Running"} }
	page := func(cont string, pods ...Pod) string {
		items := make([]map[string]any, 0, len(pods))
		for _, p := range pods {
			items = append(items, map[string]any{"metadata": map[string]any{"name": p.Name, "namespace": p.Namespace}, "status": map[string]any{"phase": p.Phase}})
		}
		b, _ := json.Marshal(map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": map[string]any{"continue": cont}, "items": items})
		return string(b)
	}
	for _, tt := range []struct {
		name      string
		pages     func(n int) (int, string) // the answer to the n-th request (from 0)
		badConfig bool
		wantPods  []Pod
		wantReqs  int32
		wantErr   string
	}{
		{"one page", func(int) (int, string) { return 200, page("", running("im-a"), running("im-b")) }, false, []Pod{running("im-a"), running("im-b")}, 1, ""},
		{"two pages, phases as the server says", func(n int) (int, string) {
			if n == 0 {
				return 200, page("next0", running("im-a"), Pod{Namespace: "longhorn-system", Name: "im-b", Phase: "Succeeded"})
			}
			return 200, page("", Pod{Namespace: "longhorn-system", Name: "im-c", Phase: "Failed"})
		}, false, []Pod{running("im-a"), {Namespace: "longhorn-system", Name: "im-b", Phase: "Succeeded"}, {Namespace: "longhorn-system", Name: "im-c", Phase: "Failed"}}, 2, ""},
		{"pages without end: ten read, then given up", func(n int) (int, string) {
			if n >= explainPodPages {
				return 500, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"read past the bound","code":500}`
			}
			return 200, page(fmt.Sprint("next", n), running(fmt.Sprint("im-", n)))
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
				assert.Equal(t, "500", r.URL.Query().Get("limit"))
				wantCont := "" // the first page; then the token page n-1 gave
				if n > 0 {
					wantCont = fmt.Sprint("next", n-1)
				}
				assert.Equal(t, wantCont, r.URL.Query().Get("continue"), "request %d follows the previous page's token", n)
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
			assert.Equal(t, tt.wantPods, pods)
		})
	}
}
