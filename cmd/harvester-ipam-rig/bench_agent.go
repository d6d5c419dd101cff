package main

import (
	"context"
	"fmt"
	"time"

	"github.com/harvester/harvester-ipam/agent/wire"
	"github.com/harvester/harvester-ipam/testcni"
)

// agentLatency: harvester-ipam standing in for whereabouts, alone and with
// a node agent serving its verbs (the agent running whereabouts' binary for
// ADD, as the plugin does), against whereabouts alone: one sandbox at a
// time, process start included, the sides interleaved.
func (b *bencher) agentLatency(ctx context.Context, n int) error {
	a, err := b.rig.StartAgent(ctx, nil, testcni.AgentOptions{Name: "bench-agent"})
	if err != nil {
		return err
	}
	defer a.Kill()
	alone := side{name: "stand-in", bin: b.rig.PluginBinary(), typ: "whereabouts", path: b.rig.StandInDir(b.wb), rng: "10.241.0.0/16", ifname: "lhnet1",
		env: []string{wire.EnvSocket + "=" + wire.NoAgent}}
	served := side{name: "stand-in via the agent", bin: b.rig.PluginBinary(), typ: "whereabouts", path: b.rig.StandInDir(b.wb), rng: "10.242.0.0/16", ifname: "lhnet2",
		env: []string{wire.EnvSocket + "=" + a.Socket, wire.EnvAckTimeout + "=" + testcni.AgentAckTimeout.String()}}
	w := side{name: "whereabouts " + b.wb, bin: b.rig.Tools["whereabouts-"+b.wb], typ: "whereabouts", path: b.rig.CNIDir(b.wb), rng: "10.243.0.0/16", ifname: "lhnet3"}
	sides := []side{alone, served, w}
	add := map[string][]time.Duration{}
	del := map[string][]time.Duration{}
	type sb struct{ id, pod string }
	var sbs []sb
	for i := 0; i < n; i++ {
		s := sb{b.id(), fmt.Sprintf("agent-bench-%04d", i)}
		sbs = append(sbs, s)
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "ADD", s.id, s.pod)
			if err != nil {
				return err
			}
			add[sd.name] = append(add[sd.name], m.Wall)
		}
	}
	for i, s := range sbs {
		for _, sd := range order(i, sides...) {
			m, err := b.call(ctx, sd, "DEL", s.id, s.pod)
			if err != nil {
				return err
			}
			del[sd.name] = append(del[sd.name], m.Wall)
		}
	}
	counts, err := a.Requests(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("## The node agent, one sandbox at a time, on whereabouts %s (%d sandboxes, process start included)\n\n", b.wb, n)
	fmt.Printf("The agent served %d ADDs and %d DELs (declined or lost: %d).\n\n", counts["ADD served"], counts["DEL served"], n*2-counts["ADD served"]-counts["DEL served"])
	fmt.Printf("| | harvester-ipam standing in, alone | ratio | standing in, via the node agent | ratio | whereabouts %s alone |\n", b.wb)
	fmt.Println("|---|---|---|---|---|---|")
	for _, v := range []struct {
		what string
		d    map[string][]time.Duration
	}{{"ADD", add}, {"DEL", del}} {
		for _, q := range []struct {
			name string
			at   func([]time.Duration) time.Duration
		}{{"median", median}, {"p95", p95}} {
			av, sv, wv := q.at(v.d[alone.name]), q.at(v.d[served.name]), q.at(v.d[w.name])
			fmt.Printf("| %s %s | %s | %.2fx | %s | %.2fx | %s |\n", v.what, q.name, ms(av), ratio(av, wv), ms(sv), ratio(sv, wv), ms(wv))
		}
	}
	fmt.Println()
	return nil
}
