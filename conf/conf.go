// Package conf parses and validates what a NetworkAttachmentDefinition hands
// harvester-ipam: the network config with its whereabouts-style ipam object,
// the options of our own under one key, and the pod identity in CNI_ARGS.
//
// The whereabouts fields are read by whereabouts' own loader, so that ranges,
// excludes, the flat file and its defaults mean exactly what they mean to the
// delegate that allocates.
package conf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	wbconfig "github.com/k8snetworkplumbingwg/whereabouts/pkg/config"
	wblogging "github.com/k8snetworkplumbingwg/whereabouts/pkg/logging"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/harvester/harvester-ipam/conf/names"
)

const (
	// PluginType is the ipam.type a NAD names to use harvester-ipam.
	PluginType = "harvester-ipam"
	// OptionsKey is the ipam key that holds harvester-ipam's own options.
	OptionsKey = "harvester_ipam"
	// DefaultDelegate is the IPAM plugin that really allocates.
	DefaultDelegate = "whereabouts"
	// DefaultCheckpointDir holds the node-local record of each attachment.
	DefaultCheckpointDir = "/var/lib/cni/harvester-ipam"
	// FlatFile is where whereabouts' installer writes the node's defaults.
	FlatFile = "/etc/cni/net.d/whereabouts.d/whereabouts.conf"
)

// Options are harvester-ipam's own settings, under ipam.harvester_ipam.
type Options struct {
	// Delegate is the binary on CNI_PATH that ADD, DEL and STATUS are handed to.
	Delegate string `json:"delegate,omitempty"`
	// CheckpointDir is where each attachment's pools are recorded on this node.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
}

// Pool is one IPPool this config allocates from: one per range, named as
// whereabouts names it.
type Pool struct {
	Name  string
	Range string
}

// Config is a parsed network config as harvester-ipam sees it.
type Config struct {
	CNIVersion string
	// Network is the CNI network's name (the NAD's config "name").
	Network string
	Options Options
	// IPAM is whereabouts' reading of the ipam object, nil when it is unusable.
	IPAM *wbtypes.IPAMConfig
	// Pools are the IPPools of every range, named as whereabouts names them.
	Pools []Pool
	// Delegated is the network config to hand the delegate: ipam.type rewritten.
	Delegated []byte
	// PrevResult is the raw prevResult, when the runtime sent one.
	PrevResult json.RawMessage
	// ValidAttachments is GC's cni.dev/valid-attachments: what must be kept.
	ValidAttachments []cnitypes.GCAttachment
	// NodeSliceSize is whereabouts v0.9's node_slice_size ("fast IPAM"):
	// allocations in per-node pools, which harvester-ipam does not manage.
	NodeSliceSize string
}

// SpecVersions are the CNI versions harvester-ipam answers: every one
// whereabouts answers (its cmd/whereabouts.go hands skel version.All), since
// at whereabouts' name it is handed every config that names whereabouts, in
// whatever cniVersion the NAD was written (whereabouts' own end-to-end
// suite writes 0.3.0). The plugin's skel and the node agent's admission
// both read it.
func SpecVersions() version.PluginInfo { return version.All }

// RefuseNodeSlices is the check of ADD: with node_slice_size, whereabouts
// allocates from per-node pools that harvester-ipam neither reclaims nor
// releases, so it would be silently wrong.
func (c *Config) RefuseNodeSlices() error {
	if c.NodeSliceSize == "" {
		return nil
	}
	return cnitypes.NewError(cnitypes.ErrUnsupportedField,
		fmt.Sprintf("ipam.node_slice_size %q is not supported by %s", c.NodeSliceSize, PluginType),
		"whereabouts' fast IPAM allocates from per-node pools that harvester-ipam does not manage: remove node_slice_size, or name whereabouts itself as ipam.type")
}

// Kubeconfig is the path of the kubeconfig whereabouts uses, "" when unknown.
func (c *Config) Kubeconfig() string {
	if c.IPAM == nil {
		return ""
	}
	return c.IPAM.Kubernetes.KubeConfigPath
}

