package testcni

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The container runtime the real-node tests are written against: Debian 12's
// packages (`apt-get install containerd runc`; make deps installs them).
const (
	ContainerdVersion = "1.6.20"
	RuncVersion       = "1.1.5"
)

// NodeOptions shape a node.
type NodeOptions struct {
	// Whereabouts is the version the node's CNI bin dir has as `whereabouts`
	// (V093 unless set).
	Whereabouts string
	// SwallowDel makes the node's `whereabouts` a wrapper whose DEL returns
	// success without touching the pool (see swallowingWhereabouts).
	SwallowDel bool
	// RetryDeleteOnError sets Multus' retryDeleteOnError: it keeps its cache
	// of a sandbox until a DEL of it succeeds (by default it drops the cache
	// at the first DEL, failed or not).
	RetryDeleteOnError bool
	// StandIn installs the node's CNI bin dir as a cluster does with the
	// chart: whereabouts' own install step (its install-cni.sh), then
	// harvester-ipam's installer standing in for whereabouts; NADs name
	// whereabouts.
	StandIn bool
	// Name tells apart the nodes of one tenant ("node" unless set).
	Name string
	// Kubelet runs a real kubelet on the node, which registers it and runs
	// the pods bound to it, as on a cluster's node; only in a cluster of the
	// rig's own (StartCluster), on its machine. The node's own disk lies
	// over the machine's /etc, /opt and /var/log, so that /etc/cni/net.d and
	// /opt/cni/bin, which DaemonSets mount, are the node's.
	Kubelet bool
	// NoWhereabouts leaves whereabouts out of the node's CNI bin dir: its
	// DaemonSet's pod puts it there (Kubelet nodes only).
	NoWhereabouts bool
	// Images are imported into the node's containerd (beside the sandbox
	// image) whenever its root lacks them: nothing is ever pulled.
	Images []Image
	// Mirrors are registry mirrors of the node's containerd: a registry's
	// host (quay.io) -> a Mirror's Endpoint, where an image that is pulled
	// anyway (a latest tag) is pulled from.
	Mirrors map[string]string
}

// Node is a Kubernetes node without its kubelet: containerd (and runc, and
// its shims) in a PID and mount namespace of its own, whose CRI plugin calls
// the Multus thin plugin as the node's CNI network, which calls the storage
// network's IPAM from a NAD. The tests play the kubelet through the CRI.
//
// The node shares the rig's network namespace and API server; it reaches
// the API server through a Gate of its own, so that a test can cut one node
// off. Its disk (containerd's root, its /var/lib/cni) is a directory of the
// rig's; its /run is a tmpfs of its mount namespace, gone at every reboot.
type Node struct {
	Name   string  // the node object's name
	Tenant *Tenant // the test's tenant: its pools and pods
	// Via is the tenant as the node's plugins see it: the same namespaces,
	// but a kubeconfig (and the flat file naming it) that goes through Gate.
	Via  *Tenant
	Gate *Gate
	// Whereabouts is the version that allocates on this node.
	Whereabouts string

	Dir       string // everything of the node's
	Root      string // containerd's root: the node's disk
	Socket    string // containerd's socket
	BinDir    string // the CNI bin dir (containerd's and Multus')
	ConfDir   string // the CNI conf dir: Multus' conf
	VarLibCNI string // mounted on the node's /var/lib/cni
	Log       string // containerd's (and nodeinit's) log
	MultusLog string
	// On a node with a kubelet: its address (on the machine), its log and
	// root dir, and the node's /opt, /etc and /var/log as the rig sees them.
	IP          string
	KubeletLog  string
	KubeletDir  string
	Opt, Etc    string
	VarLog      string
	kubeletPort int

	rig           *Rig
	opt           NodeOptions
	cgroupParent  string
	defaultSubnet string
	bridge        string

	mu      sync.Mutex
	init    *exec.Cmd
	initIn  io.WriteCloser
	replies chan string
	done    chan struct{}
	cri     *criClient
}

var nodeSeq atomic.Int32

