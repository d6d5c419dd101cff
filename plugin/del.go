package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/plugin/steps"
	"github.com/harvester/harvester-ipam/shim"
)

// poolRef is a pool in a namespace, under whereabouts' network_name.
type poolRef struct {
	namespace, name, network string
}

// Del is idempotent. It finds what the attachment (CNI_CONTAINERID,
// CNI_IFNAME) holds in every pool the config or the checkpoint names, and
// releases it itself. Nothing held is success; a store that cannot be read
// or written is an error, so that the runtime retries.
//
// DEL is not handed to whereabouts: its DEL removes the first entry of the
// container it finds (v0.8.0 and before: perhaps another interface's),
// swallows its storage errors, and takes whereabouts' Lease under the pod's
// name, as the ADD of the pod's next sandbox does, so that both run at once
// when the kubelet removes an old sandbox while it makes a new one (the
// simulation found that it then frees the new sandbox's reservation).
// harvester-ipam's release does what whereabouts' DEL does — the entry, then
// the reservation — exactly, under a Lease identity of its own.
//
// DEL never fails for want of a config it can fully read (an option of a
// newer release after a downgrade, a field of the wrong type, the NAD gone):
// it goes by what it can read of it and by the checkpoint.
func (p *Plugin) del(ctx context.Context, args *skel.CmdArgs) error {
	if err := validateAttachment(args); err != nil {
		return err
	}
	ph := steps.New(time.Now())
	cfg, cfgErr := p.load(args.StdinData)
	salvage := conf.SalvageConfig(args.StdinData)
	if cfg == nil {
		cfg = &conf.Config{Network: salvage.Network, Options: conf.Options{Delegate: conf.DefaultDelegate, CheckpointDir: salvage.CheckpointDir}}
	}
	log := p.logger(cfg, "DEL", args.ContainerID)
	defer log.close()
	defer func() { log.Debugf("took %s", ph) }()
	if cfgErr != nil {
		log.Debugf("config has no usable whereabouts part (%s); going by the checkpoint", errText(cfgErr))
	}
	usable := cfgErr == nil && len(cfg.Pools) > 0

	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()

	if usable && cfg.NodeSliceSize != "" {
		// ADD refuses node slices, so nothing of this attachment is ours; what
		// whereabouts allocated before harvester-ipam was named is its own.
		if err := delegate.Run(ctx, cfg.Options.Delegate, "DEL", cfg.Delegated, p.exec(), p.Env); err != nil {
			return delegateError(cfg.Options.Delegate, "DEL", err)
		}
		return nil
	}

	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	rec, haveRec, err := cp.Read(args.ContainerID, args.IfName)
	if err != nil {
		// A record this binary cannot read must not block DEL forever: the
		// config's pools, or a search by container, may still find it.
		log.Errorf("ignoring unreadable checkpoint: %v", err)
	}
	ph.Mark("config")

	store, err := p.storeOf(cfg.Kubeconfig(), rec.Kubeconfig, salvage.Kubeconfig)
	if err != nil {
		if !usable && !haveRec {
			log.Debugf("no pools, no checkpoint and no store (%s): nothing to release", errText(err))
			return nil
		}
		return err
	}
	defer log.retried(store)
	ph.Mark("client")

	d := &deleting{p: p, args: args, log: log, store: store, cp: cp, rec: rec, haveRec: haveRec, recorded: rec.Addresses(), ph: ph}
	// What the sandbox's other attachments recorded: an entry without an
	// ifname at an address one of them recorded too is not told to be ours.
	var errs []error
	d.sib, _, errs = readSiblings(cp, args.ContainerID, args.IfName)
	for _, err := range errs {
		log.Errorf("ignoring unreadable checkpoint: %v", err)
	}
	var pools []poolRef
	if usable {
		pools = d.pools(cfg)
	} else {
		pools = d.pools(nil)
	}
	plans, err := d.plan(ctx, pools)
	if err != nil {
		return err
	}
	ph.Mark("look")
	if len(plans) == 0 {
		log.Debugf("nothing held in %d pool(s)", len(pools))
		if haveRec && len(d.recorded) > 0 {
			// An earlier DEL, or whereabouts' own, may have removed the entry
			// and died before its reservation: judge those reservations.
			if err := p.releaseRecorded(ctx, store, rec, d.recorded, log); err != nil {
				return storeError("release the reservations of "+args.ContainerID, err)
			}
		}
		p.forget(cp, args, log)
		return nil
	}
	for _, plan := range plans {
		if err := d.release(ctx, plan); err != nil {
			return err
		}
	}
	p.at("del-after-release")
	p.forget(cp, args, log)
	return nil
}

// leaveToTaker is what the DEL leaves in pool pr: the entries on its
// interface that an ADD in flight on this node, of another sandbox of the
// same pod on the same interface and pool, takes over in the write that
// allocates, or releases once it has allocated (adding.handedOver). The
// kubelet runs a pod's next sandbox's ADD while it tears the earlier one
// down (a pod deleted with a grace period of 0 and made again at once, as a
// StatefulSet does): releasing here would leave the pod without its address
// until that ADD allocates, which whereabouts alone, whose DEL and ADD take
// turns on its Lease, seldom shows, and whereabouts' own suite polls for.
// An ADD that dies (its mark then unheld) or fails leaves the entry to the
// pod's next ADD, or to the reconciler once the pod is gone, as any ADD that
// stops half-way. An entry without an ifname (whereabouts before v0.8),
// which no ADD can tell is on its interface, is released as ever.
func (d *deleting) leaveToTaker(pr poolRef) func(off string, a shim.IPAllocation) bool {
	return func(off string, a shim.IPAllocation) bool {
		if a.IfName != d.args.IfName || a.PodRef == "" {
			return false
		}
		for _, r := range d.takers() {
			if r.ContainerID != d.args.ContainerID && r.IfName == d.args.IfName && r.PodRef == a.PodRef &&
				r.Namespace == pr.namespace && r.Names(pr.name) {
				d.log.Verbosef("left entry %s of pool %s/%s to the ADD of %s/%s in flight, the pod's next sandbox, which takes it over", off, pr.namespace, pr.name, r.ContainerID, r.IfName)
				return true
			}
		}
		return false
	}
}

// takers are the records of the ADDs in flight on this node, read once.
func (d *deleting) takers() []checkpoint.Record {
	if !d.takersRead {
		d.takersRead = true
		var errs []error
		d.inFlight, errs = d.cp.InFlight()
		for _, err := range errs {
			d.log.Errorf("ignoring unreadable checkpoint of an ADD in flight: %v", err)
		}
	}
	return d.inFlight
}

// deleting is one DEL past its config: what its steps share.
type deleting struct {
	p        *Plugin
	args     *skel.CmdArgs
	log      *logger
	store    *shim.Store
	cp       checkpoint.Dir
	rec      checkpoint.Record
	haveRec  bool
	recorded []net.IP
	sib      siblings
	ph       *steps.Timer
	// inFlight are the ADDs in flight on this node (takers), once takersRead.
	inFlight   []checkpoint.Record
	takersRead bool
}

// pools are the pools the config (nil: none usable) and the checkpoint
// name, each once.
func (d *deleting) pools(cfg *conf.Config) []poolRef {
	var pools []poolRef
	seen := map[poolRef]bool{}
	add := func(r poolRef) {
		if !seen[r] {
			seen[r] = true
			pools = append(pools, r)
		}
	}
	if cfg != nil {
		for _, pl := range cfg.Pools {
			add(poolRef{d.store.Namespace(), pl.Name, cfg.IPAM.NetworkName})
		}
	}
	if d.haveRec {
		for _, pl := range d.rec.Pools {
			add(poolRef{d.rec.Namespace, pl.Name, d.rec.NetworkName})
		}
	}
	return pools
}

// plan looks first: a store that does not answer fails DEL at once, and an
// attachment that holds nothing needs nothing more.
func (d *deleting) plan(ctx context.Context, pools []poolRef) ([]nsPlan, error) {
	if len(pools) == 0 {
		// Neither the config nor a readable checkpoint names a pool: a
		// container ID names one sandbox, so look for it everywhere.
		plans, err := d.p.searchAttachment(ctx, d.store, d.args)
		if err != nil {
			return nil, storeError("find "+d.args.ContainerID+"/"+d.args.IfName+" in the pools of "+d.store.Namespace(), err)
		}
		return plans, nil
	}
	var plans []nsPlan
	for _, pr := range pools {
		// A node agent's own copy of the pool serves when it shows the
		// attachment's entries (the release's writes check them again); one
		// that shows none is read fresh: nothing to release is never
		// decided from a copy.
		siblings := d.sib.of(pr.namespace, pr.name)
		pool, onCopy, err := d.store.In(pr.namespace).Look(ctx, pr.name, shim.Attachment(d.args.ContainerID, d.args.IfName, d.recorded, siblings))
		if err != nil {
			return nil, storeError(fmt.Sprintf("read pool %s/%s", pr.namespace, pr.name), err)
		}
		plan, err := d.planIn(pool, pr)
		if err != nil {
			return nil, err
		}
		if !plan.Empty() {
			plan.onCopy = onCopy
			plans = append(plans, plan)
		}
	}
	return plans, nil
}

// planIn plans the release of what the attachment holds in pool, as read,
// and says so when the pool holds an entry of the container without an
// ifname that no record says is this attachment's.
func (d *deleting) planIn(pool *shim.Pool, pr poolRef) (nsPlan, error) {
	plan, ambiguous, err := planAttachment(pool, pr, d.args, d.recorded, d.sib.of(pr.namespace, pr.name), d.leaveToTaker(pr))
	if err != nil {
		return nsPlan{}, storeError(fmt.Sprintf("read pool %s/%s", pr.namespace, pr.name), err)
	}
	if ambiguous {
		d.log.Errorf("pool %s/%s holds an entry of container %s without an ifname that no checkpoint records as %s's: left it (another interface's, or released by the pod's next ADD or by the reconciler once the sandbox is gone)", pr.namespace, pr.name, d.args.ContainerID, d.args.IfName)
	}
	plan.ref = pr
	return plan, nil
}

// release releases one plan. Planned on a copy that was behind (the entries
// it showed were gone: released by the plugin after the agent lost an ADD,
// say), the attachment may hold others the copy did not show (the exec
// path's, allocated since): it plans again on a fresh read.
func (d *deleting) release(ctx context.Context, plan nsPlan) error {
	why := fmt.Sprintf("DEL of %s/%s", d.args.ContainerID, d.args.IfName)
	s := d.store.In(plan.namespace)
	fail := func(err error) error {
		return storeError(fmt.Sprintf("release %s/%s from pool %s/%s", d.args.ContainerID, d.args.IfName, plan.namespace, plan.Pool), err)
	}
	removed, err := d.p.release(ctx, s, plan.Plan, "del", why, d.log, d.ph)
	if err != nil {
		return fail(err)
	}
	if !plan.onCopy || len(removed) == len(plan.Entries) {
		return nil
	}
	pool, err := s.Pool(ctx, plan.Pool)
	if err != nil {
		return storeError(fmt.Sprintf("read pool %s/%s", plan.namespace, plan.Pool), err)
	}
	again, err := d.planIn(pool, plan.ref)
	if err != nil {
		return err
	}
	if _, err := d.p.release(ctx, s, again.Plan, "del", why, d.log, d.ph); err != nil {
		return fail(err)
	}
	return nil
}

// nsPlan is a plan in a namespace.
type nsPlan struct {
	shim.Plan
	namespace string
	// onCopy says that the plan was made on a node agent's own copy of the
	// pool, ref being the pool it names.
	onCopy bool
	ref    poolRef
}

// planAttachment plans the release of what the attachment holds in pool (nil:
// nothing), and says whether the pool holds an entry of the container without
// an ifname that no record says is this attachment's.
// An entry leave says true of is not planned (nil: none).
func planAttachment(pool *shim.Pool, pr poolRef, args *skel.CmdArgs, recorded, siblings []net.IP, leave func(off string, a shim.IPAllocation) bool) (nsPlan, bool, error) {
	if pool == nil {
		return withNamespace(shim.Plan{Pool: pr.name, Network: pr.network}, pr.namespace), false, nil
	}
	found := shim.FindAttachment(pool, args.ContainerID, args.IfName, recorded, siblings)
	offsets := found.Offsets
	if leave != nil {
		offsets = slices.DeleteFunc(slices.Clone(offsets), func(off string) bool { return leave(off, pool.Spec.Allocations[off]) })
	}
	plan, err := shim.PlanOf(pool, pr.network, shim.Exactly(entriesAt(pool, offsets)))
	return withNamespace(plan, pr.namespace), found.Ambiguous, err
}

func withNamespace(p shim.Plan, ns string) nsPlan { return nsPlan{Plan: p, namespace: ns} }

// entriesAt are the allocations of pool at offsets, as Exactly wants them.
func entriesAt(pool *shim.Pool, offsets []string) map[string]shim.IPAllocation {
	out := make(map[string]shim.IPAllocation, len(offsets))
	for _, off := range offsets {
		out[off] = pool.Spec.Allocations[off]
	}
	return out
}

// storeOf reaches the first of the kubeconfigs that loads: the config's,
// the checkpoint's, the one the flat file names. Each path is tried once:
// they are mostly the same file, and one that looks half-written has already
// been read again for a second.
func (p *Plugin) storeOf(kubeconfigs ...string) (*shim.Store, error) {
	var errs []error
	tried := map[string]bool{}
	for _, kc := range kubeconfigs {
		if kc == "" || tried[kc] {
			continue
		}
		tried[kc] = true
		s, err := p.store(kc)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, errors.New("no kubeconfig: neither the config, the checkpoint nor the whereabouts flat file names one")
	}
	return nil, errs[0]
}

// searchAttachment plans the release of the attachment's entries from every
// pool of the store's namespace: only those that name the ifname, since
// without a record nothing tells an unnamed entry's interface.
func (p *Plugin) searchAttachment(ctx context.Context, store *shim.Store, args *skel.CmdArgs) ([]nsPlan, error) {
	pools, err := store.Pools(ctx)
	if err != nil {
		return nil, err
	}
	var out []nsPlan
	for i := range pools {
		pool := &pools[i]
		var offs []string
		for off, a := range pool.Spec.Allocations {
			if a.ContainerID == args.ContainerID && a.IfName == args.IfName {
				offs = append(offs, off)
			}
		}
		if len(offs) == 0 {
			continue
		}
		network, _ := names.PoolPrefix(pool.Name, pool.Spec.Range)
		plan, err := shim.PlanOf(pool, network, shim.Exactly(entriesAt(pool, offs)))
		if err != nil {
			return nil, err
		}
		out = append(out, withNamespace(plan, store.Namespace()))
	}
	return out, nil
}

// releaseRecorded judges (and deletes, when they are still the attachment's
// and no entry of the pod holds them) the reservations of the addresses a
// checkpoint recorded, in the pools whose range holds them.
func (p *Plugin) releaseRecorded(ctx context.Context, store *shim.Store, rec checkpoint.Record, recorded []net.IP, log *logger) error {
	if rec.PodRef == "" {
		return nil
	}
	s := store.In(rec.Namespace)
	for _, pl := range rec.Pools {
		_, rng, err := net.ParseCIDR(pl.Range)
		if err != nil {
			continue
		}
		plan := shim.Plan{Pool: pl.Name, Network: rec.NetworkName}
		for _, ip := range recorded {
			if rng.Contains(ip) {
				plan.Entries = append(plan.Entries, shim.Allocation{Pool: pl.Name, IP: ip,
					IPAllocation: shim.IPAllocation{ContainerID: rec.ContainerID, PodRef: rec.PodRef, IfName: rec.IfName}})
			}
		}
		deleted, err := s.ReleaseReservations(ctx, plan)
		for _, name := range deleted {
			log.Verbosef("deleted reservation %s of %s, left by an earlier DEL of %s/%s", name, rec.PodRef, rec.ContainerID, rec.IfName)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// forget removes the attachment's checkpoint; one left behind only makes a
// later DEL or GC look again.
func (p *Plugin) forget(cp checkpoint.Dir, args *skel.CmdArgs, log *logger) {
	if err := cp.Remove(args.ContainerID, args.IfName); err != nil {
		log.Errorf("%v", err)
	}
}
