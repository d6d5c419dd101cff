package main

import (
	"context"
	"fmt"
	"time"

	"github.com/harvester/harvester-ipam/testcni"
)

// rebootDemo reboots a node with a few Longhorn pods on it, on the real
// runtime (containerd, Multus), three times; each reboot loses containerd's
// root (the node's disk replaced or wiped), so no DEL ever comes for the
// sandboxes of before. Two copies of the storage network side by side: one
// whose IPAM is whereabouts v0.7.0 alone, one whose IPAM is harvester-ipam
// delegating to that same whereabouts.
func rebootDemo(ctx context.Context, rig *testcni.Rig) error {
	const reboots = 3
	t, err := rig.NewTenant(ctx, "reboot")
	if err != nil {
		return err
	}
	if err := rig.InstallNADCRD(ctx); err != nil {
		return err
	}
	fmt.Printf("\nA node reboots, on the real runtime: containerd %s and runc %s run the sandboxes, Multus calls the\nstorage network's IPAM. Each reboot loses containerd's root, so no DEL comes for the sandboxes of before.\n",
		testcni.ContainerdVersion, testcni.RuncVersion)
	node, err := rig.StartNode(ctx, t, testcni.NodeOptions{Whereabouts: testcni.V070})
	if err != nil {
		return err
	}
	defer node.Close()

	type side struct {
		title string
		net   *testcni.MultusNetwork
		pods  []testcni.Pod
	}
	sides := []*side{
		{title: "whereabouts v0.7.0 alone"},
		{title: "harvester-ipam -> whereabouts v0.7.0"},
	}
	for i, s := range sides {
		ipam, rng := "whereabouts", "192.168.70"
		if i == 1 {
			ipam, rng = "harvester-ipam", "192.168.80"
		}
		s.net, err = node.StorageNetwork(ctx, testcni.Network{IPAM: ipam, Range: rng + ".0/27", Exclude: []string{rng + ".1/32", rng + ".2/32"}},
			"harvester-system", "storagenetwork-"+ipam, "lhnet1")
		if err != nil {
			return err
		}
		names := [][]string{
			{"instance-manager-6b77fd6b", "backing-image-manager-5f3c", "backing-image-ds-9d1b"},
			{"instance-manager-e2a0c4d1", "backing-image-manager-a81e", "backing-image-ds-47c2"},
		}[i]
		for _, name := range names {
			p, err := node.CreatePod(ctx, s.net, name)
			if err != nil {
				return err
			}
			s.pods = append(s.pods, p)
		}
	}
	start := func() error {
		for _, s := range sides {
			for _, p := range s.pods {
				if _, err := node.SyncPod(ctx, p, 2*time.Minute); err != nil {
					return fmt.Errorf("%s: %w", s.title, err)
				}
			}
		}
		return nil
	}
	show := func(what string) error {
		fmt.Printf("\n== %s ==\n", what)
		for _, s := range sides {
			allocs, err := s.net.Allocations(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("%s (pool %s): %d pods hold %d addresses\n%s", s.title, s.net.PoolName(), len(s.pods), len(allocs), testcni.Table(allocs))
		}
		return nil
	}
	if err := start(); err != nil {
		return err
	}
	if err := show(fmt.Sprintf("node %s up, %d Longhorn pods on each network", node.Name, len(sides[0].pods))); err != nil {
		return err
	}
	for i := 1; i <= reboots; i++ {
		if err := node.Reboot(ctx, true); err != nil {
			return err
		}
		if err := start(); err != nil {
			return err
		}
		if err := show(fmt.Sprintf("reboot %d of %d (containerd's root lost), the pods' new sandboxes", i, reboots)); err != nil {
			return err
		}
	}
	fmt.Println()
	for _, s := range sides {
		allocs, err := s.net.Allocations(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("%-40s %d pods, %d reboots: %d address(es) held, %d leaked, %d of 28 usable left\n",
			s.title+":", len(s.pods), reboots, len(allocs), len(allocs)-len(s.pods), 28-len(allocs))
	}
	return nil
}
