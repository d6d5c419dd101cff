package plugin

import (
	"context"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
)

// GC releases this node's checkpointed attachments of this network that
// cni.dev/valid-attachments does not name, then forwards GC to the delegate.
// It releases only what a checkpoint proves this node served: an allocation it
// never recorded is the reconciler's to judge, cluster-wide.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	cfg, cfgErr := conf.Load(args.StdinData)
	if cfg == nil {
		return cfgErr
	}
	log := p.logger(cfg, "GC", cfg.Network)
	defer log.close()

	valid := make(map[cnitypes.GCAttachment]bool, len(cfg.ValidAttachments))
	for _, a := range cfg.ValidAttachments {
		valid[a] = true
	}
	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	recs, errs := cp.List()
	for _, err := range errs {
		log.Errorf("skipping: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.timeout())
	defer cancel()

	stores := map[string]*shim.Store{}
	var failures []string
	for _, rec := range recs {
		if rec.Network != cfg.Network || valid[cnitypes.GCAttachment{ContainerID: rec.ContainerID, IfName: rec.IfName}] {
			continue
		}
		kubeconfig := rec.Kubeconfig
		if kubeconfig == "" {
			kubeconfig = cfg.Kubeconfig()
		}
		store, ok := stores[kubeconfig]
		if !ok {
			s, err := p.store(kubeconfig, "gc")
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s/%s: %s", rec.ContainerID, rec.IfName, errText(err)))
				continue
			}
			stores[kubeconfig], store = s, s
		}
		store = store.In(rec.Namespace)
		done := true
		for _, pl := range rec.Pools {
			rs, err := store.Release(ctx, pl.Name, rec.NetworkName, shim.Attachment(rec.ContainerID, rec.IfName))
			log.released(fmt.Sprintf("GC: %s/%s is not a valid attachment", rec.ContainerID, rec.IfName), rs)
			if err != nil {
				failures = append(failures, fmt.Sprintf("release %s/%s from pool %s: %v", rec.ContainerID, rec.IfName, pl.Name, err))
				done = false
			}
		}
		if done {
			if err := cp.Remove(rec.ContainerID, rec.IfName); err != nil {
				log.Errorf("%v", err)
			}
		}
	}

	if cfgErr == nil && len(cfg.Pools) > 0 {
		if err := invoke.DelegateGC(ctx, cfg.Options.Delegate, cfg.Delegated, p.Exec); err != nil {
			failures = append(failures, errText(delegateError(cfg.Options.Delegate, "GC", err)))
		}
	}
	if len(failures) > 0 {
		return cnitypes.NewError(cnitypes.ErrTryAgainLater, "GC left work undone: "+strings.Join(failures, "; "),
			"the attachments stay recorded; the next GC or the reconciler releases them")
	}
	return nil
}
