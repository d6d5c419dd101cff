package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/testcni"
)

// largePool: 10,000 allocations of other pods in one pool.
func (b *bencher) largePool(ctx context.Context, k int) error {
	// whereabouts allocates from the bottom: the fill holds offsets 2 to
	// size+1 and the section's ADDs the next few dozen, so the earlier
	// sandboxes' entries go well above.
	const size, runs, plantAt = 10000, 10, 60000
	h, w := b.sides(delegateRange(64, k, 0), delegateRange(64, k, 1))
	for _, sd := range []side{h, w} {
		if err := b.fill(ctx, names.Pool(sd.rng, ""), sd.rng, size); err != nil {
			return err
		}
	}
	// The reclaim step as the plugin runs it, timed by its own debug log.
	logFile := filepath.Join(b.rig.Dir, "bench-large-"+b.wb+".log")
	hd := h
	hd.extra = fmt.Sprintf(`,"log_level":"debug","log_file":%q`, logFile)
	var reclaim, reclaimOne, addQuiet, addOne, write, addH, addW []time.Duration
	var share, shareOne []float64 // of the reclaim in its own ADD
	pool := names.Pool(h.rng, "")
	for i := 0; i < runs; i++ {
		id := b.id()
		m, err := b.call(ctx, hd, "ADD", id, fmt.Sprintf("big-quiet-%02d", i))
		if err != nil {
			return err
		}
		d, err := phase(logFile, id, "reclaim")
		if err != nil {
			return err
		}
		reclaim, addQuiet, share = append(reclaim, d), append(addQuiet, m.Wall), append(share, ratio(d, m.Wall))
	}
	for i := 0; i < runs; i++ {
		// One earlier sandbox to release: reservation, guarded patch.
		pod := fmt.Sprintf("crashy-%02d", i)
		took, err := b.plant(ctx, pool, strconv.Itoa(plantAt+i), whereaboutsv1alpha1.IPAllocation{ContainerID: b.id(), PodRef: "longhorn-system/" + pod, IfName: "lhnet0"})
		if err != nil {
			return err
		}
		write = append(write, took)
		id := b.id()
		m, err := b.call(ctx, hd, "ADD", id, pod)
		if err != nil {
			return err
		}
		d, err := phase(logFile, id, "reclaim")
		if err != nil {
			return err
		}
		reclaimOne, addOne, shareOne = append(reclaimOne, d), append(addOne, m.Wall), append(shareOne, ratio(d, m.Wall))
	}
	for i := 0; i < runs; i++ {
		for _, sd := range order(i, h, w) {
			m, err := b.call(ctx, sd, "ADD", b.id(), fmt.Sprintf("big-%02d", i))
			if err != nil {
				return err
			}
			if sd.name == h.name {
				addH = append(addH, m.Wall)
			} else {
				addW = append(addW, m.Wall)
			}
		}
	}
	fmt.Printf("## A large pool, on whereabouts %s: %d allocations of other pods (%d runs each)\n\n", b.wb, size, runs)
	fmt.Println("| | median | p95 | the reclaim's share of its own ADD (median) |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| reclaim step, nothing to release (a read from the watch cache) | %s | %s | %.1f%% |\n", ms(median(reclaim)), ms(p95(reclaim)), 100*medianFloat(share))
	fmt.Printf("| reclaim step, one earlier sandbox (cached read, Lease, fresh read, guarded patch) | %s | %s | %.1f%% |\n", ms(median(reclaimOne)), ms(p95(reclaimOne)), 100*medianFloat(shareOne))
	fmt.Printf("| ADD, harvester-ipam, nothing to release (debug log on) | %s | %s | |\n", ms(median(addQuiet)), ms(p95(addQuiet)))
	fmt.Printf("| ADD, harvester-ipam, one earlier sandbox (debug log on) | %s | %s | |\n", ms(median(addOne)), ms(p95(addOne)))
	fmt.Printf("| ADD, harvester-ipam, nothing to release, beside whereabouts alone | %s | %s | |\n", ms(median(addH)), ms(p95(addH)))
	fmt.Printf("| ADD, whereabouts %s alone | %s | %s | ratio %.2fx |\n", b.wb, ms(median(addW)), ms(p95(addW)), ratio(median(addH), median(addW)))
	// A release writes the whole object at least once, and the ADD that
	// releases also waits for whereabouts' own: the share's floor.
	fmt.Printf("| one update of the whole pool, nothing else (the bench planting the earlier sandbox's entry) | %s | %s | floor of the one-earlier share: %.1f%% |\n\n",
		ms(median(write)), ms(p95(write)), 100*ratio(median(write), median(write)+median(addW)))
	return nil
}

// fill creates a pool of range rng with n allocations of distinct pods.
func (b *bencher) fill(ctx context.Context, name, rng string, n int) error {
	allocs := make(map[string]whereaboutsv1alpha1.IPAllocation, n)
	for i := 0; i < n; i++ {
		allocs[strconv.Itoa(i+2)] = whereaboutsv1alpha1.IPAllocation{ContainerID: fmt.Sprintf("filler%06d", i), PodRef: fmt.Sprintf("longhorn-system/filler-%06d", i), IfName: "lhnet1"}
	}
	_, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Create(ctx, &whereaboutsv1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}, metav1.CreateOptions{})
	return err
}

