package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
)

// OrphanedSinceAnnotation, on an IPPool: when the reconciler first saw that
// no NAD names it (an old storage-network range, harvester/harvester#9501).
// Recorded only with DeleteOrphanedPools, and dropped once a NAD names the
// pool again.
const OrphanedSinceAnnotation = "harvester-ipam.harvesterhci.io/orphaned-since"

// OrphanedPool is the reason of a pool no NAD names.
const OrphanedPool Reason = "no NAD names it"

// reconcileOrphanedPools forgets the orphan sightings of pools a NAD names
// again and, with DeleteOrphanedPools, records first sightings and deletes
// the pools that no NAD has named for Grace and that hold no live entry.
// Nothing happens while the NADs are unknown: a pool kept is never wrong.
func (r *Reconciler) reconcileOrphanedPools(ctx context.Context, pools []shim.Pool, world World, now time.Time, rep *Report) error {
	nads := rep.NADs
	if nads == nil || !nads.Known {
		return nil
	}
	var errs []error
	var candidates []string
	for i := range pools {
		p := &pools[i]
		_, marked := p.Annotations[OrphanedSinceAnnotation]
		switch {
		case nads.Orphaned(p) && r.DeleteOrphanedPools:
			candidates = append(candidates, p.Name)
		case !nads.Orphaned(p) && marked && !r.DryRun:
			// Named again: its grace starts anew if it is ever orphaned again.
			if err := r.Store.SetPoolAnnotation(ctx, p.Name, OrphanedSinceAnnotation, func(*shim.Pool) string { return "" }); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(candidates) == 0 {
		return errors.Join(errs...)
	}
	// Judge on the pools as this pass left them: it may have released the
	// stale entries that were all an orphaned pool still held.
	now2, err := r.Store.Pools(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	byName := map[string]*shim.Pool{}
	for i := range now2 {
		byName[now2[i].Name] = &now2[i]
	}
	sb := SandboxesOf(now2)
	var fresh *NADs // listed again before the first delete
	for _, name := range candidates {
		p := byName[name]
		if p == nil {
			continue
		}
		if err := r.orphanedPool(ctx, p, world, sb, now, &fresh, rep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orphanedPool handles one pool no NAD names.
func (r *Reconciler) orphanedPool(ctx context.Context, p *shim.Pool, world World, sb Sandboxes, now time.Time, fresh **NADs, rep *Report) error {
	verdicts, err := Classify(p, world, sb)
	if err != nil {
		return err
	}
	live := 0
	for _, v := range verdicts {
		if !v.Stale() {
			live++
		}
	}
	since, recorded := parseTime(p.Annotations[OrphanedSinceAnnotation])
	row := Row{Kind: "pool", Pool: p.Name, IP: p.Spec.Range, PodRef: "-", Reason: OrphanedPool, Since: since}
	defer func() { rep.Rows = append(rep.Rows, row) }()
	switch {
	case !recorded && r.DryRun:
		row.Action = "wait " + r.Grace.String()
		return nil
	case !recorded:
		row.Since = ceilSecond(now)
		row.Action = "wait " + r.Grace.String()
		stamp := row.Since.Format(time.RFC3339)
		return r.Store.SetPoolAnnotation(ctx, p.Name, OrphanedSinceAnnotation, func(cur *shim.Pool) string {
			if have, ok := cur.Annotations[OrphanedSinceAnnotation]; ok {
				return have // another pass was first
			}
			return stamp
		})
	case live > 0:
		row.Action = fmt.Sprintf("kept: holds %d live entries", live)
		return nil
	case now.Sub(since) < r.Grace:
		row.Action = "wait " + (r.Grace - now.Sub(since)).Round(time.Second).String()
		return nil
	case r.DryRun:
		row.Action = "would delete"
		return nil
	}

	// A fresh look before deleting: the NADs listed again (once a pass),
	// the pods of its entries read one by one, the pool read fresh and
	// deleted only as judged then.
	if *fresh == nil {
		*fresh = IndexNADs(r.Cluster.NADs(ctx))
	}
	if !(*fresh).Orphaned(p) {
		row.Action = "kept: a NAD names it on a fresh look"
		return nil
	}
	due := make(map[string]shim.IPAllocation, len(p.Spec.Allocations))
	for off, a := range p.Spec.Allocations {
		due[off] = a
	}
	fw, err := r.freshWorld(ctx, due)
	if err != nil {
		row.Action = "kept: " + err.Error()
		return err
	}
	entries := len(p.Spec.Allocations)
	deleted, err := r.Store.DeletePool(ctx, p.Name, func(cur *shim.Pool) bool {
		if _, ok := cur.Annotations[OrphanedSinceAnnotation]; !ok {
			return false
		}
		vs, err := Classify(cur, fw, sb)
		if err != nil {
			return false
		}
		for _, v := range vs {
			if !v.Stale() {
				return false
			}
		}
		entries = len(vs)
		return true
	})
	if err != nil {
		row.Action = "kept: " + err.Error()
		return err
	}
	if !deleted {
		row.Action = "kept: changed since it was read (judged again next pass)"
		return nil
	}
	row.Action = "delete"
	rep.DeletedPools = append(rep.DeletedPools, p.Name)
	r.emit(ctx, corev1.ObjectReference{APIVersion: "whereabouts.cni.cncf.io/v1alpha1", Kind: "IPPool", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		"OrphanedPoolDeleted",
		fmt.Sprintf("deleted pool %s (range %s): no NAD has named it since %s, and it held no live entry (%d stale)", p.Name, p.Spec.Range, since.Format(time.RFC3339), entries))
	return nil
}
