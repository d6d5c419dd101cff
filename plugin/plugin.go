// Package plugin implements harvester-ipam's CNI verbs, whether a NAD names
// it or it stands in at whereabouts' name. ADD releases what earlier
// sandboxes of the same pod still hold, then hands the allocation to the
// delegate (the real whereabouts); DEL is never handed over: it releases the
// attachment's entry and reservation itself, by the config or the
// checkpoint; CHECK, STATUS and GC follow the CNI spec 1.1.0.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/plugin/steps"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

// Plugin carries what the verbs share. The zero value is ready for use.
type Plugin struct {
	// Exec runs delegates; nil runs the binary found on CNI_PATH.
	Exec invoke.Exec
	// NewStore reaches the IPPool store a kubeconfig names; nil loads the
	// kubeconfig and talks to its API server.
	NewStore func(kubeconfig string) (*shim.Store, error)
	// Stdout receives the CNI result; nil is os.Stdout.
	Stdout io.Writer
	// Stderr receives the log when whereabouts' log_file is unset; nil is os.Stderr.
	Stderr io.Writer
	// Pods lists a namespace's pods with a kubeconfig, only to explain a
	// full range; nil lists them from the API server the kubeconfig names.
	Pods func(ctx context.Context, kubeconfig, namespace string) ([]Pod, error)
	// ExplainedByClient leaves a full range's explanation to the plugin
	// that offered the verb (a node agent, which lists no pods with
	// whereabouts' kubeconfig): the plugin adds it to the answer.
	ExplainedByClient bool
	// Sleep pauses between reads of a kubeconfig that looks half-written
	// (whereabouts rewrites it in place); nil is time.Sleep.
	Sleep func(time.Duration)
	// Timeout bounds one verb; zero is DefaultTimeout.
	Timeout time.Duration
	// AtStep, when set, is called at each step boundary of a verb
	// ("add-after-checkpoint", "del-after-reservations", ...): test builds
	// and the simulation crash the plugin there. Nil in production.
	AtStep func(step string)

	// Env is the environment the verb runs in: the runtime's CNI_*
	// variables and what delegates inherit. Nil is the process's own; a node
	// agent sets each request's.
	Env []string
	// Load reads a network config; nil is conf.Load.
	Load func(stdin []byte) (*conf.Config, error)
	// Allocator allocates ADD's addresses; nil hands the allocation to the
	// delegate binary (the real whereabouts), started early.
	Allocator Allocator
	// Agent is the node agent each verb is offered to first (Funcs); nil
	// does every verb here.
	Agent AgentClient

	// NodeConfig is the node's own settings file, which the chart's
	// installer writes (its plugin.* values); "" is conf.DefaultNodeConfig.
	NodeConfig string
	// LogFile, when set, takes the lines meant for a log file (whereabouts'
	// log_file, or the node's plugin.logFile) in place of that file: a node
	// agent, whose pod does not mount the host's files, hands them to its
	// client. Nil appends to the file.
	LogFile func(path string) io.Writer

	// fallback says why the node agent did not serve this verb, for the log.
	fallback string
}

// Allocator allocates the addresses of an ADD in place of the delegate
// binary, as whereabouts would: the same pool entries and reservations, the
// same result. The plugin has written the checkpoint and released earlier
// sandboxes before it calls Add, and records the result's addresses after.
type Allocator interface {
	// Add allocates for args (CNI_CONTAINERID, CNI_IFNAME, CNI_ARGS) from
	// cfg's pools, in store (the pools' namespace). Its error is whereabouts' as its binary reports it: a
	// *types.Error, whose message the plugin prefixes with the delegate's
	// name and explains when the range is full.
	Add(ctx context.Context, store *shim.Store, cfg *conf.Config, args *skel.CmdArgs) (cnitypes.Result, error)
}

// AgentClient hands a verb to the node agent and says what became of it:
// a *client.Client over the agent's socket (the simulation has its own).
type AgentClient interface {
	Do(ctx context.Context, req wire.Request) client.Result
}

// RecordingAllocator is an Allocator that writes the attachment's
// checkpoint itself: rec as the plugin made it (pools, pod, kubeconfig), with
// each address the allocator chose, durably (checkpoint.Dir.Write) before it
// writes that address anywhere. The plugin then does not write rec before
// releasing earlier sandboxes, which allocate nothing for this attachment:
// one fsynced write of the record instead of two. Its record errors are
// *types.Error of code ErrIOFailure.
type RecordingAllocator interface {
	Allocator
	AddRecording(ctx context.Context, store *shim.Store, cfg *conf.Config, args *skel.CmdArgs, rec checkpoint.Record) (cnitypes.Result, error)
}

