package conf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// DefaultNodeConfig is where the chart's installer writes the node's own
// settings for harvester-ipam, beside whereabouts' whereabouts.d.
const DefaultNodeConfig = "/etc/cni/net.d/harvester-ipam.d/harvester-ipam.conf"

// NodeConfig is the node's own settings for harvester-ipam, which the
// chart's installer writes from its plugin.* values: a lasting place for
// them where neither the NAD (Harvester's webhook refuses its edit) nor
// whereabouts' flat file (its pod rewrites it at every start) is.
type NodeConfig struct {
	// LogLevel overrides whereabouts' log_level for harvester-ipam's own
	// log: debug, verbose or error.
	LogLevel string `json:"log_level,omitempty"`
	// LogFile overrides whereabouts' log_file for harvester-ipam's own log.
	LogFile string `json:"log_file,omitempty"`
}

// LogLevels are the levels harvester-ipam logs at (whereabouts' names).
var LogLevels = []string{"debug", "verbose", "error"}

// Validate says what is wrong with the settings, if anything.
func (n NodeConfig) Validate() error {
	if n.LogLevel != "" && !contains(LogLevels, n.LogLevel) {
		return fmt.Errorf("log_level %q: want one of %s", n.LogLevel, strings.Join(LogLevels, ", "))
	}
	if n.LogFile != "" && !strings.HasPrefix(n.LogFile, "/") {
		return fmt.Errorf("log_file %q: want an absolute path", n.LogFile)
	}
	return nil
}

// Marshal is the file's content: one JSON object and a newline.
func (n NodeConfig) Marshal() []byte {
	b, _ := json.Marshal(n)
	return append(b, '\n')
}

// LoadNodeConfig reads the node's settings; a missing file is none. A file
// that does not parse or holds a bad value is an error, and none of it is
// used: the plugin then logs as whereabouts' settings say, and says so.
func LoadNodeConfig(path string) (NodeConfig, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NodeConfig{}, nil
	}
	if err != nil {
		return NodeConfig{}, fmt.Errorf("node settings %s: %w", path, err)
	}
	var n NodeConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&n); err != nil {
		return NodeConfig{}, fmt.Errorf("node settings %s: %w", path, err)
	}
	if err := n.Validate(); err != nil {
		return NodeConfig{}, fmt.Errorf("node settings %s: %w", path, err)
	}
	return n, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
