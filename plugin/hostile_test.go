package plugin

import (
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
)

// hostileAttachments are CNI_CONTAINERID / CNI_IFNAME pairs a checkpoint path
// could be built from that leaves the checkpoint dir, or that no file name
// can hold.
var hostileAttachments = []struct {
	name, id, ifname, want string
}{
	{"container ID climbs out", "../../etc/cron.d/x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID climbs to the parent", "..", "lhnet1", "CNI_CONTAINERID"},
	{"container ID climbs out behind a prefix", "abc/../../x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID is absolute", "/etc/passwd", "lhnet1", "CNI_CONTAINERID"},
	{"container ID with NUL", "abc\x00../../x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID too long", strings.Repeat("f", 201), "lhnet1", "at most 200"},
	{"container ID empty", "", "lhnet1", "CNI_CONTAINERID is empty"},
	{"ifname climbs out", "new", "../../x", "CNI_IFNAME"},
	{"ifname is ..", "new", "..", "CNI_IFNAME"},
	{"ifname with a slash", "new", "a/b", "CNI_IFNAME"},
	{"ifname with NUL", "new", "lh\x00net1", "CNI_IFNAME"},
	{"ifname too long", "new", "lhnet1-lhnet1-lh", "longer than 15 bytes"},
	{"ifname not UTF-8", "new", "lh\x93", "not valid UTF-8"},
}

// hostileArgs are args() without the environment, which cannot hold NUL:
// nothing may be delegated anyway.
func hostileArgs(id, ifname, cniArgs string, stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: id, IfName: ifname, Netns: "/var/run/netns/x", Args: cniArgs, Path: "/opt/cni/bin", StdinData: stdin}
}

// tree lists every path under dir.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Strings(paths)
	return paths
}

func TestHostileAttachmentsAreRefused(t *testing.T) {
	for _, verb := range []string{"ADD", "DEL"} {
		for _, tt := range hostileAttachments {
			t.Run(verb+" "+tt.name, func(t *testing.T) {
				// The pool holds an allocation of exactly this attachment and
				// earlier sandboxes of the pod: a DEL or ADD that went on would
				// release one or the other.
				objs := crashLoopedPool()
				pool := objs[0].(*shim.Pool)
				pool.Spec.Allocations["9"] = alloc{ContainerID: tt.id, PodRef: "longhorn-system/im-a", IfName: tt.ifname}
				r := newRig(t, objs...)
				want := r.pool() // as the API server stores it
				dir := filepath.Dir(r.cpDir)
				before := tree(t, dir)

				a := hostileArgs(tt.id, tt.ifname, podArgs, r.config("0.3.1", ""))
				var err error
				if verb == "ADD" {
					err = r.p.Add(a)
				} else {
					err = r.p.Del(a)
				}

				assert.Equal(t, cnitypes.ErrInvalidEnvironmentVariables, cniCode(t, err), "%v", err)
				ce := err.(*cnitypes.Error)
				assert.Contains(t, ce.Msg, tt.want)
				assert.NotEmpty(t, ce.Details, "the error says what to fix")
				assert.Empty(t, r.calls(), "nothing delegated")
				assert.Equal(t, want, r.pool(), "nothing released")
				assert.Len(t, r.orips(), 3, "no reservation deleted")
				assert.Empty(t, r.out.String(), "no result")
				assert.Equal(t, before, tree(t, dir), "nothing created or removed")
			})
		}
	}
}

// Names the checkpoint cannot record are refused as the bad input they are
// (found by FuzzParseArgs and FuzzLoad), not as a checkpoint dir that cannot
// be written (CNI error 5).
func TestAddRefusesWhatNoCheckpointCanRecord(t *testing.T) {
	tests := []struct {
		name, cniArgs, ipamExtra string
		wantCode                 uint
		wantMsg                  string
	}{
		{"a pod name that is not UTF-8", "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-\x93", "", cnitypes.ErrInvalidEnvironmentVariables, "is not a Kubernetes namespace and name"},
		{"a network_name with a slash", podArgs, `,"network_name":"storage/net"`, cnitypes.ErrInvalidNetworkConfig, "which Kubernetes refuses"},
		{"an uppercase network_name", podArgs, `,"network_name":"Storage"`, cnitypes.ErrInvalidNetworkConfig, "which Kubernetes refuses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			err := r.p.Add(hostileArgs("new", "lhnet1", tt.cniArgs, r.config("0.3.1", tt.ipamExtra)))
			assert.Equal(t, tt.wantCode, cniCode(t, err), "%v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Empty(t, r.calls(), "nothing delegated")
			assert.Len(t, r.pool(), 3, "nothing released")
			_, statErr := os.Stat(r.cpDir)
			assert.True(t, os.IsNotExist(statErr), "no checkpoint")
		})
	}
}

// bearer is the kubeconfig's token in the tests below: it must never reach a log.
const bearer = "eyJhbGciOiJSUzI1NiJ9.aGFydmVzdGVyLWlwYW0tYmVhcmVy.c2VjcmV0LXNpZ25hdHVyZQ"

