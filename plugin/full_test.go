package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// When whereabouts finds the range full, the CNI error says so in words:
// the pool, its entries, how many of them the reconciler would release and
// whose, and what to run; with the delegate's code kept. When the pods cannot
// be listed (whereabouts' identity without pods list), it says so and still
// gives what the pool alone tells.
func TestAddSaysWhyTheRangeIsFull(t *testing.T) {
	const lh = "longhorn-system"
	full := &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: "192.168.60.0-29", Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.60.0/29", Allocations: map[string]alloc{
			"1": {ContainerID: "a1", PodRef: lh + "/im-a", IfName: "lhnet1"},
			"2": {ContainerID: "a2", PodRef: lh + "/im-a", IfName: "lhnet1"},
			"3": {ContainerID: "a3", PodRef: lh + "/im-a"},
			"4": {ContainerID: "g1", PodRef: lh + "/im-gone", IfName: "lhnet1"},
			"5": {ContainerID: "b1", PodRef: lh + "/im-b", IfName: "lhnet1"},
			"6": {ContainerID: "c1", PodRef: lh + "/im-c", IfName: "lhnet1"},
		}}}
	pods := []Pod{
		{Namespace: lh, Name: "im-a", Phase: "Running"},
		{Namespace: lh, Name: "im-b", Phase: "Running"},
		{Namespace: lh, Name: "im-c", Phase: "Succeeded"},
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "system:serviceaccount:kube-system:harvester-whereabouts" cannot list resource "pods"`))
	tests := []struct {
		name    string
		list    func(ctx context.Context, kubeconfig, ns string) ([]Pod, error)
		want    []string
		notWant []string
	}{{
		name: "pods listed",
		list: func(_ context.Context, _, ns string) ([]Pod, error) {
			require.Equal(t, lh, ns)
			return pods, nil
		},
		want: []string{
			"whereabouts ADD: Could not allocate IP in range",
			"pool kube-system/192.168.60.0-29 (192.168.60.0/29) holds 6 entries, 4 of them stale by this count",
			"2 entries of earlier sandboxes of 1 pods (longhorn-system/im-a holds 3 under 3 sandboxes)",
			"2 entries of 2 pods gone or finished (longhorn-system/im-c, longhorn-system/im-gone)",
			"nodes not checked",
		},
	}, {
		name: "pods cannot be listed",
		list: func(context.Context, string, string) ([]Pod, error) { return nil, forbidden },
		want: []string{
			"holds 6 entries, 2 of them stale by this count: 2 entries of earlier sandboxes of 1 pods (longhorn-system/im-a holds 3 under 3 sandboxes)",
			`could not check pods in longhorn-system (pods is forbidden: User "system:serviceaccount:kube-system:harvester-whereabouts" cannot list resource "pods")`,
		},
		notWant: []string{"gone or finished", "nodes not checked"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, full)
			r.p.Pods = tt.list
			stdin := []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"storagenetwork","type":"bridge",
				"ipam":{"type":"harvester-ipam","range":"192.168.60.0/29","configuration_path":%q,"harvester_ipam":{"checkpoint_dir":%q}}}`, r.flat, r.cpDir))
			reads := 0
			r.api.Hook = func(c *fake.Call) error {
				if c.Resource == fake.Pools && c.Verb == "get" && c.From == shim.Fresh && len(r.calls()) > 0 {
					reads++
				}
				return nil
			}
			err := r.p.Add(args(t, "new", "lhnet1", "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-new", stdin))
			var ce *cnitypes.Error
			require.ErrorAs(t, err, &ce)
			t.Logf("%s", ce.Error())
			assert.Equal(t, uint(cnitypes.ErrInternal), ce.Code, "the delegate's code")
			for _, w := range tt.want {
				assert.Contains(t, ce.Error(), w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, ce.Error(), w)
			}
			assert.Contains(t, ce.Details, "`kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler inspect`")
			assert.Contains(t, ce.Details, "`kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler --grace 0 --dry-run`")
			assert.NotRegexp(t, `;\s*$`, ce.Details, "the delegate said no details: nothing joined after the hint")
			assert.Equal(t, 2, reads, "whereabouts' own read, then one fresh read of the pool to explain")
			assert.Contains(t, r.log.String(), "holds 6 entries")
		})
	}
}

// Any other failure of the delegate is passed on as it was.
func TestAddOtherDelegateFailuresAreNotExplained(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.p.Pods = func(context.Context, string, string) ([]Pod, error) {
		t.Fatal("pods listed for a failure that is not a full range")
		return nil, nil
	}
	r.del.Before = func(verb string) error {
		return &cnitypes.Error{Code: 11, Msg: "error getting IP from IPAM: k8s get error: the server was unable to return a response"}
	}
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	var ce *cnitypes.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, uint(11), ce.Code)
	assert.Equal(t, "whereabouts ADD: error getting IP from IPAM: k8s get error: the server was unable to return a response", ce.Msg)
}

