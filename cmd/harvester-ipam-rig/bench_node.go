package main

import (
	"context"
	"fmt"
	"time"

	"github.com/harvester/harvester-ipam/testcni"
)

// nodeBench measures what a user waits for on a real node: a pod sandbox's
// start (RunPodSandbox: containerd, runc, Multus, the cluster network and the
// storage network's IPAM) and its stop and removal, one sandbox at a time,
// harvester-ipam -> whereabouts v0.9.3 against whereabouts v0.9.3 alone, on
// the same node in the same run, the two sides interleaved.
func (b *bencher) node(ctx context.Context) error {
	n := envInt("BENCH_NODE_SANDBOXES", 40)
	t, err := b.rig.NewTenant(ctx, "bench-node")
	if err != nil {
		return err
	}
	if err := b.rig.InstallNADCRD(ctx); err != nil {
		return err
	}
	node, err := b.rig.StartNode(ctx, t, testcni.NodeOptions{Whereabouts: testcni.V093})
	if err != nil {
		return err
	}
	defer node.Close()
	type nodeSide struct {
		name       string
		net        *testcni.MultusNetwork
		pods       []testcni.Pod
		ids        []string
		run, stop  []time.Duration
		runFailed  int
		stopFailed int
	}
	sides := []*nodeSide{{name: "harvester-ipam"}, {name: "whereabouts v0.9.3"}}
	for i, s := range sides {
		ipam := []string{"harvester-ipam", "whereabouts"}[i]
		s.net, err = node.StorageNetwork(ctx, testcni.Network{IPAM: ipam, Range: fmt.Sprintf("10.%d.0.0/16", 210+i)}, "harvester-system", "bench-"+ipam, "lhnet1")
		if err != nil {
			return err
		}
		for j := 0; j < n; j++ {
			p, err := node.CreatePod(ctx, s.net, fmt.Sprintf("bench-%s-%03d", ipam, j))
			if err != nil {
				return err
			}
			s.pods = append(s.pods, p)
		}
	}
	// A failed start or stop (Multus reads the pod for 2.5 s at most, which a
	// loaded machine can exceed) is counted and retried, not timed.
	for j := 0; j < n; j++ {
		for _, s := range orderNode(j, sides) {
			for {
				began := time.Now()
				sb, err := node.RunPodSandbox(ctx, s.pods[j])
				if err != nil {
					if s.runFailed++; s.runFailed > n {
						return fmt.Errorf("%s: %w", s.name, err)
					}
					continue
				}
				s.run = append(s.run, time.Since(began))
				s.ids = append(s.ids, sb.ID)
				break
			}
		}
	}
	for j := 0; j < n; j++ {
		for _, s := range orderNode(j, sides) {
			for {
				began := time.Now()
				err := node.StopPodSandbox(ctx, s.ids[j])
				if err == nil {
					err = node.RemovePodSandbox(ctx, s.ids[j])
				}
				if err != nil {
					if s.stopFailed++; s.stopFailed > n {
						return fmt.Errorf("%s: %w", s.name, err)
					}
					continue
				}
				s.stop = append(s.stop, time.Since(began))
				break
			}
		}
	}
	h, w := sides[0], sides[1]
	fmt.Printf("## A real node: sandboxes through containerd %s, runc %s and Multus (%d sandboxes a side, one at a time)\n\n", testcni.ContainerdVersion, testcni.RuncVersion, n)
	fmt.Println("| | harvester-ipam -> whereabouts v0.9.3 | whereabouts v0.9.3 alone | ratio |")
	fmt.Println("|---|---|---|---|")
	row := func(what string, hv, wv []time.Duration) {
		fmt.Printf("| %s median | %s | %s | %.2fx |\n", what, ms(median(hv)), ms(median(wv)), ratio(median(hv), median(wv)))
		fmt.Printf("| %s p95 | %s | %s | %.2fx |\n", what, ms(p95(hv)), ms(p95(wv)), ratio(p95(hv), p95(wv)))
	}
	row("RunPodSandbox", h.run, w.run)
	row("StopPodSandbox + RemovePodSandbox", h.stop, w.stop)
	fmt.Printf("| failed and retried (start, stop) | %d, %d | %d, %d | |\n\n", h.runFailed, h.stopFailed, w.runFailed, w.stopFailed)
	return nil
}

// orderNode alternates which side goes first, so neither always runs warm.
func orderNode[T any](i int, s []T) []T {
	if i%2 == 0 {
		return s
	}
	return []T{s[1], s[0]}
}
