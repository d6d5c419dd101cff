package testcni

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// OnMachine is a command run on the cluster's machine (its network
// namespace), as an operator's shell on a host of that network: its
// localhost is the machine's, where a registry the nodes pull from listens.
func (r *Rig) OnMachine(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	if r.machine == nil {
		return nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	return exec.CommandContext(ctx, mustLook("nsenter"), append([]string{"--net=" + r.machine.Path, "--", name}, args...)...), nil
}

// StartOnMachine starts a server on the cluster's machine, which stops with
// the cluster (or by the returned stop).
func (r *Rig) StartOnMachine(name, bin string, args ...string) (stop func(), err error) {
	if r.machine == nil {
		return nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	p, err := r.machine.startProc(r.Dir, name, bin, nil, args...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.controllers = append(r.controllers, p)
	r.mu.Unlock()
	time.Sleep(200 * time.Millisecond)
	if p.exited() {
		return nil, fmt.Errorf("%s exited at once: %s", name, p.tail())
	}
	return func() { p.stop(5 * time.Second) }, nil
}

// RKE2Socket is where RKE2's containerd listens (and its ctr,
// /var/lib/rancher/rke2/bin/ctr, connects with --address).
const RKE2Socket = "/run/k3s/containerd/containerd.sock"

// OnNode is a command run on the node as root in a shell there: in its
// mount namespace (its /run, /etc, /opt) and its machine's network. The
// node's containerd answers at RKE2's socket path too (a link in its /run),
// as an import into RKE2's containerd addresses it.
func (nd *Node) OnNode(ctx context.Context, dir, script string) (*exec.Cmd, error) {
	nd.mu.Lock()
	init := nd.init
	nd.mu.Unlock()
	if init == nil || init.Process == nil {
		return nil, fmt.Errorf("node %s is down", nd.Name)
	}
	pid := strconv.Itoa(init.Process.Pid)
	link := fmt.Sprintf("mkdir -p %s && ln -sfn %s %s", filepath.Dir(RKE2Socket), nd.Socket, RKE2Socket)
	if out, err := exec.CommandContext(ctx, mustLook("nsenter"), "-t", pid, "-m", "--", "sh", "-c", link).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("node %s: RKE2's socket path: %w: %s", nd.Name, err, out)
	}
	cmd := exec.CommandContext(ctx, mustLook("nsenter"), "-t", pid, "-m", "-n", "--wd="+dir, "--", "bash", "-o", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	return cmd, nil
}