// plant writes one more allocation into pool as whereabouts writes: a GET,
// then an update of the whole object. It says how long the update took. It
// never writes over an entry: that entry's ORIP would stay behind, and
// whereabouts then fails on its address at every later ADD of the pool.
func (b *bencher) plant(ctx context.Context, pool, off string, a whereaboutsv1alpha1.IPAllocation) (time.Duration, error) {
	p, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Get(ctx, pool, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if cur, ok := p.Spec.Allocations[off]; ok {
		return 0, fmt.Errorf("plant %s at offset %s of pool %s: the offset holds %s's entry", a.PodRef, off, pool, cur.PodRef)
	}
	p.Spec.Allocations[off] = a
	start := time.Now()
	_, err = b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Update(ctx, p, metav1.UpdateOptions{})
	return time.Since(start), err
}

var requestsRE = regexp.MustCompile(`(\d+) API requests, (\S+)`)

// reconciler: passes over growing clusters; the requests per pass should grow
// with pools and stale entries, not with allocations.
func (b *bencher) reconciler(ctx context.Context) error {
	fmt.Println("## The reconciler: one pass (--grace 0s, so the stale entries are released in it)")
	fmt.Println()
	fmt.Println("| pools | allocations | pods | stale | wall time | API requests | released |")
	fmt.Println("|---|---|---|---|---|---|---|")
	type size struct{ pools, perPool, pods, stale int }
	// The pools of the sections above name pods that were never created:
	// gone, to a reconciler. Each size below stands alone.
	if err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	podsMade := 0
	for i, sz := range []size{{2, 2500, 1000, 50}, {20, 2500, 10000, 50}, {20, 2500, 10000, 500}} {
		if err := b.makePods(ctx, podsMade, sz.pods); err != nil {
			return err
		}
		if sz.pods > podsMade {
			podsMade = sz.pods
		}
		// Fresh pools for this size: entries cycle over the pods; the first
		// `stale` entries of the first pool name pods that do not exist.
		prefix := fmt.Sprintf("rc%d", i)
		for p := 0; p < sz.pools; p++ {
			allocs := make(map[string]whereaboutsv1alpha1.IPAllocation, sz.perPool)
			for a := 0; a < sz.perPool; a++ {
				pod := fmt.Sprintf("longhorn-system/rc-pod-%05d", (p*sz.perPool+a)%sz.pods)
				if p == 0 && a < sz.stale {
					pod = fmt.Sprintf("longhorn-system/rc-gone-%05d", a)
				}
				allocs[strconv.Itoa(a+1)] = whereaboutsv1alpha1.IPAllocation{ContainerID: fmt.Sprintf("%s-%d-%d", prefix, p, a), PodRef: pod, IfName: "lhnet1"}
			}
			rng := rcRange(i, p)
			if _, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Create(ctx, &whereaboutsv1alpha1.IPPool{
				ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + names.Pool(rng, "")}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		res, err := b.rig.Reconciler(ctx, "--grace", "0s")
		if err != nil {
			return err
		}
		if res.Exit != 0 {
			return fmt.Errorf("reconciler: %s %s", res.Stdout, res.Stderr)
		}
		m := requestsRE.FindStringSubmatch(res.Stdout)
		if m == nil {
			return fmt.Errorf("reconciler printed no summary: %s", lastLine(res.Stdout))
		}
		total := regexp.MustCompile(`(\d+) pools, (\d+) allocations`).FindStringSubmatch(res.Stdout)
		released := regexp.MustCompile(`(\d+) allocations released`).FindStringSubmatch(res.Stdout)
		if released == nil || total == nil {
			return fmt.Errorf("reconciler printed no summary: %s", lastLine(res.Stdout))
		}
		fmt.Printf("| %s | %s | %d | %d | %s | %s | %s |\n", total[1], total[2], sz.pods, sz.stale, m[2], m[1], released[1])
		// Drop this size's pools so the next size stands alone.
		for p := 0; p < sz.pools; p++ {
			rng := rcRange(i, p)
			_ = b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Delete(ctx, prefix+"-"+names.Pool(rng, ""), metav1.DeleteOptions{})
		}
	}
	fmt.Println()
	return nil
}

// rcRange is the /20 of pool p of size i: 10.128.0.0/20 onwards, 32 a size.
func rcRange(i, p int) string {
	n := uint32(10)<<24 | uint32(128)<<16 | uint32(i*32+p)<<12
	return fmt.Sprintf("%d.%d.%d.%d/20", n>>24, n>>16&255, n>>8&255, n&255)
}

// makePods creates pods rc-pod-from .. rc-pod-(to-1), running, with 8 workers.
func (b *bencher) makePods(ctx context.Context, from, to int) error {
	if err := b.rig.EnsureNamespace(ctx, "longhorn-system"); err != nil {
		return err
	}
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: fmt.Sprintf("rc-pod-%05d", i)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "registry.invalid/x"}}}}
				created, err := b.rig.Kube.CoreV1().Pods("longhorn-system").Create(ctx, p, metav1.CreateOptions{})
				if err == nil {
					created.Status.Phase = corev1.PodRunning
					_, err = b.rig.Kube.CoreV1().Pods("longhorn-system").UpdateStatus(ctx, created, metav1.UpdateOptions{})
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}
