package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/plugin/steps"
	"github.com/harvester/harvester-ipam/shim"
)

// add releases the allocations that earlier sandboxes of this pod hold in the
// config's pools, then delegates ADD (or has p.Allocator allocate) and
// returns the result. Its steps: record the attachment, reclaim, allocate,
// record the addresses, answer.
func (p *Plugin) add(ctx context.Context, args *skel.CmdArgs) error {
	if unmanagedAdd(args) != "" {
		return p.handOnAdd(ctx, args)
	}
	ph := steps.New(time.Now())
	cfg, err := p.loadForAttachment(args)
	if err != nil {
		return err
	}
	pod, err := conf.ParseArgs(args.Args)
	if err != nil {
		return err
	}
	log := p.logger(cfg, "ADD", args.ContainerID)
	defer log.close()
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	exec := p.Exec
	if exec == nil && p.Allocator == nil {
		// The delegate starts up while we work below; it reads its config,
		// and so does anything, only when DelegateAdd writes it.
		early := delegate.StartIn(ctx, cfg.Options.Delegate, "ADD", p.Env, p.stderr())
		defer early.Abandon()
		exec = early
	}
	ph.Mark("config")

	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return err
	}
	defer log.retried(store)
	defer func() { log.Debugf("took %s", ph) }()
	ph.Mark("client")

	a := &adding{p: p, args: args, cfg: cfg, pod: pod, log: log, store: store, exec: exec}
	defer a.done()
	if err := a.checkpoint(ctx); err != nil {
		return err
	}
	ph.Mark("checkpoint")
	if err := a.reclaim(ctx, p.reclaim); err != nil {
		return err
	}
	p.at("add-after-reclaim")
	ph.Mark("reclaim")
	res, err := a.allocate(ctx)
	if err != nil {
		a.failed(ctx)
		return err
	}
	p.at("add-after-delegate")
	ph.Mark(cfg.Options.Delegate)
	if err := a.handedOver(ctx); err != nil {
		// The allocation stands; what was not handed over is the next
		// ADD's, a DEL's or the reconciler's to release.
		log.Errorf("%v", err)
	}
	a.done()
	a.recordAddresses(res)
	ph.Mark("record")
	out, err := res.GetAsVersion(cfg.CNIVersion)
	if err != nil {
		return cnitypes.NewError(cnitypes.ErrIncompatibleCNIVersion, fmt.Sprintf("%s returned a result that cannot be given as version %s", cfg.Options.Delegate, cfg.CNIVersion), err.Error())
	}
	return out.PrintTo(p.stdout())
}

// adding is one ADD past its config: what its steps share.
type adding struct {
	p     *Plugin
	args  *skel.CmdArgs
	cfg   *conf.Config
	pod   conf.Pod
	log   *logger
	store *shim.Store
	exec  invoke.Exec
	cp    checkpoint.Dir
	rec   checkpoint.Record
	// recorder is an allocator that records the first address it chooses
	// itself (nil: the record is written here, before anything else).
	recorder RecordingAllocator
	// handOver names the earlier sandboxes whose entries on this interface
	// the reclaim left for the allocation to take over (nil: none).
	handOver map[string]bool
	// inFlight ends the mark that tells an earlier sandbox's DEL to leave
	// its entry on this interface to this ADD (checkpoint.Dir.Adding).
	inFlight func()
}

// done ends the ADD's mark: from handedOver on, an entry of an earlier
// sandbox on its interface is no longer this ADD's to take.
func (a *adding) done() {
	if a.inFlight != nil {
		a.inFlight()
	}
}

// checkpoint records the attachment before anything is allocated, so that
// a DEL after a crash anywhere below still knows its pools, even once the
// NAD is gone. A node agent's client that is gone has given up on this ADD:
// nothing is written yet, and nothing will be.
func (a *adding) checkpoint(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return cnitypes.NewError(cnitypes.ErrTryAgainLater, "ADD abandoned before it wrote anything", err.Error())
	}
	a.cp = checkpoint.Dir(a.cfg.Options.CheckpointDir)
	a.rec = checkpoint.Record{
		ContainerID: a.args.ContainerID, IfName: a.args.IfName, PodRef: a.pod.Ref(),
		Network: a.cfg.Network, NetworkName: a.cfg.IPAM.NetworkName,
		Kubeconfig: a.cfg.Kubeconfig(), Namespace: a.store.Namespace(),
	}
	for _, pl := range a.cfg.Pools {
		a.rec.Pools = append(a.rec.Pools, checkpoint.Pool{Name: pl.Name, Range: pl.Range})
	}
	// Marked, with what the record will say, before anything is written: a
	// DEL of an earlier sandbox of the pod knows this ADD from then on
	// (deleting.leaveToTaker), the record written or not yet.
	done, err := a.cp.Adding(a.rec)
	if err != nil {
		return cnitypes.NewError(cnitypes.ErrIOFailure, err.Error(), checkpointHint)
	}
	a.inFlight = done
	// An allocator that records writes the record itself, durably, with
	// the first address it chose and before it writes that address
	// anywhere: nothing is allocated for this attachment before then, and
	// one record written and fsynced is enough.
	if r, ok := a.p.Allocator.(RecordingAllocator); ok {
		a.recorder = r
	} else if err := a.cp.Write(a.rec); err != nil {
		return cnitypes.NewError(cnitypes.ErrIOFailure, err.Error(), checkpointHint)
	}
	a.p.at("add-after-checkpoint")
	return nil
}

