package install

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/conf"
)

// The installer keeps the node's settings file as the chart's values say:
// written whole when they set something, left alone when it already says
// it, removed when they set nothing; a bad value is refused and the file
// kept. What it writes is what the plugin reads.
func TestWriteNodeConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "harvester-ipam.conf")
	debug := conf.NodeConfig{LogLevel: "debug", LogFile: "/var/log/harvester-ipam.log"}

	changed, err := WriteNodeConfig(path, conf.NodeConfig{})
	require.NoError(t, err)
	assert.False(t, changed, "nothing set, no file: nothing to do")
	assert.NoFileExists(t, path)

	changed, err = WriteNodeConfig(path, debug)
	require.NoError(t, err)
	assert.True(t, changed)
	got, err := conf.LoadNodeConfig(path)
	require.NoError(t, err)
	assert.Equal(t, debug, got, "the plugin reads what the installer wrote")
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())

	changed, err = WriteNodeConfig(path, debug)
	require.NoError(t, err)
	assert.False(t, changed, "already so: not written again")

	_, err = WriteNodeConfig(path, conf.NodeConfig{LogLevel: "loud"})
	assert.ErrorContains(t, err, `log_level "loud"`)
	got, _ = conf.LoadNodeConfig(path)
	assert.Equal(t, debug, got, "a bad value keeps the file as it was")

	changed, err = WriteNodeConfig(path, conf.NodeConfig{})
	require.NoError(t, err)
	assert.True(t, changed)
	assert.NoFileExists(t, path, "the values set nothing any more: the file goes")
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*"))
	assert.Empty(t, left, "no temporary file left")
}
