package testcni

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
)

// Run is what a command printed and how it exited.
type Run struct {
	Stdout, Stderr string
	Exit           int
}

// Plugin runs the harvester-ipam binary as a runtime or a delegating main
// plugin would: CNI_* variables in env, the network config on stdin. The
// network's CNI_PATH is set, so the plugin finds its delegate.
func (r *Rig) Plugin(ctx context.Context, n *Network, env []string, stdin []byte) (Run, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, "harvester-ipam"))
	cmd.Env = append(append(os.Environ(), "CNI_PATH="+n.cniPath()), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	return run(cmd)
}

// Reconciler runs harvester-ipam-reconciler against the rig's API server;
// args are its own ("inspect", "--grace", "--dry-run", ...).
func (r *Rig) Reconciler(ctx context.Context, args ...string) (Run, error) {
	common := []string{"--kubeconfig", r.Kubeconfig, "--namespace", PoolNamespace}
	if len(args) > 0 && args[0] == "inspect" {
		args = append(append([]string{"inspect"}, common...), args[1:]...)
	} else {
		args = append(common, args...)
	}
	return run(exec.CommandContext(ctx, filepath.Join(r.bin, "harvester-ipam-reconciler"), args...))
}

// run runs a command; a non-zero exit is in Run.Exit, not an error.
func run(cmd *exec.Cmd) (Run, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Run{Stdout: stdout.String(), Stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.Exit = ee.ExitCode()
		err = nil
	}
	return res, err
}
