package conf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSalvageConfig(t *testing.T) {
	dir := t.TempDir()
	flat := filepath.Join(dir, "whereabouts.conf")
	require.NoError(t, os.WriteFile(flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/etc/kc"}}`), 0o600))
	for _, tt := range []struct {
		name, stdin string
		want        Salvage
	}{
		{"an option of a newer release", `{"name":"sn","ipam":{"type":"harvester-ipam","configuration_path":"` + flat + `","harvester_ipam":{"checkpoint_dir":"/var/lib/x/","future":1}}}`,
			Salvage{Network: "sn", CheckpointDir: "/var/lib/x", Kubeconfig: "/etc/kc"}},
		{"options of the wrong type", `{"name":"sn","ipam":{"type":"harvester-ipam","configuration_path":"` + flat + `","harvester_ipam":{"checkpoint_dir":7}}}`,
			Salvage{Network: "sn", CheckpointDir: DefaultCheckpointDir, Kubeconfig: "/etc/kc"}},
		{"a relative checkpoint dir", `{"ipam":{"harvester_ipam":{"checkpoint_dir":"x"},"kubernetes":{"kubeconfig":"/k"}}}`,
			Salvage{CheckpointDir: DefaultCheckpointDir, Kubeconfig: "/k"}},
		{"the kubeconfig in the ipam object wins", `{"ipam":{"configuration_path":"` + flat + `","kubernetes":{"kubeconfig":"/mine"},"range":5}}`,
			Salvage{CheckpointDir: DefaultCheckpointDir, Kubeconfig: "/mine"}},
		{"an ipam that is not an object", `{"name":"sn","ipam":"harvester-ipam"}`,
			Salvage{Network: "sn", CheckpointDir: DefaultCheckpointDir}},
		{"a flat file that is not a file", `{"ipam":{"configuration_path":"` + dir + `"}}`,
			Salvage{CheckpointDir: DefaultCheckpointDir}},
		{"not JSON", `{`, Salvage{CheckpointDir: DefaultCheckpointDir}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := SalvageConfig([]byte(tt.stdin))
			if tt.want.Kubeconfig == "" && got.Kubeconfig != "" {
				// The machine's own whereabouts flat file may name one.
				tt.want.Kubeconfig = got.Kubeconfig
			}
			assert.Equal(t, tt.want, got)
		})
	}
}
