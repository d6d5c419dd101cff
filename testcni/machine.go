package testcni

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ServiceCIDR is every rig cluster's Service range; the API server takes its
// first address for the kubernetes Service.
const ServiceCIDR = "10.96.0.0/16"

// KubernetesServiceIP is the kubernetes Service's ClusterIP, which pods and
// the plugins they install (whereabouts' kubeconfig) dial as
// KUBERNETES_SERVICE_HOST, port 443.
const KubernetesServiceIP = "10.96.0.1"

// machine is a network namespace of its own that a cluster of the rig's own
// runs on: its etcd, API server, controller manager, scheduler and
// Harvester's network webhook, and its nodes (containerd, the kubelet and
// their pods, hostNetwork ones too). Its loopback, its port 443 and its
// ClusterIP are its own, so that two such clusters and the rig's own never
// meet. A veth joins it to the rig's network namespace: the tests reach its
// API server at IP.
type machine struct {
	Name string // the network namespace (ip netns)
	Path string // its file, for setns and nsenter
	IP   string // the machine's address (eth0), its nodes' IP
	peer string // the rig's end of the veth
	link string // the veth's name on the rig's side
	// kubeProxy stands in for kube-proxy: forwarders from a Service's
	// address to its backend.
	kubeProxy []*Gate
}

var machineSeq atomic.Int32

// newMachine creates a machine: its network namespace, loopback up, a veth
// whose rig end has 172.31.N.1 and whose end inside, eth0, has 172.31.N.2
// and the default route, and the kubernetes Service's ClusterIP on its
// loopback, where nothing listens until startKubeProxy.
func newMachine(name string) (_ *machine, err error) {
	if _, err := exec.LookPath("nsenter"); err != nil {
		return nil, fmt.Errorf("a cluster of the rig's own runs its servers with nsenter (Debian package util-linux): %w", err)
	}
	n := machineSeq.Add(1)
	if n > 250 {
		return nil, fmt.Errorf("machine %s: the rig makes at most 250 machines", name)
	}
	m := &machine{
		Name: fmt.Sprintf("rig-m%d-%s", n, name), IP: fmt.Sprintf("172.31.%d.2", n),
		peer: fmt.Sprintf("172.31.%d.1", n), link: fmt.Sprintf("rig-m%d", n),
	}
	m.Path = filepath.Join("/run/netns", m.Name)
	defer func() {
		if err != nil {
			m.close()
			err = fmt.Errorf("machine %s: %w", name, err)
		}
	}()
	steps := [][]string{
		{"netns", "add", m.Name},
		{"-n", m.Name, "link", "set", "lo", "up"},
		{"link", "add", m.link, "type", "veth", "peer", "name", "eth0", "netns", m.Name},
		{"addr", "add", m.peer + "/30", "dev", m.link},
		{"link", "set", m.link, "up"},
		{"-n", m.Name, "addr", "add", m.IP + "/30", "dev", "eth0"},
		{"-n", m.Name, "link", "set", "eth0", "up"},
		{"-n", m.Name, "route", "add", "default", "via", m.peer},
		{"-n", m.Name, "addr", "add", KubernetesServiceIP + "/32", "dev", "lo"},
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return m, nil
}

// serve stands in for kube-proxy for one Service: a forwarder from addr
// (an address of the machine) to target. No kube-proxy runs on the rig's
// machines; this is its part for the Services the cluster's parts dial, as
// its userspace mode did.
func (m *machine) serve(addr, target string) error {
	g, err := newGateWith(target, func() (net.Listener, error) { return m.listen("tcp", addr) })
	if err != nil {
		return fmt.Errorf("machine %s: a Service at %s: %w", m.Name, addr, err)
	}
	m.kubeProxy = append(m.kubeProxy, g)
	return nil
}

// listen opens a listener inside the machine's network namespace: the socket
// belongs to the namespace it was made in, whichever thread later uses it.
func (m *machine) listen(network, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer own.Close()
	target, err := os.Open(m.Path)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", m.Path, err)
	}
	ln, lerr := net.Listen(network, addr)
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// This thread stays in the machine's namespace: leave it locked, so
		// that it ends with this goroutine and no other runs on it.
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("leave %s: %w", m.Path, err)
	}
	runtime.UnlockOSThread()
	return ln, lerr
}

// startProc starts a server as startProc does, inside the machine's network
// namespace (nsenter execs it: the PID, and the rig's SIGKILL at its death,
// are the server's). A nil machine is the rig's own namespace.
func (m *machine) startProc(dir, name, bin string, env []string, args ...string) (*proc, error) {
	if m == nil {
		return startProcWith(dir, name, bin, nil, env, args...)
	}
	return startProcWith(dir, name, mustLook("nsenter"), nil, env, append([]string{"--net=" + m.Path, "--", bin}, args...)...)
}

// close deletes the machine's network namespace; the veth goes with it.
// Every process of the machine must be gone by then (or holds it alive).
func (m *machine) close() {
	if m == nil {
		return
	}
	for _, g := range m.kubeProxy {
		g.Cut()
	}
	_ = exec.Command("ip", "netns", "del", m.Name).Run()
	_ = exec.Command("ip", "link", "del", m.link).Run()
}
