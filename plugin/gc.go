package plugin

import (
	"context"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/shim"
)

// GC releases this node's checkpointed attachments of this network that
// cni.dev/valid-attachments does not name, then forwards GC to the delegate.
// It releases only what a checkpoint proves this node served for this very
// network (its name, whereabouts' network_name, and a pool of its in the
// same namespace: two NADs in different namespaces often share a name): an
// allocation it never recorded is the reconciler's to judge, cluster-wide.
// It reaches the store with the config's kubeconfig, not the one a record
// names (an upgrade may have moved it), and one record that cannot be
// released stops none of the others.
func (p *Plugin) gc(ctx context.Context, args *skel.CmdArgs) error {
	cfg, cfgErr := p.load(args.StdinData)
	if cfg == nil {
		return cfgErr
	}
	log := p.logger(cfg, "GC", cfg.Network)
	defer log.close()
	if cfgErr != nil || len(cfg.Pools) == 0 {
		// Without the network's pools nothing tells its records from
		// another network's of the same name.
		log.Errorf("config names no pools (%s): released nothing", errText(orNoRange(cfgErr)))
		return nil
	}
	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return err
	}
	defer log.retried(store)

	valid := make(map[cnitypes.GCAttachment]bool, len(cfg.ValidAttachments))
	for _, a := range cfg.ValidAttachments {
		valid[a] = true
	}
	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	recs, errs := cp.List()
	for _, err := range errs {
		log.Errorf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()

	var failures []string
	for _, rec := range recs {
		if !ofNetwork(rec, cfg, store.Namespace()) || valid[cnitypes.GCAttachment{ContainerID: rec.ContainerID, IfName: rec.IfName}] {
			continue
		}
		if err := p.collect(ctx, store, cp, rec, log); err != nil {
			failures = append(failures, fmt.Sprintf("%s/%s: %v", rec.ContainerID, rec.IfName, err))
			continue
		}
		if err := cp.Remove(rec.ContainerID, rec.IfName); err != nil {
			log.Errorf("%v", err)
		}
	}

	if err := delegate.Run(ctx, cfg.Options.Delegate, "GC", cfg.Delegated, p.exec(), p.Env); err != nil {
		failures = append(failures, errText(delegateError(cfg.Options.Delegate, "GC", err)))
	}
	if len(failures) > 0 {
		return cnitypes.NewError(cnitypes.ErrTryAgainLater, "GC left work undone: "+strings.Join(failures, "; "),
			"the attachments stay recorded; the next GC or the reconciler releases them")
	}
	return nil
}

// ofNetwork says whether a record is an attachment of the network cfg
// describes, in the store's namespace.
func ofNetwork(rec checkpoint.Record, cfg *conf.Config, namespace string) bool {
	if rec.Network != cfg.Network || rec.NetworkName != cfg.IPAM.NetworkName || rec.Namespace != namespace {
		return false
	}
	for _, rp := range rec.Pools {
		for _, cp := range cfg.Pools {
			if rp.Name == cp.Name {
				return true
			}
		}
	}
	return false
}

// collect releases one recorded attachment from each of its pools.
func (p *Plugin) collect(ctx context.Context, store *shim.Store, cp checkpoint.Dir, rec checkpoint.Record, log *logger) error {
	recorded := rec.Addresses()
	sib, _, errs := readSiblings(cp, rec.ContainerID, rec.IfName)
	for _, err := range errs {
		log.Errorf("ignoring unreadable checkpoint: %v", err)
	}
	for _, pl := range rec.Pools {
		plan, err := store.Plan(ctx, pl.Name, rec.NetworkName, shim.Attachment(rec.ContainerID, rec.IfName, recorded, sib.of(rec.Namespace, pl.Name)))
		if err != nil {
			return err
		}
		why := fmt.Sprintf("GC: %s/%s is not a valid attachment", rec.ContainerID, rec.IfName)
		if _, err := p.release(ctx, store, plan, "gc", why, log, nil); err != nil {
			return fmt.Errorf("release from pool %s: %w", pl.Name, err)
		}
	}
	return nil
}

func orNoRange(err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("no range")
}
