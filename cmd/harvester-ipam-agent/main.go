// Command harvester-ipam-agent is harvester-ipam's node agent: it serves the
// plugin's CNI verbs on a unix socket, in-process, with a warm client of the
// API server under its own service account. The plugin hands it each verb
// and does the work itself whenever the agent does not take it.
//
//	harvester-ipam-agent [flags]          serve
//	harvester-ipam-agent probe [flags]    exit 0 when the agent at --socket serves (a readiness probe)
//	harvester-ipam-agent --version
//
// Exit status: 0 stopped (or the probe was served); 1 could not start (or the
// probe was not served); 2 bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/agent"
	"github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/agent/client"
	"github.com/harvester/harvester-ipam/agent/wire"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/crashpoint"
	"github.com/harvester/harvester-ipam/shim"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

type options struct {
	socket      string
	nodeFile    string
	checkpoints string
	namespaces  string
	kubeconfig  string
	node        string
	metricsAddr string
	maxInFlight int
	summary     time.Duration
	checkEvery  time.Duration
	grace       time.Duration
	logRequests bool
	execWB      bool
	nodeConfig  string
	version     bool
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "probe" {
		os.Exit(probe(args[1:]))
	}
	var o options
	fs := flag.NewFlagSet("harvester-ipam-agent", flag.ContinueOnError)
	fs.StringVar(&o.socket, "socket", wire.DefaultSocket, "the unix socket to serve (its directory is made root's only)")
	fs.StringVar(&o.nodeFile, "node-file", wire.NodeFile, "where to tell the plugin the socket's path; empty tells nothing (the plugin then looks at "+wire.DefaultSocket+")")
	fs.StringVar(&o.checkpoints, "checkpoint-dir", conf.DefaultCheckpointDir, "the plugin's checkpoint directory (the one the agent has): made root's only (0700) if it is not; a config naming another is left to the plugin")
	fs.StringVar(&o.namespaces, "namespace", "kube-system", "the pool namespaces to serve, comma-separated (where whereabouts' kubeconfig keeps its IPPools); a config of another is left to the plugin")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the agent's own identity; empty uses the in-cluster service account (never whereabouts')")
	fs.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "the node's name, for the Lease identity of each request; empty: the host name")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9422", "where to serve Prometheus metrics at /metrics; empty serves none")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 256, "requests served at once; beyond, the plugin works alone")
	fs.DurationVar(&o.summary, "summary-interval", time.Minute, "how often to log a line of what was served; 0 never")
	fs.DurationVar(&o.checkEvery, "check-interval", 30*time.Second, "how often to check that the pools answer the agent")
	fs.DurationVar(&o.grace, "grace", 25*time.Second, "how long a stop waits for the verbs under way")
	fs.BoolVar(&o.logRequests, "log-requests", false, "log a line for each request: the verb, the attachment, the outcome, how long it took")
	fs.BoolVar(&o.execWB, "exec-whereabouts", false, "allocate by running the whereabouts binary of each request's CNI_PATH, under whereabouts' Lease, as the plugin does, instead of whereabouts' allocator in-process")
	fs.StringVar(&o.nodeConfig, "node-config", conf.DefaultNodeConfig, "the node's settings for harvester-ipam's log (the chart's plugin.*), which the plugin reads too; a log file they name is the host's, which the plugin writes")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: harvester-ipam-agent [flags]\n       harvester-ipam-agent probe [--socket PATH] [--timeout D]\n\n"+
			"harvester-ipam's node agent: serves the plugin's CNI verbs on a unix socket.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "harvester-ipam-agent: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		os.Exit(2)
	}
	if o.version {
		fmt.Println("harvester-ipam-agent", Version)
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-agent:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	namespaces := splitList(o.namespaces)
	if len(namespaces) == 0 {
		return errors.New("--namespace names no namespace")
	}
	if o.node == "" {
		o.node, _ = os.Hostname()
	}
	if o.checkpoints != "" {
		// The agent writes the checkpoints the plugin writes; a directory a
		// hostPath volume made is 0755.
		if err := os.MkdirAll(o.checkpoints, 0o700); err != nil {
			return fmt.Errorf("checkpoint directory: %w", err)
		}
		if err := os.Chmod(o.checkpoints, 0o700); err != nil {
			return fmt.Errorf("checkpoint directory: %w", err)
		}
	}
	rc, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := shim.NewKubeAPI(rc)
	if err != nil {
		return err
	}
	// The agent's copy of the pools and reservations it serves: ADD chooses
	// its addresses on it, and looks in it for earlier sandboxes, as the
	// plugin does in the API server's watch cache. Until the informers have
	// listed, those reads go to the API server.
	objs := cache.New()
	api := cache.API{API: kube, Objects: objs}
	if err := watchPools(ctx, rc, objs, namespaces); err != nil {
		return err
	}
	// Crashpoints builds die at a step of the plugin's verbs or of the
	// allocator (their names differ) that HARVESTER_IPAM_CRASH_AT names.
	atStep := crashpoint.Hook()
	var allocator agent.Allocator
	if !o.execWB {
		allocator = alloc.Delegate{
			Allocator: alloc.New(alloc.Options{Reserved: objs.Reservation, Pools: objs.Pools, AtStep: atStep,
				Follows: func(namespace, rv string) bool {
					ctx, cancel := context.WithTimeout(context.Background(), agent.FollowWait)
					defer cancel()
					return objs.WaitFollows(ctx, namespace, rv)
				}}),
			Load: conf.Loader{Quiet: true}.Whereabouts,
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := agent.NewMetrics(reg)
	var checkpointDirs []string
	if o.checkpoints != "" {
		checkpointDirs = []string{filepath.Clean(o.checkpoints)}
	}
	id := identity(o.node, os.Getenv)
	srv, err := agent.New(agent.Options{
		API: api, Namespaces: namespaces, Node: o.node, Identity: id, Metrics: metrics, MaxInFlight: o.maxInFlight,
		CheckpointDirs: checkpointDirs, LogRequests: o.logRequests, Allocator: allocator, AtStep: atStep,
		NodeConfig: o.nodeConfig, Following: objs.Following,
		// The requests' stores share whereabouts' Lease: turns under one
		// acquisition, releases and removals of one moment together.
		StoreOptions: shim.Options{Group: &shim.Group{Identity: id}, AtStep: atStep},
	})
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, time.Now().Format(time.RFC3339)+" "+format+"\n", a...)
	}
	if err := srv.Check(ctx); err != nil {
		logf("the pools do not answer yet (declining until they do): %v", err)
	}
	go srv.Watch(ctx, o.checkEvery)

	l, err := agent.Listen(o.socket)
	if err != nil {
		return err
	}
	if o.nodeFile != "" {
		if err := writeNodeFile(o.nodeFile, o.socket); err != nil {
			l.Close()
			return err
		}
	}
	logf("harvester-ipam-agent %s serving %s for the pools of %s (node %s, holding whereabouts' Lease as %s)", Version, o.socket, strings.Join(namespaces, ", "), o.node, id)

	if o.metricsAddr != "" {
		// In the host's network: during a rollout the old agent holds the
		// port until it stops, so the bind is tried again every 2 s.
		go agent.ServeMetrics(ctx, o.metricsAddr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), 2*time.Second, logf)
	}
	if o.summary > 0 {
		go func() {
			t := time.NewTicker(o.summary)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if s := metrics.Summary(); s != "" {
						logf("requests in the last %s: %s", o.summary, s)
					}
				}
			}
		}()
	}

	// Served until ctx ends; then requests stop at once (new clients are
	// refused and work alone; a newer agent's socket is left as it is).
	// Its path is looked at every 2 s: a second release's agent that took
	// it over and stopped leaves it empty, and this agent listens again.
	closeErr := srv.ServeAt(ctx, l, 2*time.Second)
	if ctx.Err() == nil {
		return closeErr
	}
	// Then the verbs under way finish.
	logf("stopping: no new requests; waiting up to %s for those under way", o.grace)
	sctx, cancel := context.WithTimeout(context.Background(), o.grace)
	defer cancel()
	if err := srv.Stop(sctx); err != nil {
		logf("%v", err)
	}
	if s := metrics.Summary(); s != "" {
		logf("requests since the last summary: %s", s)
	}
	return closeErr
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "harvester-ipam-agent/" + Version
	// Every pod of a node may start at once (after a reboot): never wait on
	// client-side throttling.
	rc.QPS, rc.Burst = 100, 200
	return rc, nil
}

