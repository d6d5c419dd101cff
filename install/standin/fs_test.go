package standin

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A temporary file is executable by everyone whatever the installer's
// umask: it becomes the plugin at the name, which the runtime runs.
func TestCreateTempIsExecutableWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	tmp, err := OS{}.CreateTemp(dir, tempPrefix, strings.NewReader("#!/bin/sh\n"))
	require.NoError(t, err)
	st, err := os.Stat(tmp)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())
}