// nodeAssets are built once per rig (its clusters share them): nodeinit and
// the sandbox image.
type nodeAssets struct {
	once          sync.Once
	init, archive string
	err           error
}

var assetsByRig sync.Map // the rig's build dir -> *nodeAssets

func (r *Rig) nodeAssets(ctx context.Context) (*nodeAssets, error) {
	v, _ := assetsByRig.LoadOrStore(r.bin, &nodeAssets{})
	a := v.(*nodeAssets)
	a.once.Do(func() {
		if a.err = checkRuntime(); a.err != nil {
			return
		}
		removeStaleCgroups()
		dir := filepath.Join(filepath.Dir(r.bin), "node-assets")
		a.init = filepath.Join(dir, "nodeinit")
		if a.err = r.build(ctx, a.init, "./testcni/nodeinit"); a.err != nil {
			return
		}
		a.archive, a.err = r.buildSandboxImage(ctx, dir)
	})
	return a, a.err
}

// checkRuntime requires the pinned containerd and runc.
func checkRuntime() error {
	for _, tool := range []struct{ bin, want, pkg string }{
		{"containerd", ContainerdVersion, "containerd"},
		{"containerd-shim-runc-v2", "", "containerd"},
		{"ctr", "", "containerd"},
		{"runc", RuncVersion, "runc"},
	} {
		path, err := exec.LookPath(tool.bin)
		if err != nil {
			return fmt.Errorf("the real-node tests need %s (Debian 12's package %s %s: make deps installs them: apt-get install containerd runc): %w", tool.bin, tool.pkg, tool.want, err)
		}
		if tool.want == "" {
			continue
		}
		out, err := exec.Command(path, "--version").Output()
		if err != nil {
			return fmt.Errorf("%s --version: %w", path, err)
		}
		if !versionIs(string(out), tool.want) {
			return fmt.Errorf("the real-node tests are written against %s %s (Debian 12's package), but %s says: %s", tool.bin, tool.want, path, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// versionIs finds want as a whole version in a --version output ("1.6.20~ds1", "1.1.5+ds1").
func versionIs(out, want string) bool {
	for _, f := range strings.Fields(out) {
		if f == want || strings.HasPrefix(f, want+"~") || strings.HasPrefix(f, want+"+") || strings.HasPrefix(f, want+"-") {
			return true
		}
	}
	return false
}

// StartNode starts a node for tenant t: its node object, its CNI bin and
// conf dirs (Multus with a cluster network of bridge + host-local), its gate
// to the API server, and containerd with the rig's sandbox image.
func (r *Rig) StartNode(ctx context.Context, t *Tenant, opt NodeOptions) (_ *Node, err error) {
	assets, err := r.nodeAssets(ctx)
	if err != nil {
		return nil, err
	}
	if opt.Whereabouts == "" {
		opt.Whereabouts = V093
	}
	wb := r.Tools["whereabouts-"+opt.Whereabouts]
	if wb == "" {
		return nil, fmt.Errorf("no whereabouts %s in the rig's tools", opt.Whereabouts)
	}
	if opt.Kubelet && r.machine == nil {
		return nil, fmt.Errorf("a node with a kubelet runs in a cluster of the rig's own (Rig.StartCluster)")
	}
	if opt.NoWhereabouts && (!opt.Kubelet || opt.StandIn || opt.SwallowDel) {
		return nil, fmt.Errorf("NoWhereabouts is for a node with a kubelet whose whereabouts comes from its DaemonSet")
	}
	i := nodeSeq.Add(1)
	if opt.Name == "" {
		opt.Name = "node"
	}
	name := t.Node(opt.Name)
	dir := filepath.Join(r.Dir, "nodes", name)
	nd := &Node{
		Name: name, Tenant: t, Whereabouts: opt.Whereabouts, Dir: dir,
		Root: filepath.Join(dir, "root"), Socket: filepath.Join(dir, "containerd.sock"),
		BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d"), VarLibCNI: filepath.Join(dir, "var-lib-cni"),
		Log: filepath.Join(dir, "containerd.log"), MultusLog: filepath.Join(dir, "multus.log"),
		rig: r, opt: opt, cgroupParent: fmt.Sprintf("/%s%d-%s", cgroupPrefix, os.Getpid(), name),
		defaultSubnet: fmt.Sprintf("10.245.%d.0/24", i%250), bridge: fmt.Sprintf("cni%d", i),
	}
	if opt.Kubelet {
		// The node's disk: its /etc, /opt and /var/log lie over the machine's.
		nd.Etc, nd.Opt, nd.VarLog = filepath.Join(dir, "disk", "etc"), filepath.Join(dir, "disk", "opt"), filepath.Join(dir, "disk", "log")
		nd.BinDir, nd.ConfDir = filepath.Join(nd.Opt, "cni", "bin"), filepath.Join(nd.Etc, "cni", "net.d")
		// The kubelet's root and containerd's socket in a short dir of the
		// rig's: the kubelet makes unix sockets under its root, whose paths
		// may not exceed 108 bytes.
		short := filepath.Join(filepath.Dir(r.bin), fmt.Sprintf("k%d", i))
		nd.KubeletDir, nd.KubeletLog = filepath.Join(short, "kubelet"), filepath.Join(dir, "kubelet.log")
		nd.Socket = filepath.Join(short, "containerd.sock")
		nd.IP, nd.kubeletPort = r.machine.IP, 10250+int(i)
	}
	defer func() {
		if err != nil {
			nd.Close()
			err = fmt.Errorf("start node %s: %w", name, err)
		}
	}()
	for _, d := range []string{nd.Root, nd.BinDir, nd.ConfDir, nd.VarLibCNI} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if opt.Kubelet {
		// A node's /etc/hostname names it, as on a real node: whereabouts
		// v0.9.3 and before find their node by it when no NODENAME is set
		// (v0.9.4's installer writes whereabouts.d/nodename instead), and
		// its node slices failed on every side without it.
		if err := os.WriteFile(filepath.Join(nd.Etc, "hostname"), []byte(name+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	links := map[string]string{"bridge": r.Tools["bridge"], "host-local": r.Tools["host-local"], "loopback": r.Tools["loopback"], "macvlan": r.Tools["macvlan"], "multus": r.Tools["multus"], "harvester-ipam": r.PluginBinary()}
	if opt.Kubelet {
		delete(links, "harvester-ipam") // the chart's pod puts it there, or the installer below
	}
	switch {
	case opt.StandIn && opt.SwallowDel:
		return nil, fmt.Errorf("node %s: StandIn with SwallowDel is not a node the rig makes", name)
	case opt.SwallowDel:
		if err := writeSwallowingWhereabouts(filepath.Join(nd.BinDir, "whereabouts"), wb); err != nil {
			return nil, err
		}
	case opt.NoWhereabouts:
	case opt.Kubelet && !opt.StandIn:
		// A file, not a link: containers see the node's bin dir, and
		// nothing of the rig's.
		if err := copyFile(wb, filepath.Join(nd.BinDir, "whereabouts"), 0o755); err != nil {
			return nil, err
		}
	case !opt.StandIn:
		links["whereabouts"] = wb
	}
	if opt.StandIn {
		delete(links, "harvester-ipam") // the installer puts it there
	}
	for n, target := range links {
		if err := os.Symlink(target, filepath.Join(nd.BinDir, n)); err != nil {
			return nil, err
		}
	}
	if opt.StandIn {
		if err := r.standInOnNode(ctx, opt.Whereabouts, nd.BinDir, nd.ConfDir); err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	via := &Tenant{Name: t.Name, PoolNamespace: t.PoolNamespace, PodNamespace: t.PodNamespace, rig: r}
	kc := r.cluster.kubeconfig(t.PoolNamespace)
	if !opt.Kubelet {
		if nd.Gate, err = newGate(strings.TrimPrefix(r.APIServerURL(), "https://")); err != nil {
			return nil, err
		}
		kc = strings.Replace(kc, r.APIServerURL(), "https://"+nd.Gate.Addr, 1)
	}
	if err := via.write(filepath.Join(dir, "etc"), kc); err != nil {
		return nil, err
	}
	nd.Via = via
	if err := nd.writeMultusConf(); err != nil {
		return nil, err
	}
	if err := nd.writeContainerdConf(); err != nil {
		return nil, err
	}
	if opt.Kubelet {
		if err := nd.writeKubeletConf(); err != nil {
			return nil, err
		}
	} else if err := r.CreateNode(ctx, name); err != nil {
		return nil, err
	}
	if err := nd.boot(ctx, assets); err != nil {
		return nil, err
	}
	return nd, nil
}

// writeSwallowingWhereabouts writes a `whereabouts` that execs the real one
// for every verb but DEL, and returns success on DEL without calling it.
// Why: whereabouts' own DEL logs and swallows its storage errors (a lease
// it could not get in time, a pool patch that failed) and returns success
// with the pool untouched, so the runtime never retries. That failure cannot
// be had on demand here without breaking the API server for every test, so
// the wrapper gives the runtime and the caller exactly that outcome.
func writeSwallowingWhereabouts(path, real string) error {
	script := fmt.Sprintf(`#!/bin/sh
# DEL: success, pool untouched, as whereabouts when its storage fails.
if [ "$CNI_COMMAND" = DEL ]; then exit 0; fi
exec %q "$@"
`, real)
	return os.WriteFile(path, []byte(script), 0o755)
}

// writeMultusConf writes the node's CNI conf: the Multus thin plugin as its
// entrypoint writes 00-multus.conf, the cluster network inline as the first
// delegate, and the node's kubeconfig.
func (nd *Node) writeMultusConf() error {
	binDir := nd.BinDir
	if nd.opt.Kubelet {
		binDir = "/opt/cni/bin" // the node's, as containerd sees it
	}
	ipam := map[string]any{"type": "host-local", "subnet": nd.defaultSubnet}
	if nd.opt.Kubelet {
		// Pods that call the API server (a Job's) reach the kubernetes
		// Service through the bridge's gateway, as on any cluster network.
		ipam["routes"] = []any{map[string]any{"dst": "0.0.0.0/0"}}
	}
	conf := map[string]any{
		"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
		"kubeconfig": nd.Via.Kubeconfig,
		"binDir":     binDir,
		"cniDir":     MultusCacheDir,
		"logFile":    nd.MultusLog, "logLevel": "verbose",
		"retryDeleteOnError": nd.opt.RetryDeleteOnError,
		"delegates": []any{map[string]any{
			"cniVersion": "0.3.1", "name": "cluster-network", "type": "bridge", "bridge": nd.bridge, "isGateway": true,
			"ipam": ipam,
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(nd.ConfDir, "00-multus.conf"), b)
}

// writeContainerdConf writes containerd's config. The three CRI settings are
// what these machines need, or runc fails with "can't get final child's PID
// from pipe": the sysctls for unprivileged ports and ICMP, and an OOM score
// it may not lower (root here lacks CAP_SYS_RESOURCE).
func (nd *Node) writeContainerdConf() error {
	binDir, confDir := nd.BinDir, nd.ConfDir
	if nd.opt.Kubelet {
		binDir, confDir = "/opt/cni/bin", "/etc/cni/net.d" // the node's own, as on a cluster's node
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, nd.Root, nd.Socket, filepath.Join(nd.Dir, "containerd-opt"), SandboxImage, mustLook("runc"), binDir, confDir)
	hosts := slices.Sorted(maps.Keys(nd.opt.Mirrors))
	for _, host := range hosts {
		conf += fmt.Sprintf("  [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.%q]\n    endpoint = [%q]\n", host, nd.opt.Mirrors[host])
	}
	return writeFile(filepath.Join(nd.Dir, "config.toml"), []byte(conf))
}

// boot starts nodeinit in a new PID and mount namespace, containerd in it,
// and waits until the CRI is ready with the sandbox image.
func (nd *Node) boot(ctx context.Context, assets *nodeAssets) error {
	spec := map[string]any{
		"containerd": mustLook("containerd"), "args": []string{"--config", filepath.Join(nd.Dir, "config.toml")},
		"log": nd.Log, "varLibCNI": nd.VarLibCNI,
	}
	if nd.opt.Kubelet {
		spec["kubelet"] = nd.kubeletArgs()
		spec["kubeletLog"] = nd.KubeletLog
		var overlays []map[string]string
		for target, upper := range map[string]string{"/etc": nd.Etc, "/opt": nd.Opt, "/var/log": nd.VarLog} {
			overlays = append(overlays, map[string]string{"target": target, "upper": upper, "work": filepath.Join(nd.Dir, "disk", "work"+strings.ReplaceAll(target, "/", "-"))})
		}
		spec["overlays"] = overlays
	}
	specJSON, _ := json.Marshal(spec)
	specPath := filepath.Join(nd.Dir, "nodeinit.json")
	if err := os.WriteFile(specPath, specJSON, 0o600); err != nil {
		return err
	}
	_ = os.Remove(nd.Socket)
	logf, err := os.OpenFile(nd.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	booted := time.Now()
	fmt.Fprintf(logf, "\n==== rig: node %s boots at %s ====\n", nd.Name, booted.Format(time.RFC3339Nano))
	cmd := exec.Command(assets.init, specPath)
	if m := nd.rig.machine; m != nil {
		// On its cluster's machine: nsenter execs nodeinit, which so stays
		// PID 1 of the new PID namespace.
		cmd = exec.Command(mustLook("nsenter"), "--net="+m.Path, "--", assets.init, specPath)
	}
	cmd.Stderr = logf
	// A node of its own: its processes die with nodeinit, and nodeinit with the rig.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nodeinit of %s: %w", nd.Name, err)
	}
	replies, done := make(chan string, 4), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			replies <- sc.Text()
		}
		_ = cmd.Wait()
		close(done)
	}()
	nd.mu.Lock()
	nd.init, nd.initIn, nd.replies, nd.done = cmd, in, replies, done
	nd.mu.Unlock()
	if err := nd.startContainerd(ctx, assets); err != nil {
		return err
	}
	if nd.opt.Kubelet {
		return nd.startKubelet(ctx, booted)
	}
	return nil
}

// control sends nodeinit a command and returns its answer.
func (nd *Node) control(ctx context.Context, cmd, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := fmt.Fprintln(nd.initIn, cmd); err != nil {
		return fmt.Errorf("node %s: %s: %w", nd.Name, cmd, err)
	}
	select {
	case r := <-nd.replies:
		if !strings.HasPrefix(r, want) {
			return fmt.Errorf("node %s: %s: %s; log ends:\n%s", nd.Name, cmd, r, nd.LogTail(20))
		}
		return nil
	case <-nd.done:
		return fmt.Errorf("node %s: nodeinit exited on %s; log ends:\n%s", nd.Name, cmd, nd.LogTail(20))
	case <-ctx.Done():
		return fmt.Errorf("node %s: no answer to %s: %w", nd.Name, cmd, ctx.Err())
	}
}

// startContainerd starts containerd, dials its CRI, imports the sandbox
// image when the root lacks it, and waits until the CRI is ready.
func (nd *Node) startContainerd(ctx context.Context, assets *nodeAssets) error {
	if err := nd.control(ctx, "start", "started"); err != nil {
		return err
	}
	nd.cri.close()
	cri, err := dialCRI(nd.Socket)
	if err != nil {
		return err
	}
	nd.cri = cri
	var last error
	imported := false
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-nd.done:
			return false, fmt.Errorf("nodeinit exited")
		default:
		}
		last = cri.ready(ctx)
		if last != nil && !imported && strings.Contains(last.Error(), "does not have") {
			if err := nd.importImage(ctx, assets.archive); err != nil {
				return false, err
			}
			imported = true
			last = cri.ready(ctx)
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("containerd of node %s not ready: %w (last: %v); log ends:\n%s", nd.Name, err, last, nd.LogTail(30))
	}
	for _, img := range nd.opt.Images {
		st, err := cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.Ref}})
		if err != nil {
			return fmt.Errorf("node %s: image status of %s: %w", nd.Name, img.Ref, err)
		}
		if st.Image == nil {
			if err := nd.importImage(ctx, img.Archive); err != nil {
				return err
			}
		}
	}
	return nil
}

// importImage imports an image archive into the CRI's namespace. Generous:
// unpacking a hundred megabytes on a loaded machine took over a minute.
func (nd *Node) importImage(ctx context.Context, archive string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "--address", nd.Socket, "--namespace", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s on node %s: %w: %s", archive, nd.Name, err, out)
	}
	return nil
}

// RestartContainerd stops containerd (SIGTERM) and starts it again, without
// a reboot: the shims and sandboxes keep running.
func (nd *Node) RestartContainerd(ctx context.Context) error {
	assets, err := nd.rig.nodeAssets(ctx)
	if err != nil {
		return err
	}
	if err := nd.control(ctx, "stop", "stopped"); err != nil {
		return err
	}
	return nd.startContainerd(ctx, assets)
}

// Reboot cuts the node's power and boots it again: containerd, its shims and
// the sandboxes are killed (SIGKILL), the node's mounts (the sandboxes'
// netns files, rootfs and shm) and its /run (containerd's state) are gone;
// its disk, containerd's root and /var/lib/cni, is kept. With loseRoot the
// node comes back with containerd's root emptied too (the disk replaced, or
// wiped): containerd knows no sandbox of before.
func (nd *Node) Reboot(ctx context.Context, loseRoot bool) error {
	assets, err := nd.rig.nodeAssets(ctx)
	if err != nil {
		return err
	}
	if err := nd.powerOff(); err != nil {
		return err
	}
	if loseRoot {
		if err := os.RemoveAll(nd.Root); err != nil {
			return fmt.Errorf("wipe containerd's root of %s: %w", nd.Name, err)
		}
		if err := os.MkdirAll(nd.Root, 0o755); err != nil {
			return err
		}
	}
	return nd.boot(ctx, assets)
}

// powerOff kills nodeinit, and with it every process of the node, and waits
// until they are gone.
func (nd *Node) powerOff() error {
	nd.mu.Lock()
	cmd, done := nd.init, nd.done
	nd.init = nil
	nd.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("node %s: nodeinit did not die in 30 s", nd.Name)
	}
	removeCgroups(nd.cgroupParent)
	return nil
}

// Close shuts the node down (nodeinit ends, and every process of the node
// with it) and removes its cgroups.
func (nd *Node) Close() {
	nd.mu.Lock()
	cmd, in, done := nd.init, nd.initIn, nd.done
	nd.init = nil
	nd.mu.Unlock()
	if cmd != nil {
		in.Close()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		removeCgroups(nd.cgroupParent)
	}
	nd.cri.close()
	if nd.Gate != nil {
		nd.Gate.Cut()
	}
}

// cgroupPrefix starts the name of every node's cgroup parent, followed by
// the rig's PID: a rig that was killed leaves its sandboxes' cgroups in the
// machine's hierarchies, and the next rig removes them.
const cgroupPrefix = "harvester-ipam-rig-"

// cgroupMounts are the mount points of the cgroup hierarchies the rig sees.
func cgroupMounts() []string {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") && len(f) > 4 {
				out = append(out, f[4])
			}
		}
	}
	return out
}