// checkpointHint is the hint of a checkpoint that cannot be written.
const checkpointHint = "the checkpoint directory must be writable by root (" + conf.OptionsKey + ".checkpoint_dir)"

// DefaultTimeout stays within the runtime's own CNI timeout, and above
// whereabouts' (2 minutes for ADD), whose work is part of ours.
const DefaultTimeout = 150 * time.Second

// Funcs wires the verbs for skel, each offered to the node agent first
// (p.Agent). A harvester-ipam started as its own delegate fails every verb
// at once: starting itself again would never end.
func (p *Plugin) Funcs() skel.CNIFuncs {
	if os.Getenv(delegate.GuardEnv) != "" {
		refuse := func(*skel.CmdArgs) error { return delegate.SelfError() }
		return skel.CNIFuncs{Add: refuse, Del: refuse, Check: refuse, Status: refuse, GC: refuse}
	}
	return skel.CNIFuncs{
		Add:    p.through(wire.Add),
		Del:    p.through(wire.Del),
		Check:  p.through(wire.Check),
		Status: p.through(wire.Status),
		GC:     p.through(wire.GC),
	}
}

// Add, Del, Check, Status and GC run one verb here, as the runtime's exec of
// the plugin does.
func (p *Plugin) Add(args *skel.CmdArgs) error    { return p.add(context.Background(), args) }
func (p *Plugin) Del(args *skel.CmdArgs) error    { return p.del(context.Background(), args) }
func (p *Plugin) Check(args *skel.CmdArgs) error  { return p.check(context.Background(), args) }
func (p *Plugin) Status(args *skel.CmdArgs) error { return p.status(context.Background(), args) }
func (p *Plugin) GC(args *skel.CmdArgs) error     { return p.gc(context.Background(), args) }

// Run runs one verb (wire.Add, wire.Del, ...) here, bound to ctx: a node
// agent runs each request so, and cancels ctx when its client is gone.
func (p *Plugin) Run(ctx context.Context, command string, args *skel.CmdArgs) error {
	switch command {
	case wire.Add:
		return p.add(ctx, args)
	case wire.Del:
		return p.del(ctx, args)
	case wire.Check:
		return p.check(ctx, args)
	case wire.Status:
		return p.status(ctx, args)
	case wire.GC:
		return p.gc(ctx, args)
	}
	return cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND %q", command), "")
}

// load reads a network config with p.Load.
func (p *Plugin) load(stdin []byte) (*conf.Config, error) {
	if p.Load != nil {
		return p.Load(stdin)
	}
	return conf.Load(stdin)
}

// exec runs the delegates of DEL, GC and STATUS: p.Exec, or the binary
// delegate.Find resolves.
func (p *Plugin) exec() invoke.Exec {
	if p.Exec != nil {
		return p.Exec
	}
	return delegate.Plain(p.stderr())
}

func (p *Plugin) timeout() time.Duration {
	if p.Timeout > 0 {
		return p.Timeout
	}
	return DefaultTimeout
}

func (p *Plugin) stdout() io.Writer {
	if p.Stdout != nil {
		return p.Stdout
	}
	return os.Stdout
}

func (p *Plugin) stderr() io.Writer {
	if p.Stderr != nil {
		return p.Stderr
	}
	return os.Stderr
}

// logger logs at whereabouts' log_file and log_level, unless the node's own
// settings (the chart's plugin.logLevel and plugin.logFile) say otherwise:
// on Harvester from v1.6.0 the NAD cannot be edited, and whereabouts' pod
// rewrites its flat file at every start, so the node file is the lasting
// place to raise harvester-ipam's log level.
func (p *Plugin) logger(cfg *conf.Config, verb, containerID string) *logger {
	file, lvl := "", ""
	if cfg != nil {
		file, lvl = cfg.LogFile(), cfg.LogLevel()
	}
	path := p.NodeConfig
	if path == "" {
		path = conf.DefaultNodeConfig
	}
	node, err := conf.LoadNodeConfig(path)
	if node.LogFile != "" {
		file = node.LogFile
	}
	if node.LogLevel != "" {
		lvl = node.LogLevel
	}
	l := newLogger(file, lvl, p.stderr(), verb, containerID, p.LogFile)
	if err != nil {
		l.Errorf("%v; logging by whereabouts' settings", err)
	}
	if p.fallback != "" {
		l.Debugf("%s; doing it here", p.fallback)
		p.fallback = "" // said once, in the verb's first log
	}
	return l
}

