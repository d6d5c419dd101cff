package main

import (
	"context"
	"fmt"

	"github.com/harvester/harvester-ipam/testcni"
)

// demo crash-loops one Longhorn pod on two copies of Harvester's storage
// network, a /27 with the first two addresses excluded: one whose IPAM is
// whereabouts v0.7.0 (what Harvester's 2024 releases ship), one whose IPAM is
// harvester-ipam delegating to that same whereabouts.
func demo(ctx context.Context, rig *testcni.Rig) error {
	const restarts = 6
	alone, err := rig.AddNetwork(testcni.Network{Name: "storagenetwork-whereabouts", IPAM: "whereabouts", Whereabouts: testcni.V070,
		Range: "192.168.50.0/27", Exclude: []string{"192.168.50.1/32", "192.168.50.2/32"}})
	if err != nil {
		return err
	}
	shimmed, err := rig.AddNetwork(testcni.Network{Name: "storagenetwork-harvester-ipam", IPAM: "harvester-ipam", Whereabouts: testcni.V070,
		Range: "192.168.60.0/27", Exclude: []string{"192.168.60.1/32", "192.168.60.2/32"}})
	if err != nil {
		return err
	}
	pod := testcni.Pod{Namespace: "longhorn-system", Name: "instance-manager-6b77fd6b240ff0e6"}
	nets := []*testcni.Network{alone, shimmed}
	titles := []string{"whereabouts v0.7.0 alone", "harvester-ipam -> whereabouts v0.7.0"}
	last := make([]*testcni.Sandbox, len(nets))

	fmt.Printf("\nA crash-looping storage-network pod, %s: each sandbox dies without its DEL,\nas when a node reboots or sandbox creation fails. The pool after each new sandbox:\n", pod.Ref())
	for i := 1; i <= restarts; i++ {
		fmt.Printf("\n== sandbox %d of %d ==\n", i, restarts)
		for j, n := range nets {
			if last[j] != nil {
				if err := last[j].Kill(); err != nil {
					return err
				}
			}
			s, err := rig.NewSandbox(n, pod, "lhnet1")
			if err != nil {
				return err
			}
			if err := s.Add(ctx); err != nil {
				return fmt.Errorf("%s: %w", titles[j], err)
			}
			last[j] = s
			allocs, err := n.Allocations(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("%s (pool %s): the pod holds %d, this sandbox got %s\n%s", titles[j], n.PoolName(), len(testcni.Of(allocs, pod.Ref())), s.IP(), testcni.Table(allocs))
		}
	}
	fmt.Println()
	for j, n := range nets {
		allocs, err := n.Allocations(ctx)
		if err != nil {
			return err
		}
		held := len(testcni.Of(allocs, pod.Ref()))
		fmt.Printf("%-40s %d sandboxes, %d address(es) held, %d leaked, %d of 28 usable left\n",
			titles[j]+":", restarts, held, held-1, 28-len(allocs))
	}
	return rebootDemo(ctx, rig)
}