// reclaimer is Plugin.reclaim or Plugin.reclaimFresh.
type reclaimer func(ctx context.Context, store *shim.Store, cp checkpoint.Dir, pool, network string, earlier shim.Picker, podRef string, log *logger) error

// reclaim releases what earlier sandboxes of the pod hold in each pool, but
// their entries on this ADD's interface: whereabouts (v0.8.0 and later, and
// the node agent's allocator) hands such an entry to the new sandbox in the
// write that allocates, so that the pod keeps its address and nothing ever
// reads the pod without it, as with whereabouts alone. A look that saw one
// has handedOver check, after the allocation, that it was.
func (a *adding) reclaim(ctx context.Context, how reclaimer) error {
	earlier := shim.EarlierSandboxes(a.pod.Ref(), a.args.ContainerID, a.args.IfName)
	onIfce := shim.EarlierOnInterface(a.pod.Ref(), a.args.ContainerID, a.args.IfName)
	pick := func(p *shim.Pool) []string {
		for _, off := range onIfce(p) {
			if a.handOver == nil {
				a.handOver = map[string]bool{}
			}
			a.handOver[p.Spec.Allocations[off].ContainerID] = true
		}
		return earlier(p)
	}
	return a.releaseEach(ctx, how, pick)
}

// handedOver, once the allocation is written, releases an entry of an
// earlier sandbox on this ADD's interface that the allocation did not take
// over (a whereabouts that hands nothing over): the reclaim's release,
// later. The earlier sandbox's record stays for its DEL, which finds
// nothing of its own left (or, before the hand-over, its entry: released,
// the allocation's write then fails on it and chooses again).
func (a *adding) handedOver(ctx context.Context) error {
	if a.handOver == nil {
		return nil
	}
	// Only the sandboxes the reclaim saw: an entry on this interface of a
	// container written since is not one this ADD was left, and may be a
	// later sandbox's, live (this ADD abandoned by its client, the runtime
	// gone on to the pod's next sandbox).
	onIfce := shim.EarlierOnInterface(a.pod.Ref(), a.args.ContainerID, a.args.IfName)
	left := func(p *shim.Pool) []string {
		var out []string
		for _, off := range onIfce(p) {
			if a.handOver[p.Spec.Allocations[off].ContainerID] {
				out = append(out, off)
			}
		}
		return out
	}
	return a.releaseEach(ctx, a.p.reclaim, left)
}

// failed, once the allocation failed, releases an entry of an earlier
// sandbox on this ADD's interface that the reclaim left for the allocation
// to take over: its sandbox's DEL may have left it to this ADD meanwhile, and
// no sandbox would hold it. The reclaim would have released it, with no
// hand-over to wait for. What the API server refuses here is the pod's next
// ADD's to release (the runtime tries the sandbox again), or the
// reconciler's once the pod is gone.
func (a *adding) failed(ctx context.Context) {
	if err := a.handedOver(ctx); err != nil {
		a.log.Errorf("after the failed allocation: %v", err)
	}
}

func (a *adding) releaseEach(ctx context.Context, how reclaimer, pick shim.Picker) error {
	for _, pool := range a.cfg.Pools {
		if err := how(ctx, a.store, a.cp, pool.Name, a.cfg.IPAM.NetworkName, pick, a.pod.Ref(), a.log); err != nil {
			return storeError(fmt.Sprintf("release earlier sandboxes of %s from pool %s", a.pod.Ref(), pool.Name), err)
		}
	}
	return nil
}

// allocate has the allocator (or whereabouts) allocate. An allocator
// in-process writes only on a pool that shows no earlier sandbox of the
// pod: one there, which the reclaim's look at a copy did not show, is
// released on a fresh read and the ADD allocates again. A full range is
// explained.
func (a *adding) allocate(ctx context.Context) (cnitypes.Result, error) {
	once := func() (cnitypes.Result, error) {
		switch {
		case a.recorder != nil:
			return a.recorder.AddRecording(ctx, a.store, a.cfg, a.args, a.rec)
		case a.p.Allocator != nil:
			return a.p.Allocator.Add(ctx, a.store, a.cfg, a.args)
		default:
			return delegate.Add(ctx, a.cfg.Options.Delegate, a.cfg.Delegated, a.exec, a.p.Env)
		}
	}
	res, err := once()
	for try := 1; errors.Is(err, shim.ErrEarlierSandbox); try++ {
		if try > earlierSandboxTries {
			return nil, storeError(fmt.Sprintf("release earlier sandboxes of %s", a.pod.Ref()), err)
		}
		a.log.Verbosef("%v: releasing it on a fresh read", err)
		if err := a.reclaim(ctx, a.p.reclaimFresh); err != nil {
			return nil, err
		}
		res, err = once()
	}
	if err == nil {
		return res, nil
	}
	derr := delegateError(a.cfg.Options.Delegate, "ADD", err)
	if ce, ok := derr.(*cnitypes.Error); ok && strings.Contains(err.Error(), rangeFull) && !a.p.ExplainedByClient {
		// The message people see in the pod's events: say why it is full.
		facts, hint := a.p.explainFull(a.store, a.cfg)
		ce.Msg += ": " + facts
		ce.Details = strings.TrimSuffix(hint+"; "+ce.Details, "; ")
		a.log.Errorf("%s", ce.Msg)
	}
	return nil, derr
}

