package conf

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kubeconfigBody is a kubeconfig with one context, "whereabouts", whose
// namespace is namespace, and current-context current.
func kubeconfigBody(current, namespace string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: s3cret-token}
contexts:
- name: whereabouts
  context: {cluster: c, user: u, namespace: "` + namespace + `"}
current-context: ` + current + "\n"
}

// whereaboutsBody is a kubeconfig as whereabouts' lib.sh (v0.9.4,
// generateKubeConfig) writes it, CA and token included.
func whereaboutsBody(token string) string {
	return `# Kubeconfig file for the Whereabouts CNI plugin.
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://10.53.0.1:443
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkekNDQVIyZ0F3SUJBZ0lCQURBS0JnZ3Foa2pPUFFRREFqQWpNU0V3SHdZRFZRUUREQmh5YTJVeUxYTmwKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
users:
- name: whereabouts
  user:
    token: "` + token + `"
contexts:
- name: whereabouts-context
  context:
    cluster: local
    user: whereabouts
    namespace: harvester-system
current-context: whereabouts-context
`
}

func writeKubeconfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "whereabouts.kubeconfig")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// kubeconfig writes kubeconfigBody(current, namespace) and returns its path.
func kubeconfig(t *testing.T, current, namespace string) string {
	t.Helper()
	return writeKubeconfig(t, kubeconfigBody(current, namespace))
}

// cut is body up to the end of its first occurrence of mark.
func cut(t *testing.T, body, mark string) string {
	t.Helper()
	i := strings.Index(body, mark)
	require.GreaterOrEqual(t, i, 0, "%q not in the body", mark)
	return body[:i+len(mark)]
}

// pauses records the pauses loadKubeconfig asks for, instead of sleeping.
type pauses []time.Duration

func (p *pauses) sleep(d time.Duration) { *p = append(*p, d) }

func (p pauses) total() (sum time.Duration) {
	for _, d := range p {
		sum += d
	}
	return sum
}

const whereaboutsToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3aGVyZWFib3V0cyJ9.s3cret-signature"

func TestLoadKubeconfig(t *testing.T) {
	wb := whereaboutsBody(whereaboutsToken)
	tests := []struct {
		name     string
		path     string
		wantNS   string
		wantHost string
		wantCode uint
		wantMsg  string
		// wantRetried: read again until the patience ran out; otherwise the
		// answer came at the first read, without a pause.
		wantRetried bool
	}{
		{name: "namespace of the context", path: kubeconfig(t, "whereabouts", "harvester-system"), wantNS: "harvester-system", wantHost: "https://127.0.0.1:6443"},
		{name: "kube-system by default", path: kubeconfig(t, "whereabouts", ""), wantNS: "kube-system", wantHost: "https://127.0.0.1:6443"},
		{name: "as whereabouts writes it", path: writeKubeconfig(t, wb), wantNS: "harvester-system", wantHost: "https://10.53.0.1:443"},
		{name: "whole but its last newline", path: writeKubeconfig(t, strings.TrimSuffix(wb, "\n")), wantNS: "harvester-system", wantHost: "https://10.53.0.1:443"},

		// Whole but wrong: fails at the first read.
		{name: "current context names a missing context", path: kubeconfig(t, "elsewhere", ""),
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `current context "elsewhere" not found`},
		{name: "context names a missing cluster", path: writeKubeconfig(t, strings.Replace(wb, "cluster: local", "cluster: remote", 1)),
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `context "whereabouts-context" names cluster "remote", which is not in the file`},
		{name: "context names a missing user", path: writeKubeconfig(t, strings.Replace(wb, "user: whereabouts", "user: nobody", 1)),
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `context "whereabouts-context" names user "nobody", which is not in the file`},
		{name: "cluster without a server", path: writeKubeconfig(t, strings.Replace(wb, "server: https://10.53.0.1:443", "server: ''", 1)),
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "not usable"},
		{name: "no file", path: "/nonexistent/kubeconfig",
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "cannot load kubeconfig /nonexistent/kubeconfig"},
		{name: "no path", path: "",
			wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "no kubeconfig"},

		// Cut short, as while being written in place: read again, then "try again later".
		{name: "empty", path: writeKubeconfig(t, ""),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "is empty", wantRetried: true},
		{name: "blank lines only (truncated, then a newline)", path: writeKubeconfig(t, "\n \n"),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "is empty", wantRetried: true},
		{name: "its first byte", path: writeKubeconfig(t, wb[:1]),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "names no current-context", wantRetried: true},
		{name: "only its first line", path: writeKubeconfig(t, cut(t, wb, "plugin.\n")),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "names no current-context", wantRetried: true},
		{name: "cut in the CA data", path: writeKubeconfig(t, cut(t, wb, "certificate-authority-data: LS0tLS1CRUd")),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "does not parse", wantRetried: true},
		{name: "cut in the token", path: writeKubeconfig(t, cut(t, wb, `token: "eyJhbGci`)),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "does not parse", wantRetried: true},
		{name: "cut after the token's line", path: writeKubeconfig(t, cut(t, wb, whereaboutsToken+"\"\n")),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: "names no current-context", wantRetried: true},
		{name: "cut in current-context", path: writeKubeconfig(t, cut(t, wb, "current-context: whereabouts-con")),
			wantCode: cnitypes.ErrTryAgainLater, wantMsg: `ends mid-line: current context "whereabouts-con" not found`, wantRetried: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var slept pauses
			k, err := LoadKubeconfig(tt.path, slept.sleep)
			if tt.wantRetried {
				assert.Len(t, slept, 7)
				assert.Equal(t, kubeconfigPatience, slept.total())
			} else if tt.name == "whole but its last newline" {
				assert.Len(t, slept, 1, "read once more, to see it unchanged")
			} else {
				assert.Empty(t, slept, "a whole file is judged at the first read")
			}
			if tt.wantCode != 0 {
				require.Error(t, err)
				ce := err.(*cnitypes.Error)
				assert.Equal(t, tt.wantCode, ce.Code)
				assert.Contains(t, ce.Msg, tt.wantMsg)
				assert.Contains(t, ce.Msg, tt.path)
				assert.NotContains(t, ce.Msg+ce.Details, "s3cret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantNS, k.Namespace)
			assert.Equal(t, tt.wantHost, k.Rest.Host)
		})
	}
}

