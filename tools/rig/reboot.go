package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/testcni"
)

// rebootDemo reboots a node with a few Longhorn pods on it, on a real node
// (a kubelet, containerd, Multus) of a cluster of the rig's own, twice; each
// reboot loses containerd's root (the node's disk replaced or wiped), so no
// DEL ever comes for the sandboxes of before, and the kubelet makes each pod
// a new one. Two nodes side by side, each with its copy of the storage
// network, whose NAD names whereabouts as Harvester writes it: on one
// whereabouts v0.7.0 alone; on the other whereabouts' install step ran, then
// harvester-ipam's installer, which stands in for it. On v0.7.0 only: v0.9.3 gives each
// pod's new sandbox the address its pod and ifname held, so the reboot leaks
// nothing there (run on v0.9.3 it ends 3 held / 0 leaked on both sides).
func rebootDemo(ctx context.Context, rig *testcni.Rig) (row, error) {
	const reboots = 2
	r := row{delegate: testcni.V070, name: fmt.Sprintf("node reboot x%d, root lost, 3 pods (kubelet)", reboots), aloneLeaks: true}
	c, err := rig.StartCluster(ctx, testcni.ClusterOptions{Name: "reboot", NoWebhook: true})
	if err != nil {
		return r, err
	}
	t, err := c.NewTenant(ctx, "reboot")
	if err != nil {
		return r, err
	}
	heading("node reboot on whereabouts %s, on a real node (Harvester's 2024 releases)", testcni.V070)
	fmt.Printf("A kubelet %s runs the pods, containerd %s and runc %s their sandboxes, Multus calls the storage network's\n"+
		"IPAM. Each reboot loses containerd's root, so no DEL comes for the sandboxes of before. (On %s a pod's new sandbox\n"+
		"gets its old address back, same pod and ifname, as the crash-loop row of %s shows: there the reboot leaks nothing.)\n",
		testcni.KubeVersion, testcni.ContainerdVersion, testcni.RuncVersion, testcni.V093, testcni.V093)
	type side struct {
		node  *testcni.Node
		title string
		net   *testcni.MultusNetwork
		pods  []testcni.Pod
		live  map[string]string // the pods' current sandboxes: container ID -> ifname
		tally *tally
	}
	sides := []*side{
		{title: sideTitle(testcni.Alone, testcni.V070), tally: &r.alone},
		{title: sideTitle(testcni.StandIn, testcni.V070), tally: &r.shimmed},
	}
	for i, s := range sides {
		ipam, rng := testcni.Alone, "192.168.70"
		if i == 1 {
			ipam, rng = testcni.StandIn, "192.168.80"
		}
		s.node, err = c.StartNode(ctx, t, testcni.NodeOptions{Kubelet: true, Whereabouts: testcni.V070, StandIn: ipam == testcni.StandIn, Name: "node-" + strings.ReplaceAll(ipam, "-", "")})
		if err != nil {
			return r, err
		}
		defer s.node.Close()
		s.net, err = s.node.StorageNetwork(ctx, testcni.Network{IPAM: ipam, Range: rng + ".0/27", Exclude: []string{rng + ".1/32", rng + ".2/32"}},
			"harvester-system", "storagenetwork-"+ipam, "lhnet1")
		if err != nil {
			return r, err
		}
		names := [][]string{
			{"instance-manager-6b77fd6b", "backing-image-manager-5f3c", "backing-image-ds-9d1b"},
			{"instance-manager-e2a0c4d1", "backing-image-manager-a81e", "backing-image-ds-47c2"},
		}[i]
		for _, name := range names {
			p, err := s.node.CreatePod(ctx, s.net, name)
			if err != nil {
				return r, err
			}
			s.pods = append(s.pods, p)
		}
	}
	// The kubelet runs the pods: wait until each is Ready with a sandbox
	// made since.
	start := func(since time.Time) error {
		for _, s := range sides {
			s.live = map[string]string{}
			sbs, err := s.node.WaitPodsReady(ctx, s.pods, since, 3*time.Minute)
			if err != nil {
				return fmt.Errorf("%s: %w", s.title, err)
			}
			for _, id := range sbs {
				s.live[id] = s.net.StorageIfName()
			}
		}
		return nil
	}
	show := func(what string) error {
		fmt.Printf("\n%s:\n", what)
		for _, s := range sides {
			if *s.tally, err = showPool(ctx, s.title, s.net.Network, s.pods, s.live); err != nil {
				return err
			}
		}
		return nil
	}
	if err := start(time.Time{}); err != nil {
		return r, err
	}
	if err := show(fmt.Sprintf("nodes %s and %s up, %d Longhorn pods on each", sides[0].node.Name, sides[1].node.Name, len(sides[0].pods))); err != nil {
		return r, err
	}
	for i := 1; i <= reboots; i++ {
		rebooted := time.Now()
		for _, s := range sides {
			if err := s.node.Reboot(ctx, true); err != nil {
				return r, err
			}
		}
		if err := start(rebooted); err != nil {
			return r, err
		}
		if err := show(fmt.Sprintf("reboot %d of %d (containerd's root lost), the pods' new sandboxes", i, reboots)); err != nil {
			return r, err
		}
	}
	return r, nil
}
