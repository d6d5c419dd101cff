package testcni

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// How a network reaches harvester-ipam, its Network.IPAM.
const (
	// StandIn (the default): the config names whereabouts, as Harvester
	// writes it, and harvester-ipam stands in at whereabouts' name, the real
	// binary beside it (as the chart's DaemonSet leaves a node).
	StandIn = "stand-in"
	// Named: the config names harvester-ipam.
	Named = "harvester-ipam"
	// Alone: whereabouts alone, no harvester-ipam.
	Alone = "whereabouts"
)

// Network is a CNI network like Harvester's storage network: a bridge whose
// IPAM is harvester-ipam, standing in or named, or whereabouts alone.
type Network struct {
	Name        string   // the CNI network's name, as cnitool names it
	Range       string   // the whereabouts range
	Exclude     []string // whereabouts' exclude
	NetworkName string   // whereabouts' network_name
	// IPAM is StandIn (the default), Named or Alone.
	IPAM string
	// Whereabouts is the version that allocates: V093 (the default, as
	// Harvester's current chart), V080 or V070.
	Whereabouts string
	// Tenant holds the network's pools; nil is the rig's default tenant.
	Tenant *Tenant
	// CNIVersion defaults to 0.3.1, as Harvester's NAD.
	CNIVersion string
	// Crashpoints runs the crashpoints build of harvester-ipam.
	Crashpoints bool
	// Bridge is the bridge plugin's bridge, "mgmt-br" (Harvester's) unless
	// set. A bridge takes the lowest MAC of its ports, so the bridge
	// plugin's CHECK of a sandbox fails whenever a parallel test's sandbox
	// joins the same bridge: a CHECK test needs a bridge of its own.
	Bridge string
	// LogFile and LogLevel are whereabouts' log_file and log_level, which
	// harvester-ipam shares.
	LogFile, LogLevel string
	// SwallowDel puts on the network's CNI_PATH a whereabouts whose DEL
	// returns success without touching the pool (writeSwallowingWhereabouts):
	// whereabouts' own DEL on a storage failure, had on demand.
	SwallowDel bool
	// BinDir, when set, is the network's CNI bin dir in place of the one the
	// rig made for its IPAM and version (a test's own, such as
	// Rig.AgentKillerDir's).
	BinDir string
	// Agent, when set, is the node agent harvester-ipam hands each verb to,
	// as a node's plugin finds the agent of its node; without one the
	// plugin never reaches an agent.
	Agent *Agent

	rig *Rig
}

// withDefaults fills in harvester-ipam on whereabouts v0.9.3, CNI 0.3.1 and
// the default tenant.
func (n Network) withDefaults(r *Rig) Network {
	if n.IPAM == "" {
		n.IPAM = StandIn
	}
	if n.Whereabouts == "" {
		n.Whereabouts = V093
	}
	if n.Tenant == nil {
		n.Tenant = r.Default
	}
	if n.CNIVersion == "" {
		n.CNIVersion = "0.3.1"
	}
	n.rig = r
	return n
}

// AddNetwork writes a network's conflist where cnitool finds it.
func (r *Rig) AddNetwork(n Network) (*Network, error) {
	n = n.withDefaults(r)
	if n.Crashpoints && r.crashBin == "" {
		return nil, fmt.Errorf("network %s wants the crashpoints build: start the rig with Options.Crashpoints", n.Name)
	}
	return &n, n.writeConf(n.ipam(n.Tenant.FlatFile))
}

// ipam is the network's ipam object, naming flatFile as whereabouts' flat file.
func (n *Network) ipam(flatFile string) map[string]any {
	ipam := map[string]any{"type": n.Type(), "range": n.Range, "configuration_path": flatFile}
	if len(n.Exclude) > 0 {
		ipam["exclude"] = n.Exclude
	}
	if n.NetworkName != "" {
		ipam["network_name"] = n.NetworkName
	}
	if n.LogFile != "" {
		ipam["log_file"] = n.LogFile
	}
	if n.LogLevel != "" {
		ipam["log_level"] = n.LogLevel
	}
	return ipam
}

