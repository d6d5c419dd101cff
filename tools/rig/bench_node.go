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
// against whereabouts v0.9.3 alone, in the same run, the sides interleaved:
// harvester-ipam named in the NAD (on the same node as whereabouts alone),
// and harvester-ipam standing in for whereabouts, as the chart installs it,
// on a node of its own (there the name whereabouts is harvester-ipam's).
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
	standIn, err := b.rig.StartNode(ctx, t, testcni.NodeOptions{Whereabouts: testcni.V093, StandIn: true, Name: "standin"})
	if err != nil {
		return err
	}
	defer standIn.Close()
	type nodeSide struct {
		name       string
		node       *testcni.Node
		ipam       string // what the NAD names
		net        *testcni.MultusNetwork
		pods       []testcni.Pod
		ids        []string
		run, stop  []time.Duration
		runFailed  int
		stopFailed int
	}
	sides := []*nodeSide{
		{name: "harvester-ipam", node: node, ipam: "harvester-ipam"},
		{name: "stand-in", node: standIn, ipam: "whereabouts"},
		{name: "whereabouts v0.9.3", node: node, ipam: "whereabouts"},
	}
	for i, s := range sides {
		s.net, err = s.node.StorageNetwork(ctx, testcni.Network{IPAM: s.ipam, Range: fmt.Sprintf("10.%d.0.0/16", 210+i)}, "harvester-system", fmt.Sprintf("bench-%d", i), "lhnet1")
		if err != nil {
			return err
		}
		for j := 0; j < n; j++ {
			p, err := s.node.CreatePod(ctx, s.net, fmt.Sprintf("bench-%d-%03d", i, j))
			if err != nil {
				return err
			}
			s.pods = append(s.pods, p)
		}
	}
	// A failed start or stop (Multus reads the pod for 2.5 s at most, which a
	// loaded machine can exceed) is counted and retried, not timed.
	for j := 0; j < n; j++ {
		for _, s := range order(j, sides...) {
			for {
				began := time.Now()
				sb, err := s.node.RunPodSandbox(ctx, s.pods[j])
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
		for _, s := range order(j, sides...) {
			for {
				began := time.Now()
				err := s.node.StopPodSandbox(ctx, s.ids[j])
				if err == nil {
					err = s.node.RemovePodSandbox(ctx, s.ids[j])
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
	h, st, w := sides[0], sides[1], sides[2]
	fmt.Printf("## A real node: sandboxes through containerd %s, runc %s and Multus (%d sandboxes a side, one at a time)\n\n", testcni.ContainerdVersion, testcni.RuncVersion, n)
	fmt.Println("| | harvester-ipam -> whereabouts v0.9.3 (named in the NAD) | ratio | harvester-ipam standing in for whereabouts v0.9.3 | ratio | whereabouts v0.9.3 alone |")
	fmt.Println("|---|---|---|---|---|---|")
	row := func(what string, hv, sv, wv []time.Duration) {
		for _, q := range []struct {
			name string
			at   func([]time.Duration) time.Duration
		}{{"median", median}, {"p95", p95}} {
			a, b, c := q.at(hv), q.at(sv), q.at(wv)
			fmt.Printf("| %s %s | %s | %.2fx | %s | %.2fx | %s |\n", what, q.name, ms(a), ratio(a, c), ms(b), ratio(b, c), ms(c))
		}
	}
	row("RunPodSandbox", h.run, st.run, w.run)
	row("StopPodSandbox + RemovePodSandbox", h.stop, st.stop, w.stop)
	fmt.Printf("| failed and retried (start, stop) | %d, %d | | %d, %d | | %d, %d |\n\n", h.runFailed, h.stopFailed, st.runFailed, st.stopFailed, w.runFailed, w.stopFailed)
	return nil
}
