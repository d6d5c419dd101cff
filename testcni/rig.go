package testcni

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	wbclient "github.com/k8snetworkplumbingwg/whereabouts/pkg/generated/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/go-logr/logr"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/install/standin"
)

// PoolNamespace is where the rig's whereabouts keeps its pools.
const PoolNamespace = "kube-system"

// Whereabouts versions the rig can delegate to.
const (
	// V093 is what Harvester's current chart ships: its DEL matches the
	// container ID and the ifname.
	V093 = "v0.9.3"
	// V092 is what Harvester v1.7.0 to v1.7.2 ship (RKE2's
	// hardened-whereabouts v0.9.2): v0.9.3's plugin, pod controller and
	// reconciler but a log line (cmd, pkg/allocate, pkg/storage and
	// pkg/config are unchanged between them; its generated clientset and
	// its reconciler's "could not read file" message differ).
	V092 = "v0.9.2"
	// V094 is whereabouts' next release: v0.9.3's allocator, DEL and Lease;
	// its reconciler runs as a Deployment of its own.
	V094 = "v0.9.4"
	// V080 is the first to hand a recreated sandbox the address its pod and
	// ifname held; its DEL matches the container ID only.
	V080 = "v0.8.0"
	// V070 is what Harvester's 2024 releases ship: no ifname in allocations,
	// a new address for every sandbox.
	V070 = "v0.7.0"
)

// Delegates are the whereabouts versions the end-to-end suite runs on.
var Delegates = []string{V094, V093, V092, V080, V070}

// Allocators are the Delegates whose CNI binary allocates and releases
// differently. v0.9.2's is v0.9.3's (see V092). v0.9.4's is v0.9.3's too:
// cmd/whereabouts, pkg/allocate and pkg/storage are unchanged, and pkg/config only gives its "IPAM config
// missing 'ipam' key" error a type; what changed is its pod controller, its
// reconciler (a Deployment of its own), its node-slice controller and its
// install-cni.sh. A test of harvester-ipam under load, crashes or outages
// runs on these; on v0.9.4 too it would only repeat v0.9.3.
var Allocators = []string{V093, V080, V070}

// Options tune a rig.
type Options struct {
	// Progress receives what the rig is doing while it starts; nil is stderr.
	Progress io.Writer
	// Crashpoints also builds harvester-ipam with the crashpoints tag.
	Crashpoints bool
	// NoWebhook leaves Harvester's network webhook out (it judges every NAD
	// otherwise, as on Harvester).
	NoWebhook bool
	// ToolSet is the set of tools.sh's tools the rig may run (EnsureToolSet):
	// "" all of them, "demo" what make demo runs.
	ToolSet string
}

// Rig is a running rig. Start one with Start; Close it when done.
type Rig struct {
	Root       string // the repository
	Dir        string // everything the rig writes
	Tools      Tools
	Kubeconfig string // admin kubeconfig; its context's namespace is PoolNamespace
	FlatFile   string // the whereabouts flat file the networks name
	// Default is the tenant of PoolNamespace, Kubeconfig and FlatFile: where
	// a Network without a Tenant of its own lives.
	Default    *Tenant
	NetConfDir string // cnitool's NETCONFPATH
	Kube       kubernetes.Interface
	WB         wbclient.Interface
	Dynamic    dynamic.Interface

	cluster  *cluster
	webhook  *proc             // Harvester's network webhook, unless Options.NoWebhook
	progress io.Writer         // where the rig says what it does
	bin      string            // the harvester-ipam binaries built for this rig
	cniPaths map[string]string // whereabouts version -> CNI_PATH
	crashBin string            // dir with the crashpoints build of harvester-ipam
	// agentOnce builds harvester-ipam-agent on the first StartAgent.
	agentOnce sync.Once
	agentErr  error
	// agentCrashOnce builds its crashpoints build on the first that wants it.
	agentCrashOnce sync.Once
	agentCrashErr  error
	// chartRoles are the tenants' identities' rules, read on first use.
	chartRoles chartRoles
	// parent is the rig whose cluster of its own this is: it builds the
	// agent's binaries once for both.
	parent *Rig

	// machine is the network namespace of a cluster of the rig's own
	// (StartCluster); nil for the rig's own cluster.
	machine *machine
	// controllers are kube-controller-manager and kube-scheduler, which a
	// cluster of the rig's own runs.
	controllers []*proc

	mu       sync.Mutex
	agents   []*Agent        // node agents, killed with the rig
	netns    map[string]bool // sandboxes' namespaces still to delete
	parts    []*WhereaboutsParts
	clusters []*Rig // clusters of its own, closed with it
	closed   bool   // Close has run
	counter  int
}

