package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/harvester/harvester-ipam/conf"
)

// WriteNodeConfig makes the node's settings file (the chart's plugin.*
// values, which the plugin reads at each call) say n: written whole
// (a temporary file, fsynced, renamed over it) when it differs, removed when
// n sets nothing. It says whether it changed anything.
func WriteNodeConfig(path string, n conf.NodeConfig) (bool, error) {
	if err := n.Validate(); err != nil {
		return false, err
	}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	exists := err == nil
	if n == (conf.NodeConfig{}) {
		if !exists {
			return false, nil
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
		return true, syncDir(filepath.Dir(path))
	}
	want := n.Marshal()
	if exists && bytes.Equal(old, want) {
		return false, nil
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(want); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, err
	}
	return true, syncDir(dir)
}
