package delegate

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

// A delegate runs in an environment: the variables it inherits, CNI_PATH
// (where it is found) and the CNI_* variables of the verb among them. The
// plugin's own is its process's; a node agent serves many runtimes' verbs
// at once, each in the environment its request carried. invoke's
// DelegateAdd and its kin read os.Environ() and CNI_PATH from the process:
// Add and Run are them with the environment given, nil meaning the
// process's own, so that they then do exactly what invoke does.

// Getenv is the variable key of env (nil: the process's environment).
func Getenv(env []string, key string) string {
	if env == nil {
		return os.Getenv(key)
	}
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val // the last one wins, as in dedupEnv
		}
	}
	return v
}

// commandEnv is env (nil: the process's) with CNI_COMMAND set to command,
// each variable once, the later value winning: what invoke.DelegateArgs
// gives a delegate.
func commandEnv(env []string, command string) []string {
	if env == nil {
		env = os.Environ()
	}
	return dedupEnv(append(slices.Clip(env), "CNI_COMMAND="+command))
}

// dedupEnv keeps the last value of each variable, as invoke's does.
func dedupEnv(env []string) []string {
	last := map[string]int{}
	for i, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok {
			last[k] = i
		}
	}
	out := make([]string, 0, len(env))
	for i, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}

// cniArgs gives invoke a fixed environment.
type cniArgs []string

func (a cniArgs) AsEnv() []string { return a }

func find(name string, exec invoke.Exec, env []string) (string, error) {
	return exec.FindInPath(name, filepath.SplitList(Getenv(env, "CNI_PATH")))
}

// Add is invoke.DelegateAdd in env; exec must not be nil (Plain, an
// Early, or a test's).
func Add(ctx context.Context, name string, netconf []byte, exec invoke.Exec, env []string) (types.Result, error) {
	path, err := find(name, exec, env)
	if err != nil {
		return nil, err
	}
	return invoke.ExecPluginWithResult(ctx, path, netconf, cniArgs(commandEnv(env, "ADD")), exec)
}

// Run is invoke.DelegateDel, DelegateCheck, DelegateGC or DelegateStatus
// (by command) in env.
func Run(ctx context.Context, name, command string, netconf []byte, exec invoke.Exec, env []string) error {
	path, err := find(name, exec, env)
	if err != nil {
		return err
	}
	return invoke.ExecPluginWithoutResult(ctx, path, netconf, cniArgs(commandEnv(env, command)), exec)
}