// What the message says of a full pool, whole: nothing is said of what is
// not there (no duplicates, no namespaces to check), and at most five pods
// are named, with how many more.
func TestTheFullPoolExplained(t *testing.T) {
	pool := func(allocs map[string]alloc) *shim.Pool {
		return &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.0-24", Namespace: "kube-system"},
			Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "10.0.0.0/24", Allocations: allocs}}
	}
	legacy := map[string]alloc{}
	for i := 1; i <= 3; i++ {
		legacy[fmt.Sprint(i)] = alloc{ContainerID: fmt.Sprint("c", i)} // no podref
	}
	sevenDups := map[string]alloc{}
	for i := 0; i < 7; i++ {
		for j := 0; j < 2; j++ {
			sevenDups[fmt.Sprint(10*i+j+1)] = alloc{ContainerID: fmt.Sprint("c", i, j), PodRef: fmt.Sprintf("ns/p%d", i), IfName: "lhnet1"}
		}
	}
	// One sandbox with two attachments (lhnet1, lhnet2), both live, and one
	// pod with an earlier sandbox's entry beside its current two.
	siblings := map[string]alloc{
		"1": {ContainerID: "cur", PodRef: "ns/p0", IfName: "lhnet1"},
		"2": {ContainerID: "cur", PodRef: "ns/p0", IfName: "lhnet2"},
		"3": {ContainerID: "new", PodRef: "ns/p1", IfName: "lhnet1"},
		"4": {ContainerID: "new", PodRef: "ns/p1", IfName: "lhnet2"},
		"5": {ContainerID: "old", PodRef: "ns/p1", IfName: "lhnet1"},
	}
	oneGone := map[string]alloc{
		"1": {ContainerID: "cur", PodRef: "ns/p0", IfName: "lhnet1"},
		"2": {ContainerID: "g1", PodRef: "ns/gone", IfName: "lhnet1"},
	}
	for _, tt := range []struct {
		name      string
		pool      *shim.Pool
		want      string
		listFails bool
	}{
		{"pods of more namespaces than it lists: said so", pool(map[string]alloc{
			"1": {ContainerID: "a1", PodRef: "nsa/p0"}, "2": {ContainerID: "a2", PodRef: "nsa/p1"},
			"3": {ContainerID: "b1", PodRef: "nsb/p0"}, "4": {ContainerID: "c1", PodRef: "nsc/p0"}, "5": {ContainerID: "d1", PodRef: "nsd/p0"},
		}), "pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 5 entries, 0 of them stale by this count: " +
			"pods of 1 more namespaces not checked; nodes not checked", false},
		{"one pod gone: named", pool(oneGone),
			"pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 2 entries, 1 of them stale by this count: " +
				"1 entries of 1 pods gone or finished (ns/gone); nodes not checked", false},
		{"the pods cannot be listed, and that is all there is to say", pool(oneGone),
			"pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 2 entries, 0 of them stale by this count: " +
				"could not check pods in ns (the server is down)", true},
		{"two attachments of one sandbox are not extra", pool(siblings),
			"pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 5 entries, 1 of them stale by this count: " +
				"1 entries of earlier sandboxes of 1 pods (ns/p1 holds 3 under 2 sandboxes); nodes not checked", false},
		{"entries of no pod: nothing to say of them", pool(legacy),
			"pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 3 entries, 0 of them stale by this count", false},
		{"seven pods holding two each: five named", pool(sevenDups),
			"pool kube-system/10.0.0.0-24 (10.0.0.0/24) holds 14 entries, 7 of them stale by this count: " +
				"7 entries of earlier sandboxes of 7 pods (ns/p0 holds 2 under 2 sandboxes, ns/p1 holds 2 under 2 sandboxes, ns/p2 holds 2 under 2 sandboxes, ns/p3 holds 2 under 2 sandboxes, ns/p4 holds 2 under 2 sandboxes, and 2 more); nodes not checked", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &Plugin{Pods: func(_ context.Context, _, ns string) ([]Pod, error) {
				if tt.listFails {
					return nil, errors.New("the server is down")
				}
				var out []Pod
				for i := 0; i < 7; i++ {
					out = append(out, Pod{Namespace: ns, Name: fmt.Sprintf("p%d", i), Phase: "Running"})
				}
				return out, nil
			}}
			assert.Equal(t, tt.want, p.explainPool(context.Background(), "kube-system", tt.pool, "/nonexistent"))
		})
	}
}

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
		{"a kubeconfig that does not load", nil, true, nil, 0, "does not parse"},
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

			pods, err := kubePods(context.Background(), kc, "longhorn-system", func(time.Duration) {})
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

// Each pool of the config is explained, or said to be missing or unreadable.
func TestTheFullRangeExplainsEveryPool(t *testing.T) {
	api := fake.New()
	api.Put(fake.NewPool("10.0.0.0-30", "10.0.0.0/30", map[string]alloc{"1": {ContainerID: "c1"}, "2": {ContainerID: "c2"}}))
	api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Pools && c.Name == "10.2.0.0-30" {
			return errors.New("etcdserver: request timed out")
		}
		return nil
	}
	p := &Plugin{}
	cfg := &conf.Config{Pools: []conf.Pool{{Name: "10.0.0.0-30"}, {Name: "10.1.0.0-30"}, {Name: "10.2.0.0-30"}}}
	facts, hint := p.explainFull(shim.New(api, "kube-system", shim.Options{}), cfg)
	assert.Equal(t, "pool kube-system/10.0.0.0-30 (10.0.0.0/30) holds 2 entries, 0 of them stale by this count; "+
		"pool kube-system/10.1.0.0-30 does not exist; "+
		"pool kube-system/10.2.0.0-30 could not be read (get pool kube-system/10.2.0.0-30: etcdserver: request timed out)", facts)
	assert.Contains(t, hint, "harvester-ipam-reconciler inspect")
}