func writeKubeconfig(t *testing.T, path, server string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: `+bearer+`}}]
contexts: [{name: w, context: {cluster: c, user: u}}]
current-context: w
`), 0o600))
}

// tokenScenarios run each verb, succeeding and failing, on a rig whose
// kubeconfig carries the bearer token.
var tokenScenarios = []struct {
	name string
	run  func(t *testing.T, r *rig, cfg func(version string) []byte) error
}{
	{"ADD", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Add(args(t, "new", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"ADD, store down", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.storeDown()
		return r.p.Add(args(t, "new", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"ADD, the delegate fails", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.fillPool(t)
		return r.p.Add(args(t, "new", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"ADD, no pod", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Add(args(t, "new", "lhnet1", "IgnoreUnknown=true", cfg("0.3.1")))
	}},
	{"ADD, a kubeconfig that does not parse", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.breakKubeconfig(t)
		return r.p.Add(args(t, "new", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"DEL", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Del(args(t, "old1", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"DEL, store down", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.storeDown()
		return r.p.Del(args(t, "old1", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"DEL, the NAD is gone", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.record(t, "old1")
		return r.p.Del(args(t, "old1", "lhnet1", podArgs, r.goneConfig()))
	}},
	{"DEL, a truncated checkpoint and a kubeconfig that does not parse", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		require.NoError(t, os.MkdirAll(r.cpDir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(r.cpDir, "old1:lhnet1.json"), []byte(`{"version":1,"containerID":"old1","ifName":"lhnet1","kubeconfig":"/etc/cni/net.d/whereab`), 0o600))
		r.breakKubeconfig(t)
		return r.p.Del(args(t, "old1", "lhnet1", podArgs, cfg("0.3.1")))
	}},
	{"CHECK", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(cfg("1.0.0"), "192.168.50.2")))
	}},
	{"CHECK, another address", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(cfg("1.0.0"), "192.168.50.9")))
	}},
	{"CHECK, store down", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.storeDown()
		return r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(cfg("1.0.0"), "192.168.50.2")))
	}},
	{"STATUS", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		return r.p.Status(args(t, "", "", "", cfg("1.1.0")))
	}},
	{"STATUS, store down", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.storeDown()
		return r.p.Status(args(t, "", "", "", cfg("1.1.0")))
	}},
	{"STATUS, a kubeconfig that does not parse", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.breakKubeconfig(t)
		return r.p.Status(args(t, "", "", "", cfg("1.1.0")))
	}},
	{"GC", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.record(t, "old1")
		return r.p.GC(args(t, "", "", "", cfg("1.1.0")))
	}},
	{"GC, store down", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.record(t, "old1")
		r.storeDown()
		return r.p.GC(args(t, "", "", "", cfg("1.1.0")))
	}},
	{"GC, a kubeconfig that does not parse", func(t *testing.T, r *rig, cfg func(string) []byte) error {
		r.record(t, "old1")
		r.breakKubeconfig(t)
		return r.p.GC(args(t, "", "", "", cfg("1.1.0")))
	}},
}

// TestLogsNeverHoldTheToken runs every verb, succeeding and failing, with the
// log on Plugin.Stderr and in whereabouts' log_file at debug level: neither
// ever holds the kubeconfig's bearer token, nor does the error returned.
func TestLogsNeverHoldTheToken(t *testing.T) {
	for _, where := range []string{"stderr", "log_file"} {
		var logged int
		for _, sc := range tokenScenarios {
			t.Run(where+"/"+sc.name, func(t *testing.T) {
				r := newRig(t, crashLoopedPool()...)
				writeKubeconfig(t, r.kubeconfig(), "https://127.0.0.1:1")
				logFile := filepath.Join(filepath.Dir(r.cpDir), "harvester-ipam.log")
				extra := `,"log_level":"debug"`
				if where == "log_file" {
					extra += fmt.Sprintf(`,"log_file":%q`, logFile)
				}
				err := sc.run(t, r, func(v string) []byte { return r.config(v, extra) })
				if err != nil {
					assert.NotContains(t, err.Error(), bearer, "the error returned")
				}
				logs := r.log.String()
				if b, err := os.ReadFile(logFile); err == nil {
					logs += string(b)
				}
				assert.NotContains(t, logs, bearer)
				logged += len(logs)
			})
		}
		assert.NotZero(t, logged, "the %s scenarios logged nothing: the test would prove nothing", where)
	}
}

// TestLogsNeverHoldTheTokenSentToARealServer does the same with client-go
// talking to an API server that refuses every request: the token is really
// sent, and what comes back is logged and returned. client-go's own logs
// (klog) go to the process's stderr, which is captured too.
func TestLogsNeverHoldTheTokenSentToARealServer(t *testing.T) {
	var sent atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") == "Bearer "+bearer {
			sent.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcdserver: request timed out","code":500}`)
	}))
	defer srv.Close()

	stderr := captureStderr(t)
	for _, sc := range tokenScenarios {
		if strings.Contains(sc.name, "store down") || strings.Contains(sc.name, "delegate fails") {
			continue // the server is down for all of them
		}
		t.Run(sc.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			r.p.NewStore = nil // client-go, over HTTPS, with the token
			r.p.Timeout = 20 * time.Second
			writeKubeconfig(t, r.kubeconfig(), srv.URL)
			logFile := filepath.Join(filepath.Dir(r.cpDir), "harvester-ipam.log")
			err := sc.run(t, r, func(v string) []byte {
				return r.config(v, fmt.Sprintf(`,"log_level":"debug","log_file":%q`, logFile))
			})
			if err != nil {
				assert.NotContains(t, err.Error(), bearer, "the error returned")
			}
			b, _ := os.ReadFile(logFile)
			assert.NotContains(t, r.log.String()+string(b), bearer)
		})
	}
	assert.NotZero(t, sent.Load(), "the token was never sent: the test would prove nothing")
	assert.NotContains(t, stderr(), bearer, "the process's stderr (klog)")
}

// captureStderr points os.Stderr at a file until the test ends; the returned
// func reads what was written so far.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	require.NoError(t, err)
	orig := os.Stderr
	os.Stderr = f
	t.Cleanup(func() { os.Stderr = orig; f.Close() })
	return func() string {
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		return string(b)
	}
}