// Start builds what is missing and starts a rig.
func Start(ctx context.Context, opt Options) (r *Rig, err error) {
	progress := opt.Progress
	if progress == nil {
		progress = os.Stderr
	}
	// client-go's discovery cache complains, to stderr, about the CRDs it is
	// asked to map before they serve; the rig waits for them itself.
	klog.SetLogger(logr.Discard())
	if os.Getenv(isolatedEnv) != "1" {
		return nil, fmt.Errorf("call testcni.Isolate() first: the rig runs only in a network namespace of its own")
	}
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if err != nil {
		return nil, err
	}
	tools, err := EnsureToolSet(root, opt.ToolSet, progress)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "harvester-ipam-rig-")
	if err != nil {
		return nil, err
	}
	rig := &Rig{Root: root, Dir: dir, Tools: tools, netns: map[string]bool{}, cniPaths: map[string]string{}, progress: progress}
	r = rig
	defer func() {
		if err != nil {
			rig.Close() // r itself is nil by now
		}
	}()

	bin := filepath.Join(dir, "build")
	r.bin = bin
	if err := r.build(ctx, filepath.Join(bin, "harvester-ipam"), "./cmd/harvester-ipam"); err != nil {
		return nil, err
	}
	if err := r.build(ctx, filepath.Join(bin, "harvester-ipam-reconciler"), "./cmd/harvester-ipam-reconciler"); err != nil {
		return nil, err
	}
	if opt.Crashpoints {
		r.crashBin = filepath.Join(dir, "build-crashpoints")
		if err := r.build(ctx, filepath.Join(r.crashBin, "harvester-ipam"), "./cmd/harvester-ipam", "-tags=crashpoints"); err != nil {
			return nil, err
		}
	}
	for _, v := range Delegates {
		d := filepath.Join(dir, "cni", v)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		links := map[string]string{
			"bridge": tools["bridge"], "host-local": tools["host-local"],
			"whereabouts": tools["whereabouts-"+v], "harvester-ipam": filepath.Join(bin, "harvester-ipam"),
			"multus": tools["multus"],
		}
		for name, target := range links {
			if err := os.Symlink(target, filepath.Join(d, name)); err != nil {
				return nil, err
			}
		}
		r.cniPaths[v] = d
		// The same, but whereabouts swallows DEL: for networks with SwallowDel.
		delete(links, "whereabouts")
		if r.cniPaths[v+swallowDel], err = swallowingCNIDir(d+swallowDel, links, tools["whereabouts-"+v]); err != nil {
			return nil, err
		}
		// harvester-ipam standing in for whereabouts, as the chart's DaemonSet
		// leaves a node: at the name whereabouts, the real one (or the
		// swallowing wrapper) beside it at standin.Aside.
		for _, crash := range []bool{false, true} {
			for _, swallow := range []bool{false, true} {
				if crash && r.crashBin == "" {
					continue
				}
				key, self := v+standInKey, filepath.Join(bin, "harvester-ipam")
				if crash {
					key, self = key+crashKey, filepath.Join(r.crashBin, "harvester-ipam")
				}
				if swallow {
					key += swallowDel
				}
				if r.cniPaths[key], err = standInDir(filepath.Join(dir, "cni", key), links, self, tools["whereabouts-"+v], swallow); err != nil {
					return nil, err
				}
			}
		}
	}

	fmt.Fprintf(progress, "rig: starting etcd and kube-apiserver in %s\n", dir)
	if r.cluster, err = startCluster(ctx, dir, tools, clusterOptions{}); err != nil {
		return nil, err
	}
	r.Default = &Tenant{Name: "default", PoolNamespace: PoolNamespace, PodNamespace: "longhorn-system", rig: r}
	if err := r.Default.write(dir, r.cluster.kubeconfig(PoolNamespace)); err != nil {
		return nil, err
	}
	r.Kubeconfig, r.FlatFile = r.Default.Kubeconfig, r.Default.FlatFile
	if err := r.connect(); err != nil {
		return nil, err
	}
	if err := r.installCRDs(ctx); err != nil {
		return nil, err
	}
	if err := r.InstallNADCRD(ctx); err != nil {
		return nil, err
	}
	if !opt.NoWebhook {
		if err := r.startWebhook(ctx); err != nil {
			return nil, err
		}
	}
	r.NetConfDir = filepath.Join(dir, "net.d")
	if err := os.MkdirAll(r.NetConfDir, 0o755); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Rig) build(ctx context.Context, out, pkg string, flags ...string) error {
	args := append([]string{"build", "-trimpath", "-o", out}, flags...)
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = r.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func (r *Rig) connect() error {
	rc, err := clientcmd.BuildConfigFromFlags("", r.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 500, 1000
	if r.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	if r.WB, err = wbclient.NewForConfig(rc); err != nil {
		return err
	}
	r.Dynamic, err = dynamic.NewForConfig(rc)
	return err
}

// WhereaboutsCRDFiles are the files of whereabouts' IPPool and ORIP CRDs in
// a version's doc/crds (the tools cache's whereabouts-crds-<version>).
var WhereaboutsCRDFiles = []string{"whereabouts.cni.cncf.io_ippools.yaml", "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml"}

// installCRDs installs whereabouts' own IPPool and ORIP CRDs of a version,
// the newest delegate's unless given (from v0.8.0 on they are the same;
// v0.7.0's reservation requires a containerid and neither of its kinds has
// an ifname, which the API server prunes). The tools cache holds them:
// inside the rig's namespace no module is fetched.
func (r *Rig) installCRDs(ctx context.Context, version ...string) error {
	v := Delegates[0]
	if len(version) > 0 && version[0] != "" {
		v = version[0]
	}
	crds := r.Tools["whereabouts-crds-"+v]
	for _, f := range WhereaboutsCRDFiles {
		b, err := os.ReadFile(filepath.Join(crds, f))
		if err != nil {
			return fmt.Errorf("whereabouts %s's CRD (testcni/tools.sh whereabouts-%s copies them): %w", v, v, err)
		}
		if err := r.Apply(ctx, b, false); err != nil {
			return fmt.Errorf("install %s: %w", f, err)
		}
	}
	// The CRDs serve once established.
	var err1, err2 error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err1 = r.WB.WhereaboutsV1alpha1().IPPools(PoolNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		_, err2 = r.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(PoolNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		return err1 == nil && err2 == nil, nil
	})
	if err != nil {
		return fmt.Errorf("whereabouts CRDs not served: %w (%v; %v)", err, err1, err2)
	}
	return nil
}

// EnsureNamespace creates a namespace if it does not exist. In a cluster of
// the rig's own it also waits for the namespace's default ServiceAccount,
// which the controller manager makes and without which the ServiceAccount
// admission plugin refuses its pods.
func (r *Rig) EnsureNamespace(ctx context.Context, name string) error {
	_, err := r.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if r.machine == nil {
		return nil
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = r.Kube.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s has no default ServiceAccount: %w (%v)", name, err, last)
	}
	return nil
}

// StopAPIServer stops kube-apiserver (etcd keeps the data); StartAPIServer brings it back.
func (r *Rig) StopAPIServer() { r.cluster.StopAPIServer() }

func (r *Rig) StartAPIServer(ctx context.Context) error { return r.cluster.StartAPIServer(ctx) }

// APIServerURL is where kube-apiserver listens.
func (r *Rig) APIServerURL() string { return r.cluster.URL() }

// Close stops the servers, deletes the sandboxes' namespaces and the rig's files.
func (r *Rig) Close() {
	r.mu.Lock()
	r.closed = true
	for ns := range r.netns {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	r.netns = map[string]bool{}
	parts, clusters, agents := r.parts, r.clusters, r.agents
	r.parts, r.clusters, r.agents = nil, nil, nil
	r.mu.Unlock()
	for _, a := range agents {
		_ = a.Resume()
		a.Kill()
	}
	for _, c := range clusters {
		c.Close()
	}
	for _, w := range parts {
		w.Stop()
	}
	for _, p := range r.controllers {
		p.stop(5 * time.Second)
	}
	if r.webhook != nil {
		r.webhook.stop(5 * time.Second)
	}
	if r.cluster != nil {
		r.cluster.stop()
	}
	r.machine.close()
	if os.Getenv("HARVESTER_IPAM_RIG_KEEP") == "" {
		os.RemoveAll(r.Dir)
	}
}

// swallowDel keys the CNI_PATH of a version whose whereabouts swallows DEL;
// standInKey one where harvester-ipam stands in for whereabouts, crashKey
// with its crashpoints build.
const (
	swallowDel = "+swallow-del"
	standInKey = "+stand-in"
	crashKey   = "+crashpoints"
)

// standInDir makes dir a CNI_PATH of links where harvester-ipam (self) is at
// whereabouts' name and the real whereabouts wb, or its DEL-swallowing
// wrapper, at standin.Aside.
func standInDir(dir string, links map[string]string, self, wb string, swallow bool) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	name := filepath.Join(dir, "whereabouts")
	if err := os.Symlink(self, name); err != nil {
		return "", err
	}
	if swallow {
		return dir, writeSwallowingWhereabouts(standin.Aside(name), wb)
	}
	return dir, os.Symlink(wb, standin.Aside(name))
}

// swallowingCNIDir makes dir a CNI_PATH of links whose whereabouts is
// writeSwallowingWhereabouts' wrapper around wb.
func swallowingCNIDir(dir string, links map[string]string, wb string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	if err := writeSwallowingWhereabouts(filepath.Join(dir, "whereabouts"), wb); err != nil {
		return "", fmt.Errorf("swallowing whereabouts in %s: %w", dir, err)
	}
	return dir, nil
}

// PoolName is the IPPool of a network's range.
func (n *Network) PoolName() string { return names.Pool(n.Range, n.NetworkName) }

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