// LogFile and LogLevel are whereabouts' log settings, which we share.
func (c *Config) LogFile() string {
	if c.IPAM == nil {
		return ""
	}
	return c.IPAM.LogFile
}

func (c *Config) LogLevel() string {
	if c.IPAM == nil {
		return ""
	}
	return c.IPAM.LogLevel
}

// Load parses a network config. It returns a Config whenever the JSON itself
// parses, so that DEL can go on from the checkpoint when the whereabouts part
// is unusable (the NAD is gone); the error then says why, as a CNI error.
func Load(stdin []byte) (*Config, error) { return Loader{}.Load(stdin) }

// Loader parses network configs as Load does; the zero value is Load.
type Loader struct {
	// Quiet keeps every log_file and log_level, the NAD's and the flat
	// file's, from whereabouts' loader, which at every load opens the log
	// file (never closing it) and sets its process-wide log level: fine in a
	// plugin that exits, a leak and a data race in a daemon that loads
	// configs concurrently. The Config still carries them, merged as
	// whereabouts merges them, for harvester-ipam's own log. The flat file
	// the loader would read is handed to it as a copy without them.
	Quiet bool
}

// Load parses a network config, as the package's Load.
func (l Loader) Load(stdin []byte) (*Config, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "network config is not valid JSON", err.Error())
	}
	cfg := &Config{Options: Options{Delegate: DefaultDelegate, CheckpointDir: DefaultCheckpointDir}}
	if err := unmarshalField(top, "cniVersion", &cfg.CNIVersion); err != nil {
		return nil, err
	}
	if err := unmarshalField(top, "name", &cfg.Network); err != nil {
		return nil, err
	}
	cfg.PrevResult = top["prevResult"]
	if err := unmarshalField(top, "cni.dev/valid-attachments", &cfg.ValidAttachments); err != nil {
		return nil, err
	}

	var ipam map[string]json.RawMessage
	if raw, ok := top["ipam"]; !ok || isNull(raw) {
		return cfg, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "network config has no ipam object", `add "ipam": {"type": "harvester-ipam", "range": ...}`)
	} else if err := json.Unmarshal(raw, &ipam); err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "ipam must be a JSON object", err.Error())
	}

	if raw, ok := ipam[OptionsKey]; ok && !isNull(raw) {
		if err := decodeOptions(raw, &cfg.Options); err != nil {
			return nil, err
		}
	}
	if raw, ok := ipam["node_slice_size"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &cfg.NodeSliceSize); err != nil {
			return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "ipam.node_slice_size must be a string", err.Error())
		}
	}

	// The delegate reads the same config with its own type; everything else
	// passes through. A config that names the delegate already (harvester-ipam
	// stands in for it) goes as it came, byte for byte.
	var typ string
	_ = json.Unmarshal(ipam["type"], &typ)
	if typ == cfg.Options.Delegate {
		cfg.Delegated = stdin
	} else {
		delegated, err := withIPAMType(top, ipam, cfg.Options.Delegate)
		if err != nil {
			return nil, cnitypes.NewError(cnitypes.ErrInternal, "re-encode network config for the delegate", err.Error())
		}
		cfg.Delegated = delegated
	}

	if raw, ok := ipam["configuration_path"]; ok {
		var path string
		if json.Unmarshal(raw, &path) == nil && path != "" {
			if err := checkFile("ipam.configuration_path", path); err != nil {
				return cfg, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, err.Error(), "point configuration_path at the whereabouts flat file")
			}
		}
	}

	// whereabouts' loader opens (creates, mode 0644) the log_file it reads, as
	// a side effect, even for a config it then refuses: a NAD's path is kept
	// from it and applied after, so only a valid config's log is ever opened,
	// by our logger. The flat file's is root's own, and the loader's to open.
	// CNI_ARGS is parsed by ParseArgs; static IPs from it are the delegate's business.
	wb, _, err := l.whereabouts(top, ipam, "")
	if err != nil {
		return cfg, err
	}
	// whereabouts parses excludes only when it allocates; refuse a bad one now.
	for _, r := range wb.IPRanges {
		for _, ex := range r.OmitRanges {
			if !validExclude(ex) {
				return cfg, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
					fmt.Sprintf("exclude %q of range %s is neither a CIDR nor an IP", ex, r.Range),
					`write excludes as CIDRs, for example "192.168.50.1/32"`)
			}
		}
	}
	// whereabouts names a range's IPPool after it; a name the API server
	// refuses (an uppercase network_name, "::/0" -> "---0") can never hold it.
	for _, r := range wb.IPRanges {
		if name := names.Pool(r.Range, wb.NetworkName); len(validation.IsDNS1123Subdomain(name)) > 0 {
			return cfg, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
				fmt.Sprintf("range %s makes the IPPool name %q, which Kubernetes refuses", r.Range, name),
				"whereabouts names the pool [network_name-]range: network_name may hold only lowercase letters, digits, '-' and '.', and the name at most 253 of them")
		}
	}
	cfg.IPAM = wb
	for _, r := range wb.IPRanges {
		cfg.Pools = append(cfg.Pools, Pool{Name: names.Pool(r.Range, wb.NetworkName), Range: r.Range})
	}
	return cfg, nil
}

