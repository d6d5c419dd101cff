package testcni

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// RunWhereaboutsInstall runs whereabouts' own install step of a version (its
// script/install-cni.sh, which its DaemonSet runs at every start of its pod)
// for a node whose CNI bin and conf dirs are hostBin and hostConf: it writes
// the flat file and kubeconfig under hostConf/whereabouts.d and runs
// `cp -f /whereabouts $CNI_BIN_DIR`. The script runs as it is but for the
// paths only its container has (/whereabouts, /lib.sh, the service account
// dir), which point at the rig's files, and SLEEP=false, so that it returns
// instead of sleeping as the container does. It returns the script's output.
func (r *Rig) RunWhereaboutsInstall(ctx context.Context, version, hostBin, hostConf string) (string, error) {
	src := r.Tools["whereabouts-script-"+version]
	work, err := os.MkdirTemp(r.Dir, "whereabouts-install-"+version+"-")
	if err != nil {
		return "", err
	}
	sa := filepath.Join(work, "serviceaccount")
	if err := os.MkdirAll(sa, 0o755); err != nil {
		return "", err
	}
	if err := writeFile(filepath.Join(sa, "token"), []byte(r.cluster.token)); err != nil {
		return "", err
	}
	if err := copyFile(r.cluster.caFile, filepath.Join(sa, "ca.crt"), 0o644); err != nil {
		return "", err
	}
	subst := func(name string, must []string, pairs ...string) error {
		b, err := os.ReadFile(filepath.Join(src, name))
		if os.IsNotExist(err) && len(must) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
		s := string(b)
		for i := 0; i < len(pairs); i += 2 {
			s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
		}
		for _, m := range must {
			if !strings.Contains(s, m) {
				return fmt.Errorf("whereabouts %s's %s no longer has %q: look at what its install step does now", version, name, m)
			}
		}
		return os.WriteFile(filepath.Join(work, name), []byte(s), 0o755)
	}
	const saPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// The container's /whereabouts: cp names the copy by its source's name.
	bin := filepath.Join(work, "whereabouts")
	if err := os.Symlink(r.Tools["whereabouts-"+version], bin); err != nil {
		return "", err
	}
	cp := "cp -f " + bin + " $CNI_BIN_DIR"
	if err := subst("lib.sh", nil, saPath, sa); err != nil {
		return "", err
	}
	if err := subst("install-cni.sh", []string{cp}, "cp -f /whereabouts $CNI_BIN_DIR", cp, "source /lib.sh", "source "+filepath.Join(work, "lib.sh"), saPath, sa); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(work, "install-cni.sh"))
	host, port := r.ServiceHostPort()
	cmd.Env = append(os.Environ(), "CNI_BIN_DIR="+hostBin, "CNI_CONF_DIR="+hostConf, "SLEEP=false",
		"KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port,
		"WHEREABOUTS_NAMESPACE="+PoolNamespace)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("whereabouts %s's install-cni.sh: %w\n%s", version, err, out)
	}
	return string(out), nil
}
