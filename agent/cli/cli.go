// Package cli is harvester-ipam-agent's command, its flags aside: the node
// agent, serving the plugin's CNI verbs on a unix socket, in-process, with
// a warm client of the API server under its own service account, and the
// probe that asks it whether it serves.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/harvester/harvester-ipam/agent"
	"github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/crashpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

// Options are the agent's command line, each a flag
// (cmd/harvester-ipam-agent says which and what it defaults to).
type Options struct {
	Socket      string
	NodeFile    string // "": tell the plugin nothing
	Checkpoints string // the plugin's checkpoint directory
	Namespaces  string // comma-separated
	Kubeconfig  string // "": the in-cluster service account
	Node        string // "": the host name
	MetricsAddr string // "": no metrics
	MaxInFlight int
	Summary     time.Duration // 0: no summaries
	CheckEvery  time.Duration
	Grace       time.Duration
	LogRequests bool
	ExecWB      bool
	NodeConfig  string

	Version string    // in the log and the API client's user agent
	Stderr  io.Writer // the log; nil: os.Stderr
}

// Run serves until ctx ends, then stops taking requests and waits up to
// Grace for those under way. Its error is a start that failed, or the
// socket's.
func Run(ctx context.Context, o Options) error {
	namespaces := splitList(o.Namespaces)
	if len(namespaces) == 0 {
		return errors.New("--namespace names no namespace")
	}
	if o.Node == "" {
		o.Node, _ = os.Hostname()
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Checkpoints != "" {
		// The agent writes the checkpoints the plugin writes; a directory a
		// hostPath volume made is 0755.
		if err := os.MkdirAll(o.Checkpoints, 0o700); err != nil {
			return fmt.Errorf("checkpoint directory: %w", err)
		}
		if err := os.Chmod(o.Checkpoints, 0o700); err != nil {
			return fmt.Errorf("checkpoint directory: %w", err)
		}
	}
	a, err := start(ctx, o, namespaces)
	if err != nil {
		return err
	}
	return a.serve(ctx)
}

// running is an agent started: its server, metrics and log.
type running struct {
	o          Options
	namespaces []string
	id         string
	srv        *agent.Server
	reg        *prometheus.Registry
	metrics    *agent.Metrics
	mu         sync.Mutex // one log line at a time
}

func (a *running) logf(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fmt.Fprintf(a.o.Stderr, time.Now().Format(time.RFC3339)+" "+format+"\n", args...)
}

// start makes the agent's server: its client of the API server, its copy
// of the pools (informers started, not waited for), its allocator and its
// metrics.
func start(ctx context.Context, o Options, namespaces []string) (*running, error) {
	a := &running{o: o, namespaces: namespaces}
	rc, err := restConfig(o.Kubeconfig, o.Version)
	if err != nil {
		return nil, err
	}
	kube, err := shim.NewKubeAPI(rc)
	if err != nil {
		return nil, err
	}
	// The agent's copy of the pools and reservations it serves: ADD chooses
	// its addresses on it, and looks in it for earlier sandboxes, as the
	// plugin does in the API server's watch cache. Until the informers have
	// listed, those reads go to the API server.
	objs := cache.New()
	api := cache.API{API: kube, Objects: objs}
	if err := watchPools(ctx, rc, objs, namespaces, a.logf); err != nil {
		return nil, err
	}
	// Crashpoints builds die at a step of the plugin's verbs or of the
	// allocator (their names differ) that HARVESTER_IPAM_CRASH_AT names.
	atStep := crashpoint.Hook()
	var allocator agent.Allocator
	if !o.ExecWB {
		allocator = alloc.Delegate{
			Batcher: alloc.New(alloc.Options{Reserved: objs.Reservation, Pools: objs.Pools, AtStep: atStep,
				Follows: func(namespace, rv string) bool {
					ctx, cancel := context.WithTimeout(context.Background(), agent.FollowWait)
					defer cancel()
					return objs.WaitFollows(ctx, namespace, rv)
				}}),
			Load: conf.Loader{Quiet: true}.Whereabouts,
		}
	}
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.metrics = agent.NewMetrics(a.reg)
	var checkpointDirs []string
	if o.Checkpoints != "" {
		checkpointDirs = []string{filepath.Clean(o.Checkpoints)}
	}
	a.id = identity(o.Node, os.Getenv)
	a.srv, err = agent.New(agent.Options{
		API: api, Namespaces: namespaces, Node: o.Node, Identity: a.id, Metrics: a.metrics, MaxInFlight: o.MaxInFlight,
		CheckpointDirs: checkpointDirs, LogRequests: o.LogRequests, Allocator: allocator, AtStep: atStep,
		NodeConfig: o.NodeConfig, Following: objs.Following, Log: o.Stderr,
		// The requests' stores share whereabouts' Lease: turns under one
		// acquisition, releases and removals of one moment together.
		StoreOptions: shim.Options{Group: &shim.Group{Identity: a.id}, AtStep: atStep},
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// serve checks the pools, binds the socket, tells the plugin where it is,
// serves metrics and summaries, and serves the socket until ctx ends.
func (a *running) serve(ctx context.Context) error {
	o := a.o
	if err := a.srv.Check(ctx); err != nil {
		a.logf("the pools do not answer yet (declining until they do): %v", err)
	}
	go a.srv.Watch(ctx, o.CheckEvery)

	l, err := agent.Listen(o.Socket)
	if err != nil {
		return err
	}
	if o.NodeFile != "" {
		if err := writeNodeFile(o.NodeFile, o.Socket); err != nil {
			l.Close()
			return err
		}
	}
	a.logf("harvester-ipam-agent %s serving %s for the pools of %s (node %s, holding whereabouts' Lease as %s)", o.Version, o.Socket, strings.Join(a.namespaces, ", "), o.Node, a.id)

	if o.MetricsAddr != "" {
		// In the host's network: during a rollout the old agent holds the
		// port until it stops, so the bind is tried again every 2 s.
		go agent.ServeMetrics(ctx, o.MetricsAddr, promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}), 2*time.Second, a.logf)
	}
	if o.Summary > 0 {
		go a.summarize(ctx)
	}

	// Served until ctx ends; then requests stop at once (new clients are
	// refused and work alone; a newer agent's socket is left as it is).
	// Its path is looked at every 2 s: a second release's agent that took
	// it over and stopped leaves it empty, and this agent listens again.
	closeErr := a.srv.ServeAt(ctx, l, 2*time.Second)
	if ctx.Err() == nil {
		return closeErr
	}
	// Then the verbs under way finish.
	a.logf("stopping: no new requests; waiting up to %s for those under way", o.Grace)
	sctx, cancel := context.WithTimeout(context.Background(), o.Grace)
	defer cancel()
	if err := a.srv.Stop(sctx); err != nil {
		a.logf("%v", err)
	}
	if s := a.metrics.Summary(); s != "" {
		a.logf("requests since the last summary: %s", s)
	}
	return closeErr
}

// summarize logs a line of what was served every Summary, until ctx ends.
func (a *running) summarize(ctx context.Context) {
	t := time.NewTicker(a.o.Summary)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s := a.metrics.Summary(); s != "" {
				a.logf("requests in the last %s: %s", a.o.Summary, s)
			}
		}
	}
}

// Probe asks the agent at socket whether it serves, as the plugin would,
// with a request that does nothing; waiting up to timeout for it to take
// the request. Its error says it does not, and why.
func Probe(ctx context.Context, socket string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	res := (&client.Client{Socket: socket, HandOver: timeout}).Do(ctx, wire.NewRequest(wire.Probe, nil, nil))
	if res.Outcome != client.Served {
		return fmt.Errorf("not serving: %s", res.Reason)
	}
	return nil
}
