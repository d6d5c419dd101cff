package conf

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Salvage is what DEL can still read of a network config that does not load
// (an option only a newer release knows, after a downgrade; a field of the
// wrong type): where this node's checkpoints are, and the kubeconfig of the
// IPPool store. ADD refuses such a config; DEL must not hang the pod on it.
type Salvage struct {
	// Network is the CNI network's name, "" when unreadable.
	Network string
	// CheckpointDir is ipam.harvester_ipam.checkpoint_dir when it is an
	// absolute path, else the default.
	CheckpointDir string
	// Kubeconfig is ipam.kubernetes.kubeconfig, or the one the flat file
	// (ipam.configuration_path, else whereabouts' default) names; "" when none.
	Kubeconfig string
}

// SalvageConfig reads what it can of stdin, field by field; it never fails.
func SalvageConfig(stdin []byte) Salvage {
	s := Salvage{CheckpointDir: DefaultCheckpointDir}
	var top struct {
		Name json.RawMessage `json:"name"`
		IPAM json.RawMessage `json:"ipam"`
	}
	_ = json.Unmarshal(stdin, &top)
	_ = json.Unmarshal(top.Name, &s.Network)
	var ipam struct {
		Options           json.RawMessage `json:"harvester_ipam"`
		ConfigurationPath json.RawMessage `json:"configuration_path"`
		Kubernetes        json.RawMessage `json:"kubernetes"`
	}
	_ = json.Unmarshal(top.IPAM, &ipam)
	var opts struct {
		CheckpointDir json.RawMessage `json:"checkpoint_dir"`
	}
	_ = json.Unmarshal(ipam.Options, &opts)
	var dir string
	if json.Unmarshal(opts.CheckpointDir, &dir) == nil && filepath.IsAbs(dir) {
		s.CheckpointDir = filepath.Clean(dir)
	}
	if s.Kubeconfig = kubeconfigOf(ipam.Kubernetes); s.Kubeconfig != "" {
		return s
	}
	flat := FlatFile
	var path string
	if json.Unmarshal(ipam.ConfigurationPath, &path) == nil && path != "" {
		flat = path
	}
	if checkFile("flat file", flat) != nil {
		return s
	}
	b, err := os.ReadFile(flat)
	if err != nil {
		return s
	}
	var file struct {
		Kubernetes json.RawMessage `json:"kubernetes"`
	}
	if json.Unmarshal(b, &file) == nil {
		s.Kubeconfig = kubeconfigOf(file.Kubernetes)
	}
	return s
}

// kubeconfigOf reads {"kubeconfig": "..."}.
func kubeconfigOf(raw json.RawMessage) string {
	var k struct {
		Kubeconfig json.RawMessage `json:"kubeconfig"`
	}
	_ = json.Unmarshal(raw, &k)
	var path string
	_ = json.Unmarshal(k.Kubeconfig, &path)
	return path
}