// Whereabouts is the config as whereabouts' own loader reads it for a
// CNI_ARGS of cniArgs (the pod, static IP and GATEWAY), and its cniVersion:
// what the whereabouts binary allocates by. It reads the flat file as Load
// does, and in a quiet loader touches whereabouts' log no more than Load.
func (l Loader) Whereabouts(stdin []byte, cniArgs string) (*wbtypes.IPAMConfig, string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err != nil {
		return nil, "", cnitypes.NewError(cnitypes.ErrDecodingFailure, "network config is not valid JSON", err.Error())
	}
	var ipam map[string]json.RawMessage
	if raw, ok := top["ipam"]; !ok || isNull(raw) {
		return nil, "", cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "network config has no ipam object", `add "ipam": {"type": "harvester-ipam", "range": ...}`)
	} else if err := json.Unmarshal(raw, &ipam); err != nil {
		return nil, "", cnitypes.NewError(cnitypes.ErrDecodingFailure, "ipam must be a JSON object", err.Error())
	}
	return l.whereabouts(top, ipam, cniArgs)
}

// whereabouts runs whereabouts' loader on the config (top, its ipam object)
// with cniArgs.
func (l Loader) whereabouts(top, ipam map[string]json.RawMessage, cniArgs string) (*wbtypes.IPAMConfig, string, error) {
	// whereabouts' loader opens (creates, mode 0644) the log_file it reads, as
	// a side effect, even for a config it then refuses: a NAD's path is kept
	// from it and applied after, so only a valid config's log is ever opened,
	// by our logger. The flat file's is root's own, and the loader's to open.
	loaderIPAM := ipam
	var nadLogFile string
	if raw, ok := ipam["log_file"]; ok && json.Unmarshal(raw, &nadLogFile) == nil {
		loaderIPAM = without(ipam, "log_file")
	}
	var quiet *quietLog
	if l.Quiet {
		silenceWhereabouts.Do(func() { wblogging.SetLogStderr(false) })
		q, err := quieten(loaderIPAM)
		if err != nil {
			return nil, "", cnitypes.NewError(cnitypes.ErrInternal, "copy the whereabouts flat file without its log settings", err.Error())
		}
		defer q.close()
		quiet, loaderIPAM = q, q.ipam
	}
	// whereabouts' loader insists on its own type name; it reads the fields, not the binary.
	forLoader, err := withIPAMType(top, loaderIPAM, DefaultDelegate)
	if err != nil {
		return nil, "", cnitypes.NewError(cnitypes.ErrInternal, "re-encode network config for whereabouts' loader", err.Error())
	}
	if !l.Quiet {
		// whereabouts' loader logs at debug level to stderr by default; our own
		// logger says what matters, and the delegate logs for itself.
		wblogging.SetLogStderr(false)
	}
	wb, confVersion, err := wbconfig.LoadIPAMConfig(forLoader, cniArgs)
	if err != nil {
		return nil, "", whereaboutsError(err)
	}
	if quiet != nil {
		quiet.restore(wb)
	}
	if nadLogFile != "" {
		wb.LogFile = nadLogFile // the NAD's wins over the flat file's, as in whereabouts' merge
	}
	return wb, confVersion, nil
}