// recordAddresses adds the addresses to the checkpoint. They are for people
// and GC's log; DEL finds the allocation by (container, ifname) in the pools
// already recorded, so a failure here must not undo an allocation that
// succeeded. An allocator in-process recorded each address before writing
// it: no second write (and fsync) of the same record.
func (a *adding) recordAddresses(res cnitypes.Result) {
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return
	}
	rec := a.rec
	for _, ip := range cur.IPs {
		rec.IPs = append(rec.IPs, ip.Address.String())
	}
	if have, ok, err := a.cp.Read(rec.ContainerID, rec.IfName); err != nil || !ok || !slices.Equal(have.IPs, rec.IPs) {
		if err := a.cp.Update(rec); err != nil {
			a.log.Errorf("record addresses %v: %v", rec.IPs, err)
		}
	}
}

// reclaim releases what earlier sandboxes of the pod hold in one pool. It
// looks first in the API server's watch cache, which costs the server little
// even for a pool of thousands of entries: when the cache shows no earlier
// sandbox, there is nothing to do now (an entry the cache has not seen yet is
// released by the next ADD or by the reconciler, never wrongly, since every
// write reads fresh). Otherwise it plans on a fresh read and releases.
//
// A node agent plans on its own copy of the pool (agent/cache), which its
// informer and its own writes keep current: the release judges each
// reservation under whereabouts' Lease on pools listed then, and removes an
// entry only by a patch guarded by the copy's resourceVersion, while the
// entry is still what the plan saw; a stale copy costs a fresh read.
func (p *Plugin) reclaim(ctx context.Context, store *shim.Store, cp checkpoint.Dir, pool, network string, earlier shim.Picker, podRef string, log *logger) error {
	return p.reclaimFrom(ctx, store, cp, pool, network, earlier, podRef, log, false)
}

// reclaimFresh is reclaim planned on a fresh read, whatever a copy shows.
func (p *Plugin) reclaimFresh(ctx context.Context, store *shim.Store, cp checkpoint.Dir, pool, network string, earlier shim.Picker, podRef string, log *logger) error {
	return p.reclaimFrom(ctx, store, cp, pool, network, earlier, podRef, log, true)
}

// earlierSandboxTries bounds the fresh reclaims of one ADD whose allocator
// found an earlier sandbox its reclaim had not seen: a second is needed only
// if an earlier sandbox's entry lands after the first, which the kubelet's
// one sandbox of a pod at a time leaves to a lost write already on its way.
const earlierSandboxTries = 3

func (p *Plugin) reclaimFrom(ctx context.Context, store *shim.Store, cp checkpoint.Dir, pool, network string, earlier shim.Picker, podRef string, log *logger, fresh bool) error {
	var plan shim.Plan
	if fresh {
		var err error
		if plan, err = store.Plan(ctx, pool, network, earlier); err != nil {
			return err
		}
		if plan.Empty() {
			return nil
		}
	} else if local := store.LocalPool(pool); local != nil {
		if len(earlier(local)) == 0 {
			return nil
		}
		var err error
		if plan, err = shim.PlanOf(local, network, earlier); err != nil {
			return err
		}
	} else {
		cached, err := store.CachedPool(ctx, pool)
		if err != nil {
			return err
		}
		if cached == nil || len(earlier(cached)) == 0 {
			return nil
		}
		if plan, err = store.Plan(ctx, pool, network, earlier); err != nil {
			return err
		}
	}
	if _, err := p.release(ctx, store, plan, "add", "earlier sandbox of "+podRef, log, nil); err != nil {
		return err
	}
	// An earlier sandbox on this node may never get its DEL (a reboot that
	// lost containerd's state): its records of this pool are done with,
	// unless it holds an entry the release left (one on another interface
	// that the ADD leaves for whereabouts to hand over): its DEL may still
	// have that one to release.
	seen := map[string]bool{}
	for _, e := range plan.Entries {
		seen[e.ContainerID] = true
	}
	if plan.Base != nil {
		released := map[string]bool{}
		for _, e := range plan.Entries {
			released[e.Offset] = true
		}
		for off, e := range plan.Base.Spec.Allocations {
			if !released[off] && seen[e.ContainerID] {
				seen[e.ContainerID] = false
			}
		}
	}
	for _, e := range plan.Entries {
		if !seen[e.ContainerID] {
			continue
		}
		seen[e.ContainerID] = false
		if _, err := cp.ForgetPool(e.ContainerID, store.Namespace(), pool); err != nil {
			log.Errorf("forget the checkpoint of %s: %v", e.ContainerID, err)
		}
	}
	return nil
}