// store reaches the IPPool store a kubeconfig names.
func (p *Plugin) store(path string) (*shim.Store, error) {
	if p.NewStore != nil {
		return p.NewStore(path)
	}
	kube, err := conf.LoadKubeconfig(path, p.Sleep)
	if err != nil {
		return nil, err
	}
	api, err := shim.NewKubeAPI(kube.Rest)
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("cannot build a client from kubeconfig %s", path), err.Error())
	}
	return shim.New(api, kube.Namespace, shim.Options{}), nil
}

// loadForAttachment is the config of ADD and CHECK: usable, with ranges and
// no node slices, for an attachment whose IDs a checkpoint path can be built
// from.
func (p *Plugin) loadForAttachment(args *skel.CmdArgs) (*conf.Config, error) {
	cfg, err := p.load(args.StdinData)
	if err != nil {
		return nil, err
	}
	if err := cfg.RequirePools(); err != nil {
		return nil, err
	}
	if err := cfg.RefuseNodeSlices(); err != nil {
		return nil, err
	}
	if err := validateAttachment(args); err != nil {
		return nil, err
	}
	return cfg, nil
}

// validateAttachment refuses IDs that a checkpoint path cannot be built from.
func validateAttachment(args *skel.CmdArgs) error {
	if err := checkpoint.ValidateContainerID(args.ContainerID); err != nil {
		return cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables, err.Error(), "the runtime must pass a CNI_CONTAINERID as the CNI spec defines it")
	}
	if err := checkpoint.ValidateIfName(args.IfName); err != nil {
		return cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables, err.Error(), "the runtime must pass a valid CNI_IFNAME")
	}
	return nil
}

// storeError is a failure to read or write the store: the runtime should retry.
func storeError(what string, err error) error {
	return cnitypes.NewError(cnitypes.ErrTryAgainLater, fmt.Sprintf("%s: %v", what, err),
		"the Kubernetes API server holding the IPPools could not be reached or refused the write; the runtime retries")
}

// delegateError keeps the delegate's CNI error code and says who failed.
func delegateError(delegate, verb string, err error) error {
	var ce *cnitypes.Error
	if errors.As(err, &ce) {
		return cnitypes.NewError(ce.Code, fmt.Sprintf("%s %s: %s", delegate, verb, ce.Msg), ce.Details)
	}
	return cnitypes.NewError(cnitypes.ErrInternal, fmt.Sprintf("%s %s: %v", delegate, verb, err),
		"the delegate is found on CNI_PATH by the name in ipam."+conf.OptionsKey+".delegate")
}

// retried logs how many writes had to be retried after conflicts: racing
// writers are normal, and the count tells how hard they raced.
func (l *logger) retried(s *shim.Store) {
	if s != nil && s.Retried() > 0 {
		l.Verbosef("%d writes retried after conflicts", s.Retried())
	}
}

// release frees what a plan holds (shim.Store.Free: one turn under the
// Lease in a node agent, else the reservations then the entries) and logs
// it; verb names the boundary between the two steps for the crash hook. It
// returns the entries removed.
func (p *Plugin) release(ctx context.Context, store *shim.Store, plan shim.Plan, verb, why string, log *logger, ph *steps.Timer) ([]shim.Allocation, error) {
	if plan.Empty() {
		return nil, nil
	}
	removed, deleted, err := store.Free(ctx, plan, func() {
		p.at(verb + "-after-reservations")
		ph.Mark("reservations")
	})
	ph.Mark("release")
	if err == nil || len(removed) > 0 || len(deleted) > 0 {
		log.released(why, plan, removed, deleted)
	}
	return removed, err
}

func (l *logger) released(why string, plan shim.Plan, removed []shim.Allocation, reservations []string) {
	deleted := map[string]bool{}
	for _, r := range reservations {
		deleted[r] = true
	}
	for _, a := range removed {
		orip := "no reservation of its own"
		if name := names.Reservation(a.IP, plan.Network); deleted[name] {
			orip = "reservation " + name + " deleted"
		}
		l.Verbosef("released %s from pool %s (%s): was container %s, pod %s, ifname %q; %s",
			a.IP, plan.Pool, why, a.ContainerID, a.PodRef, a.IfName, orip)
	}
}