// RequirePools is the check of ADD and CHECK: a config that names no range is useless to them.
func (c *Config) RequirePools() error {
	if len(c.Pools) == 0 {
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "ipam config has no range",
			`set ipam.range (for example "192.168.50.0/24") or ipam.ipRanges`)
	}
	return nil
}

func decodeOptions(raw json.RawMessage, o *Options) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(o); err != nil {
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return cnitypes.NewError(cnitypes.ErrUnsupportedField,
				fmt.Sprintf("ipam.%s: unknown field %s", OptionsKey, field),
				"known fields: delegate, checkpoint_dir")
		}
		return cnitypes.NewError(cnitypes.ErrDecodingFailure, fmt.Sprintf("ipam.%s is not valid", OptionsKey), err.Error())
	}
	if o.Delegate == "" {
		o.Delegate = DefaultDelegate
	}
	if strings.ContainsAny(o.Delegate, "/\x00") || o.Delegate == "." || o.Delegate == ".." {
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
			fmt.Sprintf("ipam.%s.delegate %q is not a plugin name", OptionsKey, o.Delegate),
			"name a binary on CNI_PATH, such as whereabouts")
	}
	if o.Delegate == PluginType {
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
			fmt.Sprintf("ipam.%s.delegate must not be %s itself", OptionsKey, PluginType),
			"name the IPAM plugin that allocates, such as whereabouts")
	}
	if o.CheckpointDir == "" {
		o.CheckpointDir = DefaultCheckpointDir
	}
	if !filepath.IsAbs(o.CheckpointDir) || strings.ContainsRune(o.CheckpointDir, 0) {
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
			fmt.Sprintf("ipam.%s.checkpoint_dir %q is not an absolute path", OptionsKey, o.CheckpointDir),
			"use an absolute directory such as "+DefaultCheckpointDir)
	}
	o.CheckpointDir = filepath.Clean(o.CheckpointDir)
	return nil
}

// withIPAMType re-encodes the config with ipam.type set to typ.
func withIPAMType(top, ipam map[string]json.RawMessage, typ string) ([]byte, error) {
	t, _ := json.Marshal(typ)
	in := make(map[string]json.RawMessage, len(ipam))
	for k, v := range ipam {
		in[k] = v
	}
	in["type"] = t
	rawIPAM, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	out := make(map[string]json.RawMessage, len(top))
	for k, v := range top {
		out[k] = v
	}
	out["ipam"] = rawIPAM
	return json.Marshal(out)
}

// whereaboutsError turns a whereabouts loader error into a CNI error that says what to fix.
func whereaboutsError(err error) error {
	var notFound *wbconfig.ConfigFileNotFoundError
	// whereabouts appends the whole input to parse errors; keep the reason only.
	msg, _, _ := strings.Cut(err.Error(), " / bytes:")
	switch {
	case errors.As(err, &notFound):
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "whereabouts flat file not found",
			fmt.Sprintf("install whereabouts (it writes %s) or set ipam.configuration_path to the file", FlatFile))
	case strings.Contains(msg, "storage engine"):
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "no kubeconfig for the IPPool store",
			"set ipam.kubernetes.kubeconfig, or kubernetes.kubeconfig in the whereabouts flat file")
	case strings.Contains(msg, "JSON Parsing Error"):
		return cnitypes.NewError(cnitypes.ErrDecodingFailure, "ipam config does not parse as whereabouts config", msg)
	default:
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "invalid ipam config", msg)
	}
}

func unmarshalField(top map[string]json.RawMessage, key string, v any) error {
	raw, ok := top[key]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return cnitypes.NewError(cnitypes.ErrDecodingFailure, fmt.Sprintf("network config field %q has the wrong type", key), err.Error())
	}
	return nil
}

// validExclude accepts what whereabouts' allocator accepts: a CIDR or an IP.
func validExclude(s string) bool {
	if _, _, err := net.ParseCIDR(s); err == nil {
		return true
	}
	return net.ParseIP(s) != nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }
