package testcni

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ClusterOptions shape a cluster of the rig's own.
type ClusterOptions struct {
	// Name tells the rig's clusters apart (a short DNS label).
	Name string
	// NoWebhook leaves Harvester's network webhook out.
	NoWebhook bool
	// Controllers are more of the controller manager's controllers to run
	// (e.g. "deployment-controller"): whereabouts' own end-to-end suite
	// scales ReplicaSets and StatefulSets and waits for Deployments.
	Controllers []string
}

// clusterControllers are the controller manager's controllers a cluster of
// the rig's own runs: DaemonSets make their pods, the garbage collector
// deletes the pods of a deleted DaemonSet (helm uninstall), a deleted
// namespace's contents are deleted, each namespace gets its default
// ServiceAccount, and the kube-root-ca.crt ConfigMap that every pod's service
// account token volume projects; Jobs run their pods (helm-controller's). No
// other controller acts on what the tests make (the node lifecycle controller
// would taint a node whose kubelet a test stops, the pod garbage collector
// would delete its pods, the CronJob controller would start the reconciler's
// passes at times of its own).
var clusterControllers = []string{
	"daemonset-controller", "garbage-collector-controller", "namespace-controller",
	"serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"job-controller",
}

// StartCluster starts a Kubernetes cluster of the rig's own, on a machine (a
// network namespace) of its own: etcd, kube-apiserver with its default
// admission plugins, kube-controller-manager, kube-scheduler, a stand-in
// for kube-proxy's one Service (the kubernetes Service's ClusterIP), and,
// unless opt says not, Harvester's network webhook; whereabouts' CRDs and
// the NAD CRD. Its nodes (StartNode with NodeOptions.Kubelet) run a real
// kubelet on that machine. The returned Rig is that cluster's: its clients,
// tenants and nodes; it shares the rig's tools and builds, and closes with
// it.
func (r *Rig) StartCluster(ctx context.Context, opt ClusterOptions) (_ *Rig, err error) {
	if opt.Name == "" {
		return nil, fmt.Errorf("a cluster of the rig's own needs a name")
	}
	for _, tool := range []string{"kube-controller-manager", "kube-scheduler", "kubelet"} {
		if st, err := os.Stat(r.Tools[tool]); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("cluster %s: no %s at %q (testcni/tools.sh kube-node builds it)", opt.Name, tool, r.Tools[tool])
		}
	}
	start := time.Now()
	c := &Rig{
		Root: r.Root, Dir: filepath.Join(r.Dir, "clusters", opt.Name), Tools: r.Tools,
		netns: map[string]bool{}, cniPaths: r.cniPaths, progress: r.progress, bin: r.bin,
	}
	defer func() {
		if err != nil {
			c.Close()
			err = fmt.Errorf("cluster %s: %w", opt.Name, err)
		}
	}()
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if c.machine, err = newMachine(opt.Name); err != nil {
		return nil, err
	}
	if c.cluster, err = startCluster(ctx, c.Dir, r.Tools, clusterOptions{machine: c.machine}); err != nil {
		return nil, err
	}
	c.Default = &Tenant{Name: "default", PoolNamespace: PoolNamespace, PodNamespace: "longhorn-system", rig: c}
	if err := c.Default.write(c.Dir, c.cluster.kubeconfig(PoolNamespace)); err != nil {
		return nil, err
	}
	c.Kubeconfig, c.FlatFile = c.Default.Kubeconfig, c.Default.FlatFile
	if err := c.connect(); err != nil {
		return nil, err
	}
	// The kubernetes Service: pods dial its ClusterIP, port 443.
	if err := c.machine.serve(net.JoinHostPort(KubernetesServiceIP, "443"), strings.TrimPrefix(c.APIServerURL(), "https://")); err != nil {
		return nil, err
	}
	if err := c.startControllers(ctx, opt.Controllers); err != nil {
		return nil, err
	}
	if err := c.installCRDs(ctx); err != nil {
		return nil, err
	}
	if err := c.InstallNADCRD(ctx); err != nil {
		return nil, err
	}
	if !opt.NoWebhook {
		if err := c.startWebhook(ctx); err != nil {
			return nil, err
		}
	}
	c.NetConfDir = filepath.Join(c.Dir, "net.d")
	r.mu.Lock()
	r.clusters = append(r.clusters, c)
	r.mu.Unlock()
	fmt.Fprintf(r.progress, "rig: cluster %s up on %s in %s\n", opt.Name, c.machine.IP, time.Since(start).Round(100*time.Millisecond))
	return c, nil
}

// startControllers starts kube-controller-manager and kube-scheduler on the
// cluster's machine, as the admin, and waits until the controller manager
// has given kube-system its default ServiceAccount and kube-root-ca.crt.
func (c *Rig) startControllers(ctx context.Context, more []string) error {
	sched := filepath.Join(c.Dir, "kube-scheduler.yaml")
	conf := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
`, c.Kubeconfig)
	if err := os.WriteFile(sched, []byte(conf), 0o600); err != nil {
		return err
	}
	kcm, err := c.machine.startProc(c.Dir, "kube-controller-manager", c.Tools["kube-controller-manager"], nil,
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers="+strings.Join(append(slices.Clone(clusterControllers), more...), ","),
		"--root-ca-file="+c.cluster.caFile, "--v=1")
	if err != nil {
		return err
	}
	c.controllers = append(c.controllers, kcm)
	s, err := c.machine.startProc(c.Dir, "kube-scheduler", c.Tools["kube-scheduler"], nil,
		"--config="+sched, "--secure-port=0", "--v=1")
	if err != nil {
		return err
	}
	c.controllers = append(c.controllers, s)
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, p := range c.controllers {
			if p.exited() {
				return false, fmt.Errorf("%s exited; its log ends:\n%s", p.name, p.tail())
			}
		}
		if _, last = c.Kube.CoreV1().ServiceAccounts(PoolNamespace).Get(ctx, "default", metav1.GetOptions{}); last != nil {
			return false, nil
		}
		var cm *corev1.ConfigMap
		if cm, last = c.Kube.CoreV1().ConfigMaps(PoolNamespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); last != nil {
			return false, nil
		}
		return cm.Data["ca.crt"] != "", nil
	})
	if err != nil {
		return fmt.Errorf("the controller manager did not start its controllers: %w (%v); its log ends:\n%s", err, last, c.controllers[0].tail())
	}
	return nil
}

// ServiceHostPort is where a pod of this rig's cluster reaches the API
// server (KUBERNETES_SERVICE_HOST and _PORT): the kubernetes Service on a
// machine, the API server itself on the rig's loopback.
func (r *Rig) ServiceHostPort() (string, string) {
	if r.machine != nil {
		return KubernetesServiceIP, "443"
	}
	return "127.0.0.1", fmt.Sprint(r.cluster.apiPort)
}

// StartCRDCluster starts an API server of the rig's own on the rig's
// loopback (etcd and kube-apiserver, no controllers, no webhook) with
// whereabouts' IPPool and ORIP CRDs of version (CRDs are cluster-wide: one
// API server holds one version of them) and the NAD CRD. Everything the
// rig runs in its own network namespace runs against it as against the
// rig's own: tenants, networks, node agents, whereabouts' parts. It shares
// the rig's tools and builds, and closes with it.
func (r *Rig) StartCRDCluster(ctx context.Context, name, version string) (_ *Rig, err error) {
	if r.Tools["whereabouts-crds-"+version] == "" {
		return nil, fmt.Errorf("cluster %s: no whereabouts %s CRDs in the rig's tools", name, version)
	}
	start := time.Now()
	c := &Rig{
		Root: r.Root, Dir: filepath.Join(r.Dir, "clusters", name), Tools: r.Tools,
		netns: map[string]bool{}, cniPaths: r.cniPaths, progress: r.progress, bin: r.bin, crashBin: r.crashBin, parent: r,
	}
	defer func() {
		if err != nil {
			c.Close()
			err = fmt.Errorf("cluster %s: %w", name, err)
		}
	}()
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if c.cluster, err = startCluster(ctx, c.Dir, r.Tools, clusterOptions{}); err != nil {
		return nil, err
	}
	c.Default = &Tenant{Name: "default", PoolNamespace: PoolNamespace, PodNamespace: "longhorn-system", rig: c}
	if err := c.Default.write(c.Dir, c.cluster.kubeconfig(PoolNamespace)); err != nil {
		return nil, err
	}
	c.Kubeconfig, c.FlatFile = c.Default.Kubeconfig, c.Default.FlatFile
	if err := c.connect(); err != nil {
		return nil, err
	}
	if err := c.installCRDs(ctx, version); err != nil {
		return nil, err
	}
	if err := c.InstallNADCRD(ctx); err != nil {
		return nil, err
	}
	c.NetConfDir = filepath.Join(c.Dir, "net.d")
	if err := os.MkdirAll(c.NetConfDir, 0o755); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.clusters = append(r.clusters, c)
	r.mu.Unlock()
	fmt.Fprintf(r.progress, "rig: cluster %s with whereabouts %s's CRDs up in %s\n", name, version, time.Since(start).Round(100*time.Millisecond))
	return c, nil
}
