package plugin

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The log goes to whereabouts' log_file when the config names one, at its
// log_level; to stderr when it names none, or one that cannot be opened.
func TestTheLogGoesWhereTheConfigSays(t *testing.T) {
	for _, tt := range []struct {
		name       string
		ipam       func(dir string) string
		wantFile   bool   // the log is in the file
		wantStderr string // and this is on stderr
		fresh      bool   // the file is not there before: it is made
	}{
		{"no log_file: stderr", func(string) string { return "" }, false, "released 192.168.50.3 from pool", false},
		{"a log_file", func(dir string) string { return `,"log_file":"` + filepath.Join(dir, "wb.log") + `"` }, true, "", false},
		{"a log_file not there yet: made", func(dir string) string { return `,"log_file":"` + filepath.Join(dir, "wb.log") + `"` }, true, "", true},
		{"a log_file that cannot be opened: stderr, saying so", func(dir string) string { return `,"log_file":"` + dir + `"` }, false,
			"harvester-ipam: cannot open log_file ", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			dir := t.TempDir()
			// whereabouts shares the file: what it wrote before stays, and
			// harvester-ipam's lines follow.
			before := "2026-11-25T10:00:00Z [debug] whereabouts' own line\n"
			if tt.fresh {
				before = ""
			}
			if tt.wantFile && !tt.fresh {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "wb.log"), []byte(before), 0o600))
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", tt.ipam(dir)))))
			b, _ := os.ReadFile(filepath.Join(dir, "wb.log"))
			if tt.wantFile {
				assert.True(t, strings.HasPrefix(string(b), before), "whereabouts' lines kept: %q", b)
				assert.Contains(t, string(b), "[verbose] harvester-ipam ADD new: released 192.168.50.3 from pool")
				assert.Empty(t, r.log.String(), "nothing on stderr")
				return
			}
			assert.Empty(t, b)
			assert.Contains(t, r.log.String(), tt.wantStderr)
			if tt.wantStderr != "released 192.168.50.3 from pool" {
				assert.Contains(t, r.log.String(), "released 192.168.50.3 from pool", "the log itself, on stderr")
			}
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

// log_level is read as whereabouts reads it, whatever its case: debug adds
// the phases' timings, error keeps only errors, anything else is verbose.
func TestTheLogLevelIsWhereaboutsOwn(t *testing.T) {
	for _, tt := range []struct {
		level          string
		debug, verbose bool
	}{
		{"debug", true, true},
		{"DEBUG", true, true},
		{"Error", false, false},
		{"panic", false, false},
		{"verbose", false, true},
		{"", false, true},
	} {
		t.Run(tt.level, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", `,"log_level":"`+tt.level+`"`))))
			assert.Equal(t, tt.debug, strings.Contains(r.log.String(), "[debug] harvester-ipam ADD new: took "), "%s", r.log.String())
			assert.Equal(t, tt.verbose, strings.Contains(r.log.String(), "[verbose] harvester-ipam ADD new: released 192.168.50.3"), "%s", r.log.String())
		})
	}
}

// The node's own settings (the chart's plugin.logLevel and plugin.logFile,
// written by its installer) win over whereabouts' log_level and log_file:
// the lasting place to raise the level where the NAD cannot be edited and
// whereabouts rewrites its flat file. A file that does not parse is not
// used, and the log says so.
func TestTheNodesSettingsWinOverWhereabouts(t *testing.T) {
	for _, tt := range []struct {
		name, node, nadIPAM string
		debug, inFile       bool
		says                string
	}{
		{"no node file: whereabouts' level", "", `,"log_level":"error"`, false, false, ""},
		{"the node's debug over whereabouts' error", `{"log_level":"debug"}`, `,"log_level":"error"`, true, false, ""},
		{"the node's error over whereabouts' debug", `{"log_level":"error"}`, `,"log_level":"debug"`, false, false, ""},
		{"the node's log_file", `{"log_level":"debug","log_file":"FILE"}`, "", true, true, ""},
		{"a node file that does not parse: whereabouts' level, and said", `{"log_level":`, `,"log_level":"debug"`, true, false, "node settings"},
		{"an unknown level: whereabouts' level, and said", `{"log_level":"loud"}`, "", false, false, `log_level "loud": want one of debug, verbose, error`},
		{"an unknown key: not used, and said", `{"loglevel":"debug"}`, "", false, false, `unknown field "loglevel"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			logFile := filepath.Join(t.TempDir(), "harvester-ipam.log")
			if tt.node != "" {
				require.NoError(t, os.WriteFile(r.p.NodeConfig, []byte(strings.ReplaceAll(tt.node, "FILE", logFile)), 0o644))
			}
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", tt.nadIPAM))))
			logged := r.log.String()
			if tt.inFile {
				b, err := os.ReadFile(logFile)
				require.NoError(t, err)
				logged = string(b)
				assert.Empty(t, r.log.String(), "nothing on stderr")
			}
			assert.Equal(t, tt.debug, strings.Contains(logged, "[debug] harvester-ipam ADD new: took "), "%s", logged)
			if tt.says != "" {
				assert.Contains(t, logged, tt.says)
				assert.Contains(t, logged, "logging by whereabouts' settings")
			}
		})
	}
}
