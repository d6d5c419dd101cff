package testcni

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
)

// WhereaboutsParts are whereabouts' own controllers as Harvester runs them
// beside the CNI binary: ip-control-loop (the pod controller, and before
// v0.9.4 the periodic reconciler too) from its DaemonSet, and from v0.9.4
// the reconciler from its Deployment.
type WhereaboutsParts struct {
	Version string
	procs   map[string]*proc // "ip-control-loop", "reconciler"
	rig     *Rig
	stop    sync.Once
}

// PartsOptions say how to run whereabouts' parts.
type PartsOptions struct {
	// Version is the whereabouts version whose parts run (V070 ... V094).
	Version string
	// Node is the DaemonSet pod's node (NODENAME): ip-control-loop looks it
	// up at start and watches only that node's pods.
	Node string
	// Tenant's pool namespace is the DaemonSet's namespace
	// (WHEREABOUTS_NAMESPACE: where the pod controller reads pools).
	Tenant *Tenant
	// Cron is the whereabouts-config ConfigMap's cron-expression (five
	// fields, so at most one run a minute); empty is its default.
	Cron string
}

// DefaultCron is the whereabouts-config ConfigMap's cron-expression in
// whereabouts' own manifests (doc/crds/daemonset-install.yaml).
const DefaultCron = "30 4 * * *"

// StartWhereaboutsParts runs whereabouts' parts of opt.Version against the
// rig's API server, each as its container does: a root of its own (chroot)
// holding the binary at the image's path, the service account's token and
// CA for in-cluster config, the host's CNI dir at /host/etc/cni/net.d with
// the flat file and kubeconfig install-cni.sh writes, and the ConfigMap's
// cron-expression at /cron-schedule/config; the environment and arguments
// of doc/crds/daemonset-install.yaml (and reconciler-deployment.yaml). They
// are stopped by Stop or with the rig.
func (r *Rig) StartWhereaboutsParts(ctx context.Context, opt PartsOptions) (*WhereaboutsParts, error) {
	if opt.Tenant == nil {
		opt.Tenant = r.Default
	}
	if opt.Cron == "" {
		opt.Cron = DefaultCron
	}
	if opt.Node == "" {
		return nil, fmt.Errorf("whereabouts %s parts: a node name (NODENAME) is needed", opt.Version)
	}
	type part struct{ name, tool, path string }
	parts := []part{{"ip-control-loop", "ip-control-loop-" + opt.Version, "/ip-control-loop"}}
	if AtLeast(opt.Version, V094) {
		parts = append(parts, part{"reconciler", "whereabouts-reconciler-" + opt.Version, "/ip-reconciler"})
	}
	w := &WhereaboutsParts{Version: opt.Version, procs: map[string]*proc{}, rig: r}
	for _, p := range parts {
		bin := r.Tools[p.tool]
		if st, err := os.Stat(bin); bin == "" || err != nil || st.Mode()&0o111 == 0 {
			w.Stop()
			return nil, fmt.Errorf("whereabouts %s %s: no binary %q (testcni/tools.sh %s builds it)", opt.Version, p.name, bin, p.tool)
		}
		dir := filepath.Join(r.Dir, "wbparts", opt.Tenant.Name+"-"+opt.Version+"-"+p.name)
		root := filepath.Join(dir, "root")
		if err := r.partRoot(root, bin, p.path, opt); err != nil {
			w.Stop()
			return nil, fmt.Errorf("whereabouts %s %s: %w", opt.Version, p.name, err)
		}
		env := []string{
			"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=" + strconv.Itoa(r.cluster.apiPort),
			"WHEREABOUTS_NAMESPACE=" + opt.Tenant.PoolNamespace,
		}
		if p.name == "ip-control-loop" {
			env = append(env, "NODENAME="+opt.Node)
		}
		pr, err := startProcIn(dir, p.name, root, p.path, env, "-log-level", "debug")
		if err != nil {
			w.Stop()
			return nil, err
		}
		w.procs[p.name] = pr
	}
	r.mu.Lock()
	r.parts = append(r.parts, w)
	r.mu.Unlock()
	// ip-control-loop syncs its informers before it handles a deletion: wait
	// for that, so that a pod deleted next is seen.
	if err := w.WaitLog(ctx, "ip-control-loop", "starting network controller", 1, 60*time.Second); err != nil {
		w.Stop()
		return nil, err
	}
	return w, nil
}

