package conf

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

func TestLoadRefusesFilesThatAreNotFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, make([]byte, maxFileSize+1), 0o600))
	for _, tt := range []struct{ path, want string }{
		{fifo, "is not a regular file"},
		{"/dev/zero", "is not a regular file"},
		{dir, "is not a regular file"},
		{big, "at most 1048576 are read"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := Load(nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + tt.path + `"}`))
			done <- err
		}()
		select {
		case err := <-done:
			require.Error(t, err, tt.path)
			assert.Equal(t, cnitypes.ErrInvalidNetworkConfig, err.(*cnitypes.Error).Code)
			assert.Contains(t, err.Error(), tt.want)
		case <-time.After(5 * time.Second):
			t.Fatalf("Load blocked on %s", tt.path)
		}
		done2 := make(chan error, 1)
		go func() { _, err := LoadKubeconfig(tt.path, func(time.Duration) {}); done2 <- err }()
		select {
		case err := <-done2:
			require.Error(t, err, tt.path)
			assert.Contains(t, err.Error(), tt.want)
		case <-time.After(5 * time.Second):
			t.Fatalf("LoadKubeconfig blocked on %s", tt.path)
		}
	}
}