// removeStaleCgroups removes the cgroups of rigs whose process is gone.
func removeStaleCgroups() {
	for _, m := range cgroupMounts() {
		entries, _ := os.ReadDir(m)
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), cgroupPrefix)
			pid, _, _ := strings.Cut(rest, "-")
			if !ok || !e.IsDir() || pid == "" {
				continue
			}
			if _, err := os.Stat("/proc/" + pid); errors.Is(err, os.ErrNotExist) {
				removeCgroups("/" + e.Name())
			}
		}
	}
}

// removeCgroups removes a cgroup and those under it, deepest first, from
// every hierarchy the rig sees; runc leaves those of killed sandboxes behind,
// and a reboot would not have them. A cgroup that still has processes stays.
func removeCgroups(parent string) {
	for _, m := range cgroupMounts() {
		top := filepath.Join(m, parent)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// LogTail is the end of containerd's log.
func (nd *Node) LogTail(lines int) string {
	b, _ := os.ReadFile(nd.Log)
	return tailLines(string(b), lines)
}

// MultusLogTail is the end of Multus' log.
func (nd *Node) MultusLogTail(lines int) string {
	b, _ := os.ReadFile(nd.MultusLog)
	return tailLines(string(b), lines)
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	for i := range l {
		if len(l[i]) > 400 {
			l[i] = l[i][:400] + "…"
		}
	}
	return "  " + strings.Join(l, "\n  ")
}

func mustLook(bin string) string {
	p, err := exec.LookPath(bin)
	if err != nil {
		return bin
	}
	return p
}

// StorageNetwork creates the storage network's NAD nadNamespace/nadName, as
// Harvester does, with n's IPAM allocating on whereabouts of this node's
// version in this node's tenant; pods of the node that ask for it in their
// networks annotation get it on ifName.
func (nd *Node) StorageNetwork(ctx context.Context, n Network, nadNamespace, nadName, ifName string) (*MultusNetwork, error) {
	n.Tenant = nd.Via // the NAD names the flat file whose kubeconfig goes through the gate
	n.Whereabouts = nd.Whereabouts
	if n.Name == "" {
		n.Name = nadName
	}
	n = n.withDefaults(nd.rig)
	m := &MultusNetwork{
		Network: &n, NADNamespace: nadNamespace, NADName: nadName, LogFile: nd.MultusLog,
		defaultBridge: nd.bridge, defaultSubnet: nd.defaultSubnet, storageIfName: ifName,
	}
	req, _ := json.Marshal([]map[string]string{{"namespace": nadNamespace, "name": nadName, "interface": ifName}})
	m.networksRequest = string(req)
	if err := nd.rig.EnsureNamespace(ctx, nadNamespace); err != nil {
		return nil, err
	}
	if err := m.SetNAD(ctx, n.NADConfig()); err != nil {
		return nil, err
	}
	return m, nil
}

// CreatePod creates a pod object bound to this node, annotated as Harvester
// annotates Longhorn's pods: its networks annotation asks for m's NAD.
func (nd *Node) CreatePod(ctx context.Context, m *MultusNetwork, name string) (Pod, error) {
	pod := nd.Tenant.Pod(name)
	_, err := nd.rig.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, nd.longhornPod(pod, m.networksRequest), metav1.CreateOptions{})
	if err != nil {
		return pod, fmt.Errorf("create pod %s on %s: %w", pod.Ref(), nd.Name, err)
	}
	return pod, nil
}

// ForgetMultusCache deletes what Multus cached of a sandbox on this node, as a
// wiped /var/lib/cni/multus does.
func (nd *Node) ForgetMultusCache(id string) ([]string, error) {
	var removed []string
	dir := filepath.Join(nd.VarLibCNI, "multus")
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.Contains(d.Name(), id) {
			if err := os.Remove(p); err != nil {
				return err
			}
			removed = append(removed, p)
		}
		return nil
	})
	if err != nil {
		return removed, fmt.Errorf("forget Multus' cache of %s on %s: %w", short(id), nd.Name, err)
	}
	return removed, nil
}

// standInOnNode sets up a node's CNI bin dir as whereabouts' DaemonSet and
// then harvester-ipam's leave it: whereabouts' install-cni.sh of the
// version, then harvester-ipam-install --stand-in=whereabouts, run once.
func (r *Rig) standInOnNode(ctx context.Context, version, binDir, confDir string) error {
	if out, err := r.RunWhereaboutsInstall(ctx, version, binDir, confDir); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	installer := filepath.Join(r.bin, "harvester-ipam-install")
	r.mu.Lock()
	_, err := os.Stat(installer)
	if err != nil {
		err = r.BuildCommand(ctx, "./cmd/harvester-ipam-install", installer, "-s -w")
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, installer, "--source="+r.PluginBinary(), "--cni-bin-dir="+binDir,
		"--stand-in=whereabouts", "--flat-file=", "--interval=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harvester-ipam-install --stand-in=whereabouts: %w\n%s", err, out)
	}
	return nil
}
