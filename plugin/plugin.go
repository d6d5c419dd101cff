// Package plugin implements harvester-ipam's CNI verbs. ADD releases what
// earlier sandboxes of the same pod still hold, then hands the allocation to
// the delegate (whereabouts); DEL hands over too, then makes sure the
// attachment's allocation is really gone; CHECK, STATUS and GC follow the CNI
// spec 1.1.0.
package plugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
)

// Plugin carries what the verbs share. The zero value is ready for use.
type Plugin struct {
	// Exec runs delegates; nil runs the binary found on CNI_PATH.
	Exec invoke.Exec
	// NewStore reaches the IPPool store; nil builds a client from the kubeconfig.
	NewStore func(*conf.Kube) (*shim.Store, error)
	// Stdout receives the CNI result; nil is os.Stdout.
	Stdout io.Writer
	// Stderr receives the log when whereabouts' log_file is unset; nil is os.Stderr.
	Stderr io.Writer
	// Timeout bounds one verb; zero is DefaultTimeout.
	Timeout time.Duration
	// crash is the test-only crash hook (see crash.go); nil in production.
	crash func(point string)
}

// DefaultTimeout stays within the runtime's own CNI timeout, and above
// whereabouts' (2 minutes for ADD), whose work is part of ours.
const DefaultTimeout = 150 * time.Second

// Funcs wires the verbs for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
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

func (p *Plugin) logger(cfg *conf.Config, verb, containerID string) *logger {
	if cfg == nil {
		return newLogger("", "", p.stderr(), verb, containerID)
	}
	return newLogger(cfg.LogFile(), cfg.LogLevel(), p.stderr(), verb, containerID)
}

// store reaches the IPPool store named by a kubeconfig; verb names its step
// boundaries for the crash hook.
func (p *Plugin) store(path, verb string) (*shim.Store, error) {
	kube, err := conf.LoadKubeconfig(path)
	if err != nil {
		return nil, err
	}
	newStore := p.NewStore
	if newStore == nil {
		newStore = func(k *conf.Kube) (*shim.Store, error) { return shim.NewForConfig(k.Rest, k.Namespace) }
	}
	s, err := newStore(kube)
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("cannot build a client from kubeconfig %s", path), err.Error())
	}
	if p.crash != nil {
		s.Hook = func(point string) { p.at(verb + "-" + point) }
	}
	return s, nil
}

// loadForAttachment is the config of ADD and CHECK: usable, with ranges, for
// an attachment whose IDs a checkpoint path can be built from.
func loadForAttachment(args *skel.CmdArgs) (*conf.Config, error) {
	cfg, err := conf.Load(args.StdinData)
	if err != nil {
		return nil, err
	}
	if err := cfg.RequirePools(); err != nil {
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

// phases times the steps of a verb, for the debug log: where a slow ADD or
// DEL spends its time (the process start itself is before main).
type phases struct {
	last  time.Time
	parts []string
}

func newPhases() *phases { return &phases{last: time.Now()} }

func (ph *phases) mark(step string) {
	now := time.Now()
	ph.parts = append(ph.parts, fmt.Sprintf("%s %s", step, now.Sub(ph.last).Round(10*time.Microsecond)))
	ph.last = now
}

func (ph *phases) String() string { return strings.Join(ph.parts, ", ") }

// retried logs how many writes had to be retried after conflicts: racing
// writers are normal, and the count tells how hard they raced.
func (l *logger) retried(s *shim.Store) {
	if s != nil && s.Retried.Load() > 0 {
		l.Verbosef("%d writes retried after conflicts", s.Retried.Load())
	}
}

func (l *logger) released(why string, rs []shim.Release) {
	for _, r := range rs {
		orip := "no reservation"
		if r.ORIP != "" {
			orip = "reservation " + r.ORIP + " deleted"
		}
		l.Verbosef("released %s from pool %s (%s): was container %s, pod %s, ifname %q; %s",
			r.IP, r.Pool, why, r.ContainerID, r.PodRef, r.IfName, orip)
	}
}