// ForgetIPAM rewrites the conflist as it is once the NAD is gone: the ipam
// object keeps only its type.
func (n *Network) ForgetIPAM() error {
	return n.writeConf(map[string]any{"type": n.Type()})
}

// Type is the network config's ipam.type: whereabouts, unless the network
// names harvester-ipam.
func (n *Network) Type() string {
	if n.IPAM == Named {
		return Named
	}
	return Alone
}

// binDir is the CNI bin dir of the network's plugins.
func (n *Network) binDir() string {
	if n.BinDir != "" {
		return n.BinDir
	}
	key := n.Whereabouts
	if n.IPAM == StandIn {
		key += standInKey
		if n.Crashpoints {
			key += crashKey
		}
	}
	if n.SwallowDel {
		key += swallowDel
	}
	return n.rig.cniPaths[key]
}

// PluginConf is the network's bridge plugin config as a runtime hands it to
// the plugin (a conflist's entry with the list's name and cniVersion).
func (n *Network) PluginConf() map[string]any {
	b, _ := os.ReadFile(filepath.Join(n.rig.NetConfDir, n.Name+".conflist"))
	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	_ = json.Unmarshal(b, &list)
	if len(list.Plugins) == 0 {
		return nil
	}
	p := list.Plugins[0]
	p["cniVersion"], p["name"] = n.CNIVersion, n.Name
	return p
}

func (n *Network) bridge() string {
	if n.Bridge == "" {
		return "mgmt-br"
	}
	return n.Bridge
}

func (n *Network) writeConf(ipam map[string]any) error {
	// Harvester's NAD also sets "vlan": 50; these machines' kernels have no
	// bridge VLAN filtering, and the VLAN is the bridge's business, not IPAM's.
	conf := map[string]any{
		"cniVersion": n.CNIVersion, "name": n.Name,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": n.bridge(), "promiscMode": true, "ipam": ipam,
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(n.rig.NetConfDir, n.Name+".conflist"), b)
}

// cniPath is where cnitool finds the plugins of this network.
func (n *Network) cniPath() string {
	p := n.binDir()
	if n.Crashpoints && n.IPAM != StandIn {
		p = n.rig.crashBin + ":" + p
	}
	return p
}

// Pod is a pod's identity, as Multus passes it in CNI_ARGS.
type Pod struct{ Namespace, Name string }

func (p Pod) Ref() string { return p.Namespace + "/" + p.Name }

// Sandbox is one pod sandbox: a network namespace and its attachment.
type Sandbox struct {
	Net         *Network
	Pod         Pod
	IfName      string
	NetNS       string // the namespace's name
	Path        string // its path, CNI_NETNS
	ContainerID string // as cnitool derives it from Path
	Result      *current.Result
	// Env is added to the environment of every cnitool run (tests' knobs).
	Env []string
}

// NewSandbox creates a network namespace for a new sandbox of pod.
func (r *Rig) NewSandbox(n *Network, pod Pod, ifName string) (*Sandbox, error) {
	r.mu.Lock()
	r.counter++
	name := fmt.Sprintf("sb-%d-%s", r.counter, shortHash(pod.Ref()))
	r.mu.Unlock()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	r.mu.Lock()
	r.netns[name] = true
	r.mu.Unlock()
	path := "/var/run/netns/" + name
	sum := sha512.Sum512([]byte(path))
	return &Sandbox{Net: n, Pod: pod, IfName: ifName, NetNS: name, Path: path, ContainerID: fmt.Sprintf("cnitool-%x", sum[:10])}, nil
}

// CNIArgs are what Multus passes for this sandbox.
func (s *Sandbox) CNIArgs() string {
	return fmt.Sprintf("IgnoreUnknown=true;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s",
		s.Pod.Namespace, s.Pod.Name, s.ContainerID)
}

// Add runs cnitool add; the result is kept in s.Result.
func (s *Sandbox) Add(ctx context.Context) error {
	out, err := s.cnitool(ctx, "add")
	if err != nil {
		return err
	}
	var res current.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("cnitool add printed no result: %v: %s", err, out)
	}
	s.Result = &res
	return nil
}