// writeNodeFile tells the plugin where the socket is: written whole
// (a temporary file renamed over it), readable by all, as the CNI config
// directory's files are.
func writeNodeFile(path, socket string) error {
	b, err := json.Marshal(wire.NodeConf{Socket: socket})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".agent.conf.*")
	if err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("node file: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("node file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	return nil
}

// probe asks the agent at --socket whether it serves, as the plugin would,
// with a request that does nothing.
func probe(args []string) int {
	fs := flag.NewFlagSet("harvester-ipam-agent probe", flag.ContinueOnError)
	socket := fs.String("socket", wire.DefaultSocket, "the agent's socket")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the agent's acknowledgement")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout+time.Second)
	defer cancel()
	res := (&client.Client{Socket: *socket, AckTimeout: *timeout}).Do(ctx, wire.NewRequest(wire.Probe, nil, nil))
	if res.Outcome != client.Served {
		fmt.Fprintf(os.Stderr, "not serving: %s\n", res.Reason)
		return 1
	}
	fmt.Println("serving")
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// watchPools starts informers of the pools and reservations of each
// namespace into objs, for as long as ctx lasts. It does not wait for them
// to list: the agent serves meanwhile, reading from the API server.
func watchPools(ctx context.Context, rc *rest.Config, objs *cache.Objects, namespaces []string) error {
	// The REST client of whereabouts' CRDs the plugin's store uses, not
	// whereabouts' generated clientset: that one links client-go's discovery
	// and the scheme of every built-in API group (half the agent's binary).
	wb, params, err := shim.WhereaboutsClient(rc)
	if err != nil {
		return err
	}
	lw := func(ns, resource string, list func() runtime.Object) *toolscache.ListWatch {
		return &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				out := list()
				err := wb.Get().Namespace(ns).Resource(resource).VersionedParams(&o, params).Do(ctx).Into(out)
				return out, err
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.Watch = true
				req := wb.Get().Namespace(ns).Resource(resource).VersionedParams(&o, params)
				if o.TimeoutSeconds != nil {
					req = req.Timeout(time.Duration(*o.TimeoutSeconds) * time.Second)
				}
				return req.Watch(ctx)
			},
		}
	}
	for _, ns := range namespaces {
		pools := lw(ns, "ippools", func() runtime.Object { return &shim.PoolList{} })
		reservations := lw(ns, "overlappingrangeipreservations", func() runtime.Object { return &shim.ReservationList{} })
		go func() {
			if err := objs.Watch(ctx, ns, pools, reservations); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "%s informers of %s: %v\n", time.Now().Format(time.RFC3339), ns, err)
			}
		}()
	}
	return nil
}

// identity names this start of the agent as a holder of whereabouts'
// Lease: its pod's UID (POD_UID, the downward API's metadata.uid; without
// it the host name, the pod's name) and a random part, since the pid is 1
// in every container and a restarted container keeps its pod's UID.
func identity(node string, getenv func(string) string) string {
	instance := getenv("POD_UID")
	if instance == "" {
		instance, _ = os.Hostname()
	}
	return agent.Identity(node, instance)
}
