package conf

import (
	"os"
	"path/filepath"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func kubeconfig(t *testing.T, current, namespace string) string {
	t.Helper()
	body := `apiVersion: v1
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
	p := filepath.Join(t.TempDir(), "whereabouts.kubeconfig")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestLoadKubeconfig(t *testing.T) {
	tests := []struct {
		name     string
		path     string
		wantNS   string
		wantCode uint
		wantMsg  string
	}{
		{"namespace of the context", kubeconfig(t, "whereabouts", "harvester-system"), "harvester-system", 0, ""},
		{"kube-system by default", kubeconfig(t, "whereabouts", ""), "kube-system", 0, ""},
		{"unknown current context", kubeconfig(t, "elsewhere", ""), "", cnitypes.ErrInvalidNetworkConfig, `current context "elsewhere" not found`},
		{"no file", "/nonexistent/kubeconfig", "", cnitypes.ErrInvalidNetworkConfig, "cannot load kubeconfig /nonexistent/kubeconfig"},
		{"no path", "", "", cnitypes.ErrInvalidNetworkConfig, "no kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := LoadKubeconfig(tt.path)
			if tt.wantCode != 0 {
				require.Error(t, err)
				ce := err.(*cnitypes.Error)
				assert.Equal(t, tt.wantCode, ce.Code)
				assert.Contains(t, ce.Msg, tt.wantMsg)
				assert.NotContains(t, ce.Msg+ce.Details, "s3cret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantNS, k.Namespace)
			assert.Equal(t, "https://127.0.0.1:6443", k.Rest.Host)
		})
	}
}