// Del runs cnitool del.
func (s *Sandbox) Del(ctx context.Context) error { _, err := s.cnitool(ctx, "del"); return err }

// Check runs cnitool check.
func (s *Sandbox) Check(ctx context.Context) error { _, err := s.cnitool(ctx, "check"); return err }

// Status runs cnitool status on the sandbox's network (CNI 1.1.0).
func (s *Sandbox) Status(ctx context.Context) error { _, err := s.cnitool(ctx, "status"); return err }

// Kill deletes the sandbox's namespace without DEL: a crash, a lost DEL.
func (s *Sandbox) Kill() error {
	if out, err := exec.Command("ip", "netns", "del", s.NetNS).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", s.NetNS, err, out)
	}
	s.Net.rig.mu.Lock()
	delete(s.Net.rig.netns, s.NetNS)
	s.Net.rig.mu.Unlock()
	return nil
}

// IP is the address ADD returned.
func (s *Sandbox) IP() string {
	if s.Result == nil || len(s.Result.IPs) == 0 {
		return ""
	}
	return s.Result.IPs[0].Address.IP.String()
}

// CNIError is a failed cnitool run: its exit status and what it printed.
type CNIError struct {
	Verb   string
	Exit   int
	Stdout string
	Stderr string
}

func (e *CNIError) Error() string {
	return fmt.Sprintf("cnitool %s exited %d: %s%s", e.Verb, e.Exit, strings.TrimSpace(e.Stdout), lastLines(e.Stderr, 8))
}

func (s *Sandbox) cnitool(ctx context.Context, verb string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, s.Net.rig.Tools["cnitool"], verb, s.Net.Name, s.Path)
	cmd.Env = append(os.Environ(),
		"NETCONFPATH="+s.Net.rig.NetConfDir, "CNI_PATH="+s.Net.cniPath(),
		"CNI_IFNAME="+s.IfName, "CNI_ARGS="+s.CNIArgs())
	cmd.Env = append(cmd.Env, s.Net.agentEnv()...)
	cmd.Env = append(cmd.Env, s.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		exit := -1
		if ee, ok := err.(*exec.ExitError); ok {
			exit = ee.ExitCode()
		}
		return stdout.Bytes(), &CNIError{Verb: verb, Exit: exit, Stdout: stdout.String(), Stderr: stderr.String()}
	}
	return stdout.Bytes(), nil
}

func shortHash(s string) string {
	sum := sha512.Sum512([]byte(s))
	return fmt.Sprintf("%x", sum[:3])
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	return "\n  stderr: " + strings.Join(lines, "\n  stderr: ")
}

// Attach is another attachment of the same sandbox (same network namespace,
// same container ID) on network n with interface ifName: the same network
// attached twice, or two NADs that share a range.
func (s *Sandbox) Attach(n *Network, ifName string) *Sandbox {
	return &Sandbox{Net: n, Pod: s.Pod, IfName: ifName, NetNS: s.NetNS, Path: s.Path, ContainerID: s.ContainerID}
}

// CNIEnv is the CNI environment of one verb of this attachment, as a runtime
// (or a main plugin delegating to its IPAM) sets it: for running a plugin
// binary directly with Rig.Plugin.
func (s *Sandbox) CNIEnv(verb string) []string {
	return []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + s.ContainerID, "CNI_NETNS=" + s.Path,
		"CNI_IFNAME=" + s.IfName, "CNI_ARGS=" + s.CNIArgs()}
}

// IPAMPath is a CNI_PATH whose `whereabouts` is whereabouts version itself
// (standIn false), or harvester-ipam standing in for it, the real one
// beside it (true): for running the IPAM binary directly, as a main plugin
// delegates to it.
func (r *Rig) IPAMPath(version string, standIn bool) string {
	if standIn {
		return r.cniPaths[version+standInKey]
	}
	return r.cniPaths[version]
}
