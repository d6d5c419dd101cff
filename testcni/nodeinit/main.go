// Command nodeinit is PID 1 of one of the rig's nodes: a PID and mount
// namespace of its own (the network namespace is the rig's, or its cluster's
// machine), in which it mounts what a booted node has fresh (/proc, the
// cgroup hierarchies, tmpfs on /run/containerd, /run/netns and
// /run/harvester-ipam, where the node agent's socket is), lays the
// node's own disk over the machine's /etc, /opt and /var/log where asked
// (so that /etc/cni/net.d and /opt/cni/bin are the node's, and nothing of
// the host is written), binds the node's own /var/lib/cni, and runs
// containerd and, on a node with one, the kubelet. It reaps every orphan (the
// shims daemonize and land here).
//
// Killing it is the node's power cut: the kernel kills every process of the
// namespace (containerd, the kubelet, shims, containers), and the node's
// mounts (the netns files, the containers' rootfs and shm, containerd's
// state) go with it.
//
// It reads commands on stdin, one a line, and answers on stdout:
//
//	start [NAME]     start containerd (or the kubelet) -> "started <pid>" or "error <why>"
//	stop [NAME]      SIGTERM it, wait                  -> "stopped" (SIGKILL after 10 s)
//	shutdown GRACE   what systemd does at a clean shutdown: stop the kubelet,
//	                 then containerd (its shims and containers keep running),
//	                 then SIGTERM every process left, SIGKILL after GRACE
//	                 seconds                           -> "down <how many were killed>: <their names>"
//
// End of stdin (the rig closed it, or died) ends the node.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec is what the rig asks for (the JSON file named by the only argument).
type Spec struct {
	Containerd string   `json:"containerd"`
	Args       []string `json:"args"`
	Log        string   `json:"log"`
	// VarLibCNI is the node's own /var/lib/cni (Multus' cache, harvester-ipam's
	// checkpoints, host-local's leases): it survives reboots, as a disk does.
	VarLibCNI string `json:"varLibCNI"`
	// Kubelet is the kubelet's command line, on a node that runs one.
	Kubelet    []string `json:"kubelet,omitempty"`
	KubeletLog string   `json:"kubeletLog,omitempty"`
	// Overlays lay a dir of the node's disk over a dir of the machine.
	Overlays []Overlay `json:"overlays,omitempty"`
}

// Overlay is an overlayfs of Upper (the node's, on its disk) over Target.
type Overlay struct {
	Target string `json:"target"`
	Upper  string `json:"upper"`
	Work   string `json:"work"`
}

// proc is a service nodeinit runs: containerd or the kubelet.
type proc struct {
	argv []string
	log  string
}

func main() {
	if len(os.Args) != 2 {
		fatal(errors.New("usage: nodeinit SPEC.json"))
	}
	b, err := os.ReadFile(os.Args[1])
	if err != nil {
		fatal(err)
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		fatal(fmt.Errorf("%s: %w", os.Args[1], err))
	}
	if os.Getpid() != 1 {
		fatal(fmt.Errorf("nodeinit must be PID 1 of a new PID namespace, is %d", os.Getpid()))
	}
	if err := boot(spec); err != nil {
		fatal(err)
	}
	n := &node{
		procs:  map[string]proc{"containerd": {append([]string{spec.Containerd}, spec.Args...), spec.Log}},
		pids:   map[string]int{},
		exited: map[int]chan syscall.WaitStatus{},
	}
	if len(spec.Kubelet) > 0 {
		n.procs["kubelet"] = proc{spec.Kubelet, spec.KubeletLog}
	}
	go n.reap()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		name := "containerd"
		if len(f) > 1 {
			name = f[1]
		}
		switch f[0] {
		case "start":
			pid, err := n.start(name)
			if err != nil {
				fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Printf("started %d\n", pid)
		case "stop":
			n.stop(name)
			fmt.Println("stopped")
		case "shutdown":
			grace, err := strconv.Atoi(name)
			if err != nil {
				fmt.Printf("error shutdown %q: want a grace in seconds\n", name)
				continue
			}
			killed := n.shutdown(time.Duration(grace) * time.Second)
			fmt.Printf("down %d: %s\n", len(killed), strings.Join(killed, ", "))
		default:
			fmt.Printf("error unknown command %q\n", f[0])
		}
	}
	// The rig is gone or done: so is the node. Returning from PID 1 makes
	// the kernel kill everything else in the namespace.
}

