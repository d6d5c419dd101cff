package plugin

import (
	"context"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
)

// poolRef is a pool in a namespace, under whereabouts' network_name.
type poolRef struct {
	namespace, name, networkName string
}

// Del is idempotent. It looks in every pool the config or the checkpoint
// names for what (CNI_CONTAINERID, CNI_IFNAME) holds; if anything, it
// delegates DEL when the config still names ranges, then releases directly
// whatever is still there. Nothing held is success; a store that cannot be
// read or written is an error, so the runtime retries.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	if err := validateAttachment(args); err != nil {
		return err
	}
	ph := newPhases()
	cfg, cfgErr := conf.Load(args.StdinData)
	if cfg == nil {
		return cfgErr // not JSON: nothing tells us where to look
	}
	log := p.logger(cfg, "DEL", args.ContainerID)
	defer log.close()
	defer func() { log.Debugf("took %s", ph) }()
	if cfgErr != nil {
		log.Debugf("config has no usable whereabouts part (%v); going by the checkpoint", cfgErr)
	}

	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	rec, haveRec, err := cp.Read(args.ContainerID, args.IfName)
	if err != nil {
		// A damaged record must not block DEL forever; the config may suffice.
		log.Errorf("ignoring unreadable checkpoint: %v", err)
	}

	kubeconfig := cfg.Kubeconfig()
	if kubeconfig == "" && haveRec {
		kubeconfig = rec.Kubeconfig
	}
	usable := cfgErr == nil && len(cfg.Pools) > 0
	if !usable && !haveRec {
		log.Debugf("no pools in the config and no checkpoint: nothing to release")
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.timeout())
	defer cancel()

	ph.mark("config")
	store, err := p.store(kubeconfig, "del")
	if err != nil {
		return err
	}
	defer log.retried(store)
	ph.mark("client")
	var pools []poolRef
	seen := map[poolRef]bool{}
	add := func(r poolRef) {
		if !seen[r] {
			seen[r] = true
			pools = append(pools, r)
		}
	}
	if usable {
		for _, pl := range cfg.Pools {
			add(poolRef{store.Namespace(), pl.Name, cfg.IPAM.NetworkName})
		}
	}
	if haveRec {
		ns := rec.Namespace
		if ns == "" {
			ns = store.Namespace()
		}
		for _, pl := range rec.Pools {
			add(poolRef{ns, pl.Name, rec.NetworkName})
		}
	}

	// Look first: a store that does not answer fails DEL at once (whereabouts
	// would wait a minute for its lease, then swallow the error), and an
	// attachment that holds nothing needs no delegate.
	held := false
	for _, pr := range pools {
		pool, err := store.In(pr.namespace).GetPool(ctx, pr.name)
		if err != nil {
			return storeError(fmt.Sprintf("read pool %s/%s", pr.namespace, pr.name), err)
		}
		if pool != nil && len(shim.Attachment(args.ContainerID, args.IfName)(pool.Spec.Allocations)) > 0 {
			held = true
		}
	}
	ph.mark("look")
	if !held {
		log.Debugf("nothing held in %d pool(s): nothing to release", len(pools))
		if haveRec {
			// An earlier DEL may have died between its pool write and its
			// reservation delete: finish its work.
			if err := p.releaseReservations(ctx, store, rec, log); err != nil {
				return storeError("release the reservations of "+args.ContainerID, err)
			}
		}
		if err := cp.Remove(args.ContainerID, args.IfName); err != nil {
			log.Errorf("%v", err)
		}
		return nil
	}

	if usable {
		// whereabouts swallows its own storage errors on DEL, so whatever it
		// says, the pools are checked again below.
		if err := invoke.DelegateDel(ctx, cfg.Options.Delegate, cfg.Delegated, p.Exec); err != nil {
			log.Errorf("%v; releasing directly", delegateError(cfg.Options.Delegate, "DEL", err))
		}
		p.at("del-after-delegate")
		ph.mark(cfg.Options.Delegate)
	}

	for _, pr := range pools {
		rs, err := store.In(pr.namespace).Release(ctx, pr.name, pr.networkName, shim.Attachment(args.ContainerID, args.IfName))
		log.released(fmt.Sprintf("DEL of %s/%s", args.ContainerID, args.IfName), rs)
		if err != nil {
			return storeError(fmt.Sprintf("release %s/%s from pool %s/%s", args.ContainerID, args.IfName, pr.namespace, pr.name), err)
		}
	}
	p.at("del-after-release")
	ph.mark("release")

	if err := cp.Remove(args.ContainerID, args.IfName); err != nil {
		// Left behind, the record only makes a later DEL or GC look again.
		log.Errorf("%v", err)
	}
	return nil
}

// releaseReservations deletes the reservations of a checkpoint's addresses
// that its pod no longer holds in their pool.
func (p *Plugin) releaseReservations(ctx context.Context, store *shim.Store, rec checkpoint.Record, log *logger) error {
	if rec.PodRef == "" {
		return nil
	}
	s := store.In(rec.Namespace)
	for _, cidr := range rec.IPs {
		ip, _, err := net.ParseCIDR(cidr)
		if err != nil {
			continue
		}
		for _, pl := range rec.Pools {
			if _, rng, err := net.ParseCIDR(pl.Range); err != nil || !rng.Contains(ip) {
				continue
			}
			name, err := s.ReleaseReservation(ctx, pl.Name, rec.NetworkName, ip, rec.PodRef, rec.ContainerID)
			if err != nil {
				return err
			}
			if name != "" {
				log.Verbosef("deleted reservation %s of %s, left by an earlier DEL of %s/%s", name, rec.PodRef, rec.ContainerID, rec.IfName)
			}
		}
	}
	return nil
}
