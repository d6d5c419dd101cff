package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/testcni"
)

func (b *bencher) agentStorms(ctx context.Context, agents []*testcni.Agent) ([]benchRatio, error) {
	rounds := envInt("BENCH_STORM_ROUNDS", 3)
	kinds := []stormKind{
		{name: "storm of 24 ADDs, one node", pods: 24, nodes: 1, target: 0.2},
		{name: "storm of 48 ADDs, one node", pods: 48, nodes: 1, target: 0.1},
		{name: "storm of 96 ADDs, one node", pods: 96, nodes: 1, target: 0.1},
		{name: "storm of 48 ADDs, three nodes", pods: 48, nodes: 3, target: 0.2},
		{name: "storm after a reboot, 24 ADDs, one node", pods: 24, nodes: 1, reboot: true, target: 0.2},
		{name: "storm after a reboot, 48 ADDs, three nodes", pods: 48, nodes: 3, reboot: true, target: 0.2},
	}
	fmt.Printf("### Storms: ADDs started at once on one pool (%d rounds, the sides in turn; median of the rounds)\n\n", rounds)
	fmt.Println("After a reboot every pod still holds an earlier sandbox's entry and reservation: whereabouts alone hands the entry over to the new sandbox; harvester-ipam releases it (the reservation under whereabouts' Lease) and allocates.")
	fmt.Println()
	fmt.Printf("| | whereabouts %s alone: all allocated | exec path | ratio | agent | ratio | a median ADD (whereabouts, exec, agent) | failures, duplicates (whereabouts, exec, agent) | ADDs the agents served |\n", b.wb)
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var out []benchRatio
	seq := 0
	for _, k := range kinds {
		res := map[string][]stormResult{}
		var s agentSides
		for round := 0; round < rounds; round++ {
			seq++
			// Fresh pools each round: 10.(160+seq%64).{0,1,2}.0/24.
			third := 160 + seq%64
			s = b.newAgentSides(agents[:k.nodes], fmt.Sprintf("10.%d.0.0/24", third), fmt.Sprintf("10.%d.1.0/24", third), fmt.Sprintf("10.%d.2.0/24", third), "lhnet1")
			for _, which := range order(round, 0, 1, 2) {
				before := servedADDs(ctx, agents[:k.nodes])
				r, err := b.storm1(ctx, s, which, k, seq)
				if err != nil {
					return nil, err
				}
				if which == 2 {
					r.served = servedADDs(ctx, agents[:k.nodes]) - before
					if k.reboot {
						r.served -= k.pods // the sandboxes before the reboot
					}
				}
				name := []string{"wb", "exec", "agent"}[which]
				res[name] = append(res[name], r)
			}
			for _, rng := range []string{s.wb.rng, s.exec.rng, s.agent.rng} {
				if err := b.wipe(ctx, rng); err != nil {
					return nil, err
				}
			}
		}
		took := func(side string) time.Duration {
			var d []time.Duration
			for _, r := range res[side] {
				d = append(d, r.took)
			}
			return median(d)
		}
		adds := func(side string) time.Duration {
			var d []time.Duration
			for _, r := range res[side] {
				d = append(d, r.median)
			}
			return median(d)
		}
		bad := func(side string) (int, int) {
			f, d := 0, 0
			for _, r := range res[side] {
				f += r.failures
				d += r.dupes
			}
			return f, d
		}
		wv, ev, av := took("wb"), took("exec"), took("agent")
		wf, wd := bad("wb")
		ef, ed := bad("exec")
		af, ad := bad("agent")
		served := 0
		for _, r := range res["agent"] {
			served += r.served
		}
		fmt.Printf("| %s | %s | %s | %.2fx | %s | %.2fx | %s, %s, %s | %d/%d, %d/%d, %d/%d | %d of %d |\n", k.name, ms(wv), ms(ev), ratio(ev, wv), ms(av), ratio(av, wv),
			ms(adds("wb")), ms(adds("exec")), ms(adds("agent")), wf, wd, ef, ed, af, ad, served, k.pods*len(res["agent"]))
		out = append(out, benchRatio{what: k.name + ", all allocated", agent: av, exec: ev, wb: wv, target: k.target, failures: af + ef + wf, dupes: ad + ed + wd})
	}
	fmt.Println()
	return out, nil
}

