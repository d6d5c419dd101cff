// Package testcni is the test rig: a real etcd and kube-apiserver on
// loopback, the real whereabouts and bridge plugins, cnitool, and network
// namespaces as sandboxes, all inside a network and mount namespace of the
// rig's own, so that the host's network and CNI state are untouched.
package testcni

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
)

// isolatedEnv marks a process that already runs in the rig's namespaces.
const isolatedEnv = "HARVESTER_IPAM_RIG_ISOLATED"

// Isolate re-executes the current program in a new network and mount
// namespace and exits with its status; in that child it returns nil after
// making the namespaces usable (loopback up, private /run/netns,
// /var/lib/cni and /run/harvester-ipam). Call it first thing in TestMain or
// main. Everything the rig starts lives and dies with that child: the
// kernel frees the bridge, the veths and the sandboxes' namespaces when it
// exits, even after a crash.
func Isolate() error { return IsolateFor("") }

// IsolateFor is Isolate for a program that runs only a set of the rig's
// tools (EnsureToolSet): it builds that set alone before it isolates.
func IsolateFor(toolSet string) error {
	if os.Getenv(isolatedEnv) == "1" {
		return setupIsolated()
	}
	if os.Geteuid() != 0 {
		return errors.New("the rig needs root: it creates network namespaces, bridges and veths (run as root, as CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("the rig needs the ip command (Debian package iproute2)")
	}
	// Inside the namespace no module proxy can be reached: fetch here what
	// the rig builds and runs there.
	if err := prepareOutside(os.Stderr, toolSet); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// GOPROXY=off: a module missing from the cache fails at once, named,
	// rather than after a dial that cannot work.
	cmd.Env = append(os.Environ(), isolatedEnv+"=1", "GOPROXY=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		if st, ok := exit.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			fmt.Fprintf(os.Stderr, "rig: isolated child killed by %v\n", st.Signal())
			os.Exit(128 + int(st.Signal()))
		}
		os.Exit(exit.ExitCode())
	case err != nil:
		return fmt.Errorf("start in a network namespace of its own: %w", err)
	}
	os.Exit(0)
	return nil
}

func setupIsolated() error {
	// Mounts made here must not leak to the host's mount namespace.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// /run/harvester-ipam is where a node agent's socket is by default: no
	// rig may reach the host's, nor another rig's.
	for _, dir := range []string{"/run/netns", "/var/lib/cni", "/run/harvester-ipam"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := syscall.Mount("rig", dir, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a private %s: %w", dir, err)
		}
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("bring loopback up: %v: %s", err, out)
	}
	return nil
}

// prepareOutside builds the rig's third-party tools and downloads every
// module harvester-ipam's packages and tests need (the rig builds its
// binaries from them), while the network is still the host's. Outside the
// module (a rig binary run elsewhere) there is nothing to fetch.
func prepareOutside(progress io.Writer, toolSet string) error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		return nil
	}
	if _, err := EnsureToolSet(root, toolSet, progress); err != nil {
		return err
	}
	cmd := exec.Command("go", "mod", "download")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("download the modules the rig builds from (go mod download in %s): %v\n%s", root, err, out)
	}
	return nil
}
