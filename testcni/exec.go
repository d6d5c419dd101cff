package testcni

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
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
	cmd := exec.CommandContext(ctx, r.PluginBinary())
	cmd.Env = append(append(append(os.Environ(), "CNI_PATH="+n.cniPath()), n.agentEnv()...), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	return run(cmd)
}

// Reconciler runs harvester-ipam-reconciler against the rig's default
// tenant; args are its own ("inspect", "--grace", "--dry-run", ...).
func (r *Rig) Reconciler(ctx context.Context, args ...string) (Run, error) {
	return r.reconciler(ctx, r.Kubeconfig, PoolNamespace, args...)
}

func (r *Rig) reconciler(ctx context.Context, kubeconfig, namespace string, args ...string) (Run, error) {
	common := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	if len(args) > 0 && args[0] == "inspect" {
		args = append(append([]string{"inspect"}, common...), args[1:]...)
	} else {
		args = append(common, args...)
	}
	return run(exec.CommandContext(ctx, r.ReconcilerBinary(), args...))
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

// Measured is one timed run of a plugin process.
type Measured struct {
	Run
	Wall time.Duration
	// PeakRSS is the process's own high-water mark (VmHWM), sampled from
	// /proc while it runs (ExecPeak only): wait4's maxrss would include its
	// delegate's.
	PeakRSS int64 // KiB
}

// Exec runs a CNI plugin binary directly, as the runtime execs it, with the
// CNI_* variables in env and the config on stdin, and times it. It samples
// nothing while the process runs: reading /proc/PID/status every 200 µs
// slowed the process being timed (whereabouts' DEL by about 15 ms of 108,
// harvester-ipam's by 3), so memory is measured in runs of its own.
func Exec(ctx context.Context, bin string, env []string, stdin []byte) (Measured, error) {
	return execMeasured(ctx, bin, env, stdin, false)
}

// ExecPeak is Exec that also samples the process's peak RSS; its Wall is
// not a latency to report.
func ExecPeak(ctx context.Context, bin string, env []string, stdin []byte) (Measured, error) {
	return execMeasured(ctx, bin, env, stdin, true)
}

func execMeasured(ctx context.Context, bin string, env []string, stdin []byte, sample bool) (Measured, error) {
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Measured{}, err
	}
	peak := make(chan int64, 1)
	stop := make(chan struct{})
	if sample {
		go func() {
			var hwm int64
			path := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
			for {
				if v := vmHWM(path); v > hwm {
					hwm = v
				}
				select {
				case <-stop:
					peak <- hwm
					return
				case <-time.After(200 * time.Microsecond):
				}
			}
		}()
	} else {
		peak <- 0
	}
	err := cmd.Wait()
	wall := time.Since(start)
	close(stop)
	m := Measured{Run: Run{Stdout: stdout.String(), Stderr: stderr.String()}, Wall: wall, PeakRSS: <-peak}
	if ee, ok := err.(*exec.ExitError); ok {
		m.Exit = ee.ExitCode()
		err = nil
	}
	return m, err
}

func vmHWM(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
