package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A flat file of exactly the size limit is read; one byte more is refused.
func TestAFileOfTheLimitIsRead(t *testing.T) {
	body := `{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"}}`
	for _, tt := range []struct {
		size    int
		wantErr string
	}{
		{maxFileSize, ""},
		{maxFileSize + 1, "is 1048577 bytes; at most 1048576 are read"},
	} {
		p := filepath.Join(t.TempDir(), "whereabouts.conf")
		require.NoError(t, os.WriteFile(p, []byte(body+strings.Repeat(" ", tt.size-len(body))), 0o600))
		c, err := Load(nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + p + `"}`))
		if tt.wantErr == "" {
			require.NoError(t, err, "a file of %d bytes", tt.size)
			assert.Equal(t, "/k", c.Kubeconfig())
			continue
		}
		require.Error(t, err)
		assert.Equal(t, cnitypes.ErrInvalidNetworkConfig, err.(*cnitypes.Error).Code)
		assert.Contains(t, err.Error(), tt.wantErr)
	}
}

// node_slice_size (whereabouts' fast IPAM) is read so that ADD can refuse it
// with a message that says what to do, and DEL can hand it to whereabouts.
func TestNodeSliceSize(t *testing.T) {
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"}}`)
	for _, tt := range []struct {
		name      string
		field     string
		wantLoad  uint // the CNI code of Load's error; 0: none
		wantSlice string
		wantADD   uint // the CNI code of RefuseNodeSlices; 0: none
		wantMsg   string
	}{
		{"absent", ``, 0, "", 0, ""},
		{"null", `,"node_slice_size":null`, 0, "", 0, ""},
		{"set", `,"node_slice_size":"/26"`, 0, "/26", cnitypes.ErrUnsupportedField,
			`ipam.node_slice_size "/26" is not supported by harvester-ipam`},
		{"not a string", `,"node_slice_size":26`, cnitypes.ErrDecodingFailure, "", 0, "ipam.node_slice_size must be a string"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `"` + tt.field + `}`))
			if tt.wantLoad != 0 {
				require.Error(t, err)
				assert.Equal(t, tt.wantLoad, err.(*cnitypes.Error).Code)
				assert.Contains(t, err.Error(), tt.wantMsg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantSlice, c.NodeSliceSize)
			err = c.RefuseNodeSlices()
			if tt.wantADD == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			ce := err.(*cnitypes.Error)
			assert.Equal(t, tt.wantADD, ce.Code)
			assert.Equal(t, tt.wantMsg, ce.Msg)
			assert.Contains(t, ce.Details, "remove node_slice_size")
		})
	}
}