// boot mounts what a freshly booted node has.
func boot(spec Spec) error {
	// Mounts made here stay in this node's namespace.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The hierarchies to mount are the ones PID 1 of the machine is in; read
	// them before /proc becomes this namespace's.
	cg, err := os.ReadFile("/proc/1/cgroup")
	if err != nil {
		return err
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := mountCgroups(string(cg)); err != nil {
		return err
	}
	for _, o := range spec.Overlays {
		for _, d := range []string{o.Upper, o.Work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		opts := "lowerdir=" + o.Target + ",upperdir=" + o.Upper + ",workdir=" + o.Work
		if err := syscall.Mount("overlay", o.Target, "overlay", 0, opts); err != nil {
			return fmt.Errorf("lay %s over %s: %w", o.Upper, o.Target, err)
		}
	}
	// /run/harvester-ipam holds the node agent's socket: each node its own.
	// The kubelet binds its device-plugin, plugin-registration and
	// pod-resources sockets under /var/lib/kubelet whatever its --root-dir:
	// two nodes' kubelets starting at once collided there ("listen unix
	// /var/lib/kubelet/device-plugins/kubelet.sock: bind: address already
	// in use"), so each node has its own, gone at every boot as a socket is.
	for _, dir := range []string{"/run/containerd", "/run/netns", "/run/harvester-ipam",
		"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/pod-resources"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("node", dir, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll("/var/lib/cni", 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(spec.VarLibCNI, "/var/lib/cni", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /var/lib/cni: %w", spec.VarLibCNI, err)
	}
	return nil
}

// mountCgroups mounts a tmpfs on /sys/fs/cgroup and each cgroup v1 hierarchy
// listed (lines "id:controllers:path"), or cgroup2 alone when that is all the
// machine has. A namespace entered with `ip netns exec` has a /sys without
// them, and runc needs them.
func mountCgroups(procCgroup string) error {
	var v1 []string
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] != "" {
			v1 = append(v1, parts[1])
		}
	}
	if len(v1) == 0 {
		if err := syscall.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
			return fmt.Errorf("mount cgroup2 on /sys/fs/cgroup: %w", err)
		}
		return nil
	}
	if err := syscall.Mount("cgroup", "/sys/fs/cgroup", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on /sys/fs/cgroup: %w", err)
	}
	for _, controllers := range v1 {
		dir := filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(controllers, "name="))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("cgroup", dir, "cgroup", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, controllers); err != nil {
			return fmt.Errorf("mount the cgroup hierarchy %s on %s: %w", controllers, dir, err)
		}
	}
	return nil
}

type node struct {
	procs map[string]proc
	mu    sync.Mutex
	pids  map[string]int // the running services' PIDs
	// exited delivers a service's exit to stop; the reaper owns wait4.
	exited map[int]chan syscall.WaitStatus
}

// reap waits for every child and orphan, forever.
func (n *node) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			time.Sleep(50 * time.Millisecond) // ECHILD: nothing to wait for yet
			continue
		}
		n.mu.Lock()
		if ch, ok := n.exited[pid]; ok {
			ch <- ws
			delete(n.exited, pid)
			for name, p := range n.pids {
				if p == pid {
					delete(n.pids, name)
				}
			}
		}
		n.mu.Unlock()
	}
}

func (n *node) start(name string) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.procs[name]
	if !ok {
		return 0, fmt.Errorf("no service %q on this node", name)
	}
	if pid := n.pids[name]; pid != 0 {
		return 0, fmt.Errorf("%s already runs as %d", name, pid)
	}
	log, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	// The reaper must not see the exit before it is registered: register
	// under the lock it takes.
	pid, err := syscall.ForkExec(p.argv[0], p.argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{devNull(), log.Fd(), log.Fd()},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", p.argv[0], err)
	}
	n.pids[name] = pid
	n.exited[pid] = make(chan syscall.WaitStatus, 1)
	return pid, nil
}

func (n *node) stop(name string) {
	n.mu.Lock()
	pid := n.pids[name]
	ch := n.exited[pid]
	n.mu.Unlock()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-ch
	}
}

// shutdown is systemd's clean shutdown of a node: the kubelet's unit is
// stopped first (it is ordered after containerd's), then containerd's, whose
// KillMode=process leaves the shims and containers running; then
// systemd-shutdown sends SIGTERM to every process left, waits, and sends
// SIGKILL to what is still there. It returns the names of those it killed.
func (n *node) shutdown(grace time.Duration) []string {
	n.stop("kubelet")
	n.stop("containerd")
	_ = syscall.Kill(-1, syscall.SIGTERM) // as PID 1: every process of the namespace but itself
	deadline := time.Now().Add(grace)
	for len(others()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	var killed []string
	for _, pid := range others() {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		killed = append(killed, strings.TrimSpace(string(comm)))
	}
	_ = syscall.Kill(-1, syscall.SIGKILL)
	for end := time.Now().Add(10 * time.Second); len(others()) > 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	return killed
}

// others are the PIDs of the namespace's processes but PID 1, zombies left
// out (the reaper takes them).
func others() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ...": the state follows the last ')'.
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

func devNull() uintptr {
	f, err := os.Open(os.DevNull)
	if err != nil {
		fatal(err)
	}
	return f.Fd()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "nodeinit:", err)
	os.Exit(1)
}
