// Package delegate runs the delegate IPAM plugin (whereabouts) for ADD,
// started before its config is ready.
//
// A CNI plugin built on skel reads its whole config from stdin before it does
// anything else, and whereabouts does nothing before skel. So its process can
// be started as soon as harvester-ipam knows which binary it is: its start-up
// (exec, runtime, package init of a binary three times the plugin's size)
// then runs while harvester-ipam builds its client, writes its checkpoint and
// releases earlier sandboxes, and nothing is allocated until the config is
// written, after all of that.
package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/harvester/harvester-ipam/install/standin"
)

// Early is an invoke.Exec that finds delegates with Find, and whose next run of the plugin it was started for,
// with the same environment, is that process: ExecPlugin writes the config to
// it and waits. Any other run, or every run when the start failed, is
// invoke's own. The zero value runs everything as invoke does.
type Early struct {
	version.PluginDecoder

	// stderr receives the plugin's stderr, as invoke's RawExec passes it on.
	stderr io.Writer
	// orphanless kills the plugins it runs with the process that runs them.
	orphanless bool
	name       string   // the plugin Start looked up,
	paths      []string // on these directories,
	path       string   // and found here
	env        []string
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	out        bytes.Buffer
	errOut     bytes.Buffer
}

// Start starts the plugin named name, found on CNI_PATH by Find, for a
// CNI_COMMAND of command, bound to ctx. A failure to start
// is not an error here: the run at ExecPlugin then execs it as invoke does
// and reports what fails.
func Start(ctx context.Context, name, command string, stderr io.Writer) *Early {
	return StartIn(ctx, name, command, nil, stderr)
}

// StartIn is Start in the environment env (nil: this process's own): its
// CNI_PATH, and every variable the delegate inherits.
func StartIn(ctx context.Context, name, command string, env []string, stderr io.Writer) *Early {
	e := &Early{stderr: stderr}
	paths := filepath.SplitList(Getenv(env, "CNI_PATH"))
	path, err := Find(name, paths)
	if err != nil {
		return e
	}
	env = commandEnv(env, command)
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = guarded(env)
	cmd.Stdout, cmd.Stderr = &e.out, &e.errOut
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return e
	}
	if err := cmd.Start(); err != nil {
		_ = stdin.Close()
		return e
	}
	e.name, e.paths, e.path, e.env, e.cmd, e.stdin = name, paths, path, env, cmd, stdin
	return e
}

// Plain is an Early with no process started: it finds delegates with Find
// and runs them as invoke does.
func Plain(stderr io.Writer) *Early { return &Early{stderr: stderr} }

// Orphanless is Plain whose plugins die with the process that runs them
// (PR_SET_PDEATHSIG): a node agent killed midway must leave no delegate
// going on with a verb that its client, seeing the agent gone, does again.
func Orphanless(stderr io.Writer) *Early { return &Early{stderr: stderr, orphanless: true} }

// Started says whether a process waits for its config.
func (e *Early) Started() bool { return e.cmd != nil }

// Abandon ends a started process that will not be given its config: killed
// before it reads a byte, it has done nothing. Idempotent; a no-op once
// ExecPlugin has used the process.
func (e *Early) Abandon() {
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Kill()
	_ = e.stdin.Close()
	_ = e.cmd.Wait()
	e.cmd = nil
}

// ExecPlugin runs the plugin as invoke's RawExec does, on the started
// process when it was started for this path and environment.
func (e *Early) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	if e.cmd == nil || pluginPath != e.path || !sameEnv(environ, e.env) {
		e.Abandon()
		if e.orphanless {
			return runOrphanless(ctx, pluginPath, stdinData, guarded(environ), e.stderr)
		}
		return (&invoke.RawExec{Stderr: e.stderr}).ExecPlugin(ctx, pluginPath, stdinData, guarded(environ))
	}
	cmd := e.cmd
	e.cmd = nil
	// The config is small, but a pipe is a pipe: write it beside the wait, so
	// a plugin that exits without reading cannot block us.
	// A plugin that exits without reading it says why in its exit (below).
	wrote := make(chan struct{})
	go func() {
		_, _ = e.stdin.Write(stdinData)
		_ = e.stdin.Close()
		close(wrote)
	}()
	err := cmd.Wait()
	<-wrote
	if err != nil {
		return nil, pluginErr(err, e.out.Bytes(), e.errOut.Bytes())
	}
	if e.stderr != nil {
		_, _ = e.errOut.WriteTo(e.stderr) // nothing written when it said nothing
	}
	return e.out.Bytes(), nil
}

// sameEnv says whether two environments hold the same variables: invoke
// builds one from a map (dedupEnv), so its order differs from call to call.
func sameEnv(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// FindInPath finds a plugin with Find; the started one (invoke looks it up
// again before it runs it) is where Start found it.
func (e *Early) FindInPath(plugin string, paths []string) (string, error) {
	if e.cmd != nil && plugin == e.name && slices.Equal(paths, e.paths) {
		return e.path, nil
	}
	return Find(plugin, paths)
}

// guarded is a delegate's environment, marked so that a harvester-ipam run
// as its own delegate knows it. The mark is also how the installer tells
// any build of harvester-ipam from the real binary: every build carries it.
func guarded(env []string) []string {
	return append(slices.Clip(env), standin.Mark)
}

// pluginErr is the error of a plugin that failed, as invoke's RawExec makes
// it: the CNI error the plugin printed, or its stderr when it printed none.
func pluginErr(err error, stdout, stderr []byte) error {
	emsg := types.Error{}
	if len(stdout) == 0 {
		if len(stderr) == 0 {
			emsg.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
		} else {
			emsg.Msg = fmt.Sprintf("netplugin failed: %q", string(stderr))
		}
	} else if perr := json.Unmarshal(stdout, &emsg); perr != nil {
		emsg.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", string(stdout), perr)
	}
	return &emsg
}

// runOrphanless runs a plugin as invoke's RawExec does (its stderr passed
// on, its failure read as RawExec reads it, a "text file busy" retried each
// second up to five times), killed when the thread that started it dies.
func runOrphanless(ctx context.Context, path string, stdin []byte, env []string, stderr io.Writer) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		var out, errOut bytes.Buffer
		c := exec.CommandContext(ctx, path)
		c.Env = env
		c.Stdin = bytes.NewReader(stdin)
		c.Stdout, c.Stderr = &out, &errOut
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err := c.Run()
		if err != nil && strings.Contains(err.Error(), "text file busy") && attempt < 5 {
			time.Sleep(time.Second)
			continue
		}
		if err != nil {
			return nil, pluginErr(err, out.Bytes(), errOut.Bytes())
		}
		if stderr != nil && errOut.Len() > 0 {
			_, _ = errOut.WriteTo(stderr)
		}
		return out.Bytes(), nil
	}
}