// Every prefix of whereabouts' kubeconfig, the file cut short anywhere, is
// read again; only the whole file is taken at the first read.
func TestParseKubeconfigEveryPrefix(t *testing.T) {
	wb := whereaboutsBody(whereaboutsToken)
	for i := 0; i < len(wb); i++ {
		k, err := parseKubeconfig("k", []byte(wb[:i]))
		var partial *partialError
		require.ErrorAs(t, err, &partial, "prefix of %d bytes: %q", i, wb[:i])
		if k != nil {
			assert.Equal(t, len(wb)-1, i, "only the file without its last newline is usable")
		}
	}
	k, err := parseKubeconfig("k", []byte(wb))
	require.NoError(t, err)
	assert.Equal(t, whereaboutsToken, k.Rest.BearerToken)
}

// The pauses double from 10 ms and stop at a second in all: eight reads,
// bounded whatever the file does.
func TestLoadKubeconfigRetriesBounded(t *testing.T) {
	var slept pauses
	_, err := LoadKubeconfig(writeKubeconfig(t, ""), slept.sleep)
	require.Error(t, err)
	ms := time.Millisecond
	assert.Equal(t, pauses{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 370 * ms}, slept)
	assert.Contains(t, err.Error(), "read 8 times over 1s")
	assert.Contains(t, err.(*cnitypes.Error).Details, "harvester-whereabouts")
}

// A kubeconfig rewritten in place while it is read, as whereabouts' `cat >`
// does: the shell truncates it, cat writes one part, then (here, at the
// reader's pause number resumeAt) the rest. The reader must come back with
// the whole new file.
func TestLoadKubeconfigWhileRewritten(t *testing.T) {
	const newToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJuZXcifQ.new-signature"
	old, new := whereaboutsBody(whereaboutsToken), whereaboutsBody(newToken)
	tests := []struct {
		name     string
		first    string // what cat wrote before its pause
		resumeAt int    // the reader's pause during which cat writes the rest
	}{
		{"truncated, nothing written yet", "", 1},
		{"cut in the CA data", cut(t, new, "certificate-authority-data: LS0t"), 1},
		{"cut in the token", cut(t, new, `token: "eyJhbGci`), 1},
		{"cut after the token's line", cut(t, new, newToken+"\"\n"), 2},
		{"cut in current-context", cut(t, new, "current-context: where"), 3},
		{"all but the last newline", strings.TrimSuffix(new, "\n"), 1},
		{"rest written at the last pause", cut(t, new, "users:\n"), 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeKubeconfig(t, old)
			firstDone, resume, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var once sync.Once
			goOn := func() { once.Do(func() { close(resume) }) }
			// A reader that failed must not leave the writer blocked, nor
			// writing after the test.
			t.Cleanup(func() { goOn(); <-done })
			go func() {
				defer close(done)
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0) // the shell's `>`: the same inode, emptied
				if !assert.NoError(t, err) {
					return
				}
				defer f.Close()
				_, err = f.WriteString(tt.first)
				assert.NoError(t, err)
				close(firstDone)
				<-resume
				_, err = f.WriteString(new[len(tt.first):])
				assert.NoError(t, err)
			}()
			select {
			case <-firstDone:
			case <-done:
				t.FailNow() // the writer failed, and said why
			}

			var slept pauses
			sleep := func(d time.Duration) {
				slept.sleep(d)
				if len(slept) == tt.resumeAt {
					goOn()
					<-done
				}
			}
			k, err := LoadKubeconfig(path, sleep)
			require.NoError(t, err)
			assert.Equal(t, newToken, k.Rest.BearerToken)
			assert.Equal(t, "harvester-system", k.Namespace)
			assert.Len(t, slept, tt.resumeAt, "read again until the file was whole, and no more")
		})
	}
}
