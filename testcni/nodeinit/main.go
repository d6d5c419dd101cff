// Command nodeinit is PID 1 of one of the rig's nodes: a PID and mount
// namespace of its own (the rig's network namespace is shared), in which it
// mounts what a booted node has fresh (/proc, the cgroup hierarchies, tmpfs
// on /run/containerd and /run/netns), binds the node's own /var/lib/cni, and
// runs containerd. It reaps every orphan (the shims daemonize and land here).
//
// Killing it is the node's power cut: the kernel kills every process of the
// namespace (containerd, shims, sandboxes), and the node's mounts (the netns
// files, the sandboxes' rootfs and shm, containerd's state) go with it.
//
// It reads commands on stdin, one a line, and answers on stdout:
//
//	start   start containerd           -> "started <pid>" or "error <why>"
//	stop    SIGTERM containerd, wait    -> "stopped" (SIGKILL after 10 s)
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
	n := &node{spec: spec, exited: map[int]chan syscall.WaitStatus{}}
	go n.reap()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := strings.TrimSpace(in.Text()); cmd {
		case "start":
			pid, err := n.start()
			if err != nil {
				fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Printf("started %d\n", pid)
		case "stop":
			n.stop()
			fmt.Println("stopped")
		default:
			fmt.Printf("error unknown command %q\n", cmd)
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
	for _, dir := range []string{"/run/containerd", "/run/netns"} {
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
	spec Spec
	mu   sync.Mutex
	pid  int // containerd's, 0 when not running
	// exited delivers containerd's exit to stop; the reaper owns wait4.
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
			if n.pid == pid {
				n.pid = 0
			}
		}
		n.mu.Unlock()
	}
}

func (n *node) start() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pid != 0 {
		return 0, fmt.Errorf("containerd already runs as %d", n.pid)
	}
	log, err := os.OpenFile(n.spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	// The reaper must not see the exit before it is registered: register
	// under the lock it takes.
	pid, err := syscall.ForkExec(n.spec.Containerd, append([]string{n.spec.Containerd}, n.spec.Args...), &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{devNull(), log.Fd(), log.Fd()},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", n.spec.Containerd, err)
	}
	n.pid = pid
	n.exited[pid] = make(chan syscall.WaitStatus, 1)
	return pid, nil
}

func (n *node) stop() {
	n.mu.Lock()
	pid, ch := n.pid, n.exited[n.pid]
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