// AtLeast says whether whereabouts version v is min or later.
func AtLeast(v, min string) bool {
	pv, err := version.ParseSemantic(v)
	if err != nil {
		return false
	}
	return pv.AtLeast(version.MustParseSemantic(min))
}

// partRoot lays out a container's root for one part.
func (r *Rig) partRoot(root, bin, path string, opt PartsOptions) error {
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	if err := copyFile(bin, filepath.Join(root, path), 0o755); err != nil {
		return err
	}
	ca, err := os.ReadFile(r.cluster.caFile)
	if err != nil {
		return err
	}
	sa := filepath.Join(root, "var/run/secrets/kubernetes.io/serviceaccount")
	// The rig's one identity is its admin token: whereabouts' ClusterRole is
	// not what is under test here.
	files := map[string][]byte{
		filepath.Join(sa, "token"):                     []byte(r.cluster.token),
		filepath.Join(sa, "ca.crt"):                    ca,
		filepath.Join(sa, "namespace"):                 []byte(opt.Tenant.PoolNamespace),
		filepath.Join(root, "cron-schedule", "config"): []byte(opt.Cron + "\n"),
	}
	// What install-cni.sh writes on the host, seen by the container under /host.
	wbd := filepath.Join(root, "host/etc/cni/net.d/whereabouts.d")
	flat, _ := json.Marshal(map[string]any{
		"datastore":                  "kubernetes",
		"kubernetes":                 map[string]string{"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
		"reconciler_cron_expression": opt.Cron,
	})
	files[filepath.Join(wbd, "whereabouts.conf")] = flat
	kc := strings.Replace(r.cluster.kubeconfig(opt.Tenant.PoolNamespace), "certificate-authority: "+r.cluster.caFile,
		"certificate-authority-data: "+base64.StdEncoding.EncodeToString(ca), 1)
	files[filepath.Join(wbd, "whereabouts.kubeconfig")] = []byte(kc)
	for p, b := range files {
		if err := writeFile(p, b); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(root, "tmp"), 0o1777)
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// startProcIn starts path inside root (chroot), its log in dir.
func startProcIn(dir, name, root, path string, env []string, args ...string) (*proc, error) {
	p, err := startProcWith(dir, name, path, func(a *syscall.SysProcAttr) { a.Chroot = root }, env, args...)
	if err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, root, err)
	}
	return p, nil
}

// Stop stops the parts (SIGTERM, then SIGKILL); once, whoever calls it.
func (w *WhereaboutsParts) Stop() {
	if w == nil {
		return
	}
	w.stop.Do(func() {
		for _, p := range w.procs {
			p.stop(5 * time.Second)
		}
	})
}

// Log is what a part ("ip-control-loop", "reconciler") wrote so far.
func (w *WhereaboutsParts) Log(part string) string {
	p := w.procs[part]
	if p == nil {
		return ""
	}
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Pid is a part's process ID (0: no such part), for what it costs (its
// /proc/PID/stat and status).
func (w *WhereaboutsParts) Pid(part string) int {
	p := w.procs[part]
	if p == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running says whether a part is still running.
func (w *WhereaboutsParts) Running(part string) bool {
	p := w.procs[part]
	return p != nil && !p.exited()
}

// WaitLog waits until a part's log holds s at least n times.
func (w *WhereaboutsParts) WaitLog(ctx context.Context, part, s string, n int, limit time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		if !w.Running(part) {
			return false, fmt.Errorf("whereabouts %s %s exited", w.Version, part)
		}
		return strings.Count(w.Log(part), s) >= n, nil
	})
	if err != nil {
		return fmt.Errorf("whereabouts %s %s: %q not logged %d times: %w; its log ends:\n%s", w.Version, part, s, n, err, lastLines(w.Log(part), 30))
	}
	return nil
}