// storm1 runs one side's storm: k.pods ADDs at once (after a reboot, of pods
// that each allocated with an earlier sandbox first, not timed), and checks
// that each got an address of its own.
func (b *bencher) storm1(ctx context.Context, s agentSides, which int, k stormKind, seq int) (stormResult, error) {
	sideOf := func(pod int) side {
		switch which {
		case 0:
			return s.wb
		case 1:
			return s.exec
		}
		return s.onNode(pod % k.nodes)
	}
	pod := func(p int) string { return fmt.Sprintf("storm-%03d-%02d", seq, p) }
	if k.reboot {
		// The sandboxes before the reboot, a few at a time.
		if err := parallel(ctx, k.pods, 6, func(p int) error {
			_, err := b.call(ctx, sideOf(p), "ADD", b.id(), pod(p))
			return err
		}); err != nil {
			return stormResult{}, err
		}
	}
	ids := make([]string, k.pods)
	for p := range ids {
		ids[p] = b.id()
	}
	ips := make([]string, k.pods)
	walls := make([]time.Duration, k.pods)
	errs := make([]error, k.pods)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for p := 0; p < k.pods; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			<-gate
			m, err := b.call(ctx, sideOf(p), "ADD", ids[p], pod(p))
			walls[p], errs[p] = m.Wall, err
			if err == nil {
				ips[p], errs[p] = resultIP(m.Stdout)
			}
		}(p)
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	r := stormResult{took: time.Since(start), median: median(walls)}
	seen := map[string]bool{}
	for p, err := range errs {
		if err != nil {
			r.failures++
			fmt.Fprintf(os.Stderr, "bench: %s: %s: %v\n", k.name, sideOf(p).name, err)
			continue
		}
		if seen[ips[p]] {
			r.dupes++
		}
		seen[ips[p]] = true
	}
	// The pool must hold exactly one entry per pod, the new sandbox's.
	pool, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Get(ctx, names.Pool(sideOf(0).rng, ""), metav1.GetOptions{})
	if err != nil {
		return r, err
	}
	byID := map[string]bool{}
	for _, id := range ids {
		byID[id] = true
	}
	held := 0
	for _, a := range pool.Spec.Allocations {
		if byID[a.ContainerID] {
			held++
		}
	}
	if r.failures == 0 && (held != k.pods || len(pool.Spec.Allocations) != k.pods) {
		return r, fmt.Errorf("%s, %s: the pool holds %d entries, %d of the storm's %d sandboxes (%d failed)",
			k.name, sideOf(0).name, len(pool.Spec.Allocations), held, k.pods, r.failures)
	}
	return r, nil
}

// resultIP is the address of a CNI result.
func resultIP(stdout string) (string, error) {
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res.IPs) != 1 {
		return "", fmt.Errorf("a result of one address expected: %q", stdout)
	}
	ip, _, err := net.ParseCIDR(res.IPs[0].Address)
	if err != nil {
		return "", err
	}
	return ip.String(), nil
}

// parallel runs fn(0..n-1), at most width at once; the first error.
func parallel(ctx context.Context, n, width int, fn func(int) error) error {
	work := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// wipe deletes a range's pool and the reservations of its addresses, as an
// operator would: not through CNI, untimed, so that the namespace's LISTs
// (whereabouts lists every pool at each ADD) stay as small for every side.
func (b *bencher) wipe(ctx context.Context, rng string) error {
	_, ipnet, err := net.ParseCIDR(rng)
	if err != nil {
		return err
	}
	c := b.rig.WB.WhereaboutsV1alpha1()
	if err := c.IPPools(testcni.PoolNamespace).Delete(ctx, names.Pool(rng, ""), metav1.DeleteOptions{}); err != nil {
		return err
	}
	l, err := c.OverlappingRangeIPReservations(testcni.PoolNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, o := range l.Items {
		if ip := net.ParseIP(o.Name); ip != nil && ipnet.Contains(ip) {
			if err := c.OverlappingRangeIPReservations(testcni.PoolNamespace).Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}
