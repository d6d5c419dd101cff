package plugin

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/plugin/delegate"
)

// The CNI spec (1.1.0) STATUS codes; the library has no names for them.
const (
	errPluginNotAvailable uint = 50 // cannot service ADD
)

// statusTimeout bounds STATUS's probe of the API server: the runtime asks often.
const statusTimeout = 5 * time.Second

// Status is ready when the config and its kubeconfig load, the checkpoint
// directory can be written and the API server answers for the pools; then
// the delegate's STATUS decides. Not ready is error 50 (no ADD can succeed);
// never 51, since a missing IPAM store takes no address from a running pod.
func (p *Plugin) status(ctx context.Context, args *skel.CmdArgs) error {
	notReady := func(msg, details string) error {
		return cnitypes.NewError(errPluginNotAvailable, msg, details)
	}
	cfg, err := p.load(args.StdinData)
	if err != nil {
		return notReady("harvester-ipam config is not usable: "+errText(err), "fix the NAD's ipam object or the whereabouts flat file")
	}
	if err := cfg.RequirePools(); err != nil {
		return notReady(errText(err), "set ipam.range or ipam.ipRanges")
	}
	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return notReady(errText(err), "the whereabouts kubeconfig must be readable")
	}
	if err := os.MkdirAll(cfg.Options.CheckpointDir, 0o700); err != nil {
		return notReady(fmt.Sprintf("checkpoint directory %s: %v", cfg.Options.CheckpointDir, err), "it must be writable by root")
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		return notReady(fmt.Sprintf("IPPool store unreachable: %v", err), "the Kubernetes API server in the whereabouts kubeconfig must answer")
	}
	if err := delegate.Run(ctx, cfg.Options.Delegate, "STATUS", cfg.Delegated, p.exec(), p.Env); err != nil {
		return delegateError(cfg.Options.Delegate, "STATUS", err)
	}
	return nil
}

// errText is a CNI error's message with its details, or any error's text.
func errText(err error) string {
	if ce, ok := err.(*cnitypes.Error); ok {
		if ce.Details != "" {
			return ce.Msg + ": " + ce.Details
		}
		return ce.Msg
	}
	return err.Error()
}
