package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/harvester/harvester-ipam/plugin"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/wire/client"
)

// The runtime plays the kubelet, containerd and the Multus thin plugin: it
// creates a pod's sandbox and attaches its networks one after the other (on
// the first failure it DELs what it attached and gives the sandbox up, as
// Multus and the kubelet do), it stops and removes sandboxes with DELs it
// retries until they succeed, and it loses sandboxes without any DEL when a
// node crashes or its state is lost.

// call runs one CNI verb of an attachment on a node, as Multus execs the
// IPAM plugin of a delegate: harvester-ipam for a storage network, whereabouts
// for a plain one. It returns the result's addresses for ADD.
func (w *world) call(a *actor, n *node, verb string, att *attachment, stdin []byte) (ips []net.IP, err error) {
	stdin = bytes.ReplaceAll(stdin, []byte("%CHECKPOINTS%"), []byte(n.cpDir))
	sb := att.sb
	cniArgs := fmt.Sprintf("IgnoreUnknown=true;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s", sb.pod.ns, sb.pod.name, sb.id)
	env := map[string]string{"CNI_COMMAND": verb, "CNI_CONTAINERID": sb.id, "CNI_IFNAME": att.ifname, "CNI_ARGS": cniArgs,
		"CNI_NETNS": "/var/run/netns/" + sb.id, "CNI_PATH": w.bin}
	a.env = env // the delegate reads them from the process's environment
	a.setEnv()
	a.inCall = n
	defer func() { a.env, a.inCall = nil, nil }()
	wb := &fake.Whereabouts{API: w.api, Version: w.o.Whereabouts, Namespace: poolNS, Options: w.options(""), Pick: w.s.pick,
		Unreserved: func(ip net.IP) { w.unreserved(att, ip) }}
	del := &fake.Delegate{WB: wb}
	args := &skel.CmdArgs{ContainerID: sb.id, IfName: att.ifname, Netns: env["CNI_NETNS"], Args: cniArgs, Path: w.bin, StdinData: stdin}
	var out bytes.Buffer
	defer func() {
		// A process killed mid-way unwinds to here (the runtime lives on);
		// the end of the schedule unwinds the whole actor.
		if r := recover(); r != nil {
			if _, ok := r.(goExit); !ok || a.abandoned {
				panic(r)
			}
			ips, err = nil, fmt.Errorf("netplugin failed: signal: killed")
		}
	}()
	if att.net.plain {
		// whereabouts alone: the runtime execs it directly.
		var run *addRun
		if verb == "ADD" && w.o.livenessOfPlain {
			run = w.beginAdd(a, att)
			defer w.endAdd(a, run)
		}
		var res []byte
		if verb == "DEL" {
			a.whereabouts = att
		}
		if verb == "ADD" {
			a.wbAdd = map[string]bool{}
		}
		res, err = del.ExecPlugin(context.Background(), "/opt/cni/bin/whereabouts", stdin, environ(env))
		a.whereabouts = nil
		read := a.wbAdd
		a.wbAdd = nil
		if verb == "ADD" && err != nil && strings.Contains(err.Error(), "already exists") && !readExisting(read, err) {
			// whereabouts' ADD wrote its entry and found the address's
			// reservation made meanwhile, after its own read found none:
			// under its Lease, only a writer without the Lease can have
			// made it. (One its read found, another pod's, on an address
			// it handed back to the pod, v0.8.0 and later, is whereabouts'
			// own hazard: it creates the reservation all the same.)
			att.lostReservationRace = true
		}
		out.Write(res)
		if run != nil && err == nil && !a.killed {
			ips, err = result(a, verb, out.Bytes(), nil)
			if err == nil {
				w.checkAdd(run, ips)
			}
			return ips, err
		}
	} else {
		p := &plugin.Plugin{
			Exec: del,
			// One process, one identity: harvester-ipam's is host and PID.
			NewStore: func(string) (*shim.Store, error) { return w.store("harvester-ipam/" + n.name + "/" + a.name), nil },
			Stdout:   &out, Stderr: io.Discard, Timeout: time.Hour,
			AtStep: func(step string) {
				if !w.quiet && w.o.Crashes && w.s.chance(w.o.CrashRate) {
					w.tr.add("CRASH at %s", step)
					w.stats["crashes"]++
					a.killed = true
					panic(goExit{})
				}
			},
		}
		// On a node with an agent, each verb is offered to it first.
		outcome := client.Fallback
		verbs := skel.CNIFuncs{Add: p.Add, Del: p.Del, GC: p.GC}
		if _, ok := w.agents[n.name]; ok {
			p.Agent = agentClient{w: w, n: n, a: a, outcome: &outcome}
			verbs = p.Funcs()
		}
		switch verb {
		case "ADD":
			run := w.beginAdd(a, att)
			defer w.endAdd(a, run)
			err = verbs.Add(args)
			if err == nil && !a.killed {
				ips, err = result(a, verb, out.Bytes(), nil)
				if err == nil && outcome != client.Served {
					// (one the agent served was checked as it returned)
					w.checkAdd(run, ips)
				}
				return ips, err
			}
		case "DEL":
			err = verbs.Del(args)
		case "GC":
			err = verbs.GC(args)
		}
	}
	return result(a, verb, out.Bytes(), err)
}

// result is what the runtime makes of a verb's outcome: ADD's addresses,
// in the order its result gives them (whereabouts': its ranges').
func result(a *actor, verb string, out []byte, err error) ([]net.IP, error) {
	if a.killed {
		return nil, fmt.Errorf("netplugin failed: signal: killed")
	}
	if err != nil || verb != "ADD" {
		return nil, err
	}
	var res current.Result
	if jerr := json.Unmarshal(out, &res); jerr != nil || len(res.IPs) == 0 {
		return nil, fmt.Errorf("ADD printed no result: %v: %s", jerr, out)
	}
	var ips []net.IP
	for _, ip := range res.IPs {
		ips = append(ips, ip.Address.IP)
	}
	return ips, nil
}

func environ(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// errText is what a CNI error says, for the trace.
func errText(err error) string {
	if ce, ok := err.(*cnitypes.Error); ok {
		return fmt.Sprintf("code %d: %s", ce.Code, ce.Msg)
	}
	return err.Error()
}

// startSandbox creates a new sandbox of p on its node and attaches its
// networks; on failure, it DELs what it attached and the sandbox is given up.
func (w *world) startSandbox(a *actor, p *pod) {
	n := w.node(p.node)
	if n == nil || !n.exists || !p.exists {
		return
	}
	w.ids++
	sb := &sandbox{id: fmt.Sprintf("c%03d-%s", w.ids, p.name), pod: p, node: n.name, state: sbCreating, netns: true}
	w.sbs = append(w.sbs, sb)
	if p.current != nil && p.current.state == sbLive {
		// The kubelet kills the old sandbox before it makes a new one.
		w.kill(p.current, "replaced", false)
	}
	p.current = sb
	w.tr.add("%s: new sandbox %s on %s", p.ref(), sb.id, n.name)
	// The kubelet's sandbox GC removes the pod's dead sandboxes (their DELs
	// owed) while the pod worker makes the new one. Not for a pod on
	// whereabouts alone: two whereabouts processes of one pod both take
	// whereabouts' Lease (its identity is the pod's name), a whereabouts bug
	// this simulation found, which harvester-ipam's DEL does not reach.
	for _, old := range w.sbs {
		if old.pod.name == p.name && old.state == sbDead && old.delPending && !old.lostCache && len(old.atts) > 0 && !old.plain() && w.s.chance(0.5) {
			dead := old
			w.spawnKubelet("gc "+dead.id, func(k *actor) { w.teardown(k, dead) })
		}
	}
	for _, ifn := range sortedKeys(p.nets) {
		net := p.nets[ifn]
		att := &attachment{sb: sb, ifname: ifn, net: net, config: net.config(w)}
		sb.atts = append(sb.atts, att)
		ips, err := w.call(a, n, "ADD", att, att.config)
		if a.killed {
			a.killed = false // the plugin died, not the runtime
		}
		if err != nil {
			w.tr.add("ADD %s failed: %s", att, errText(err))
			w.stats["failed ADDs"]++
			sb.state = sbDead
			sb.delPending = true
			w.teardown(a, sb)
			return
		}
		att.ips = ips
		w.tr.add("ADD %s -> %s", att, ipList(ips))
	}
	if sb.state != sbCreating || p.current != sb || !p.exists {
		// Killed (a reboot, the pod deleted) while it was being made.
		return
	}
	sb.state = sbLive
	w.s.dirty = true
	p.phase = podRunning
	// Multus writes the network-status at the end of ADD (and fails the ADD
	// when it cannot). Now and then it names only some of the interfaces (a
	// network attached later, a status written by an older Multus): the
	// reconciler must not judge the others by it.
	p.status, p.statusOf = map[string][]string{}, sb
	for i, att := range sb.atts {
		if i > 0 && !w.quiet && w.s.chance(0.2) {
			continue
		}
		for _, ip := range att.ips {
			p.status[att.ifname] = append(p.status[att.ifname], ip.String())
		}
	}
	w.stats["sandboxes"]++
}

// kill ends a sandbox without any DEL now; the runtime may still owe it
// one. A sandbox being stopped keeps its network namespace (and its
// interfaces their addresses) until its DELs; a crash or a reboot does not.
func (w *world) kill(sb *sandbox, why string, keepNetns bool) {
	if sb.state == sbCreating || sb.state == sbLive {
		sb.state = sbDead
		sb.delPending = true
		w.tr.add("sandbox %s of %s dies (%s)", sb.id, sb.pod.ref(), why)
	}
	if !keepNetns {
		sb.netns = false
	}
}

// teardown sends the DELs the runtime owes a dead sandbox, each retried
// until it succeeds (a few times while the world is rough: the kubelet
// comes back to it later).
func (w *world) teardown(a *actor, sb *sandbox) {
	if !sb.delPending || sb.state == sbDeleted {
		return
	}
	if sb.plain() && sb.pod.starting {
		// Not beside an ADD of the same pod on whereabouts alone: whereabouts'
		// own race (both processes hold its Lease, whose identity is the pod's
		// name; see startSandbox), not harvester-ipam's. Retried later.
		return
	}
	sb.tearing++
	defer func() { sb.tearing-- }()
	n := w.node(sb.node)
	if n == nil || !n.exists {
		return // the node is gone: no DEL will ever come
	}
	if sb.lostCache {
		// Multus cannot tell the storage networks any more: it calls no
		// IPAM, and tells the runtime all is clean.
		w.tr.add("DEL of %s: Multus' cache is gone, no IPAM called", sb.id)
		sb.delPending, sb.state, sb.netns = false, sbDeleted, false
		return
	}
	for i := len(sb.atts) - 1; i >= 0; i-- {
		att := sb.atts[i]
		att.delStarted = true
		for attempt := 1; ; attempt++ {
			stdin := w.delConfig(att)
			// An ADD of the attachment may still be under way: a node
			// agent's, whose client went away, goes on with what it had
			// begun (see checkDel).
			beside := w.addUnderWay(att)
			// An ADD of the pod's next sandbox on the node and interface,
			// under way at any time during the DEL, is left the entry to
			// take over (deleting.leaveToTaker): the pool-wide properties
			// hold it to that.
			takerBefore, since := w.takerUnderWay(att), w.addsBegun
			_, err := w.call(a, n, "DEL", att, stdin)
			if a.killed {
				a.killed = false
			}
			if err == nil {
				w.tr.add("DEL %s ok", att)
				taker := takerBefore || w.takerUnderWay(att) || w.takerBegun[takerKey(att)] > since
				if beside {
					w.stats["DEL checks: beside its own ADD still under way"]++
				} else if taker {
					w.stats["DEL checks: beside the ADD of the pod's next sandbox"]++
				} else {
					w.checkDel(att)
				}
				break
			}
			w.tr.add("DEL %s failed: %s", att, errText(err))
			if attempt >= 3 && !w.quiet {
				return // retried later
			}
			a.sleep(time.Duration(500+w.s.pick(2000)) * time.Millisecond)
			if n := w.node(sb.node); n == nil || !n.exists {
				return
			}
		}
	}
	sb.delPending, sb.state, sb.netns = false, sbDeleted, false
}

// delConfig is the config a DEL receives: what Multus cached at ADD, or,
// now and then, what a runtime without that cache has (only the type, the
// NAD gone), or one with an option of a newer release after a downgrade.
func (w *world) delConfig(att *attachment) []byte {
	if att.net.plain || w.quiet {
		return att.config
	}
	switch r := w.s.rng.Float64(); {
	case r < 0.1:
		return []byte(`{"cniVersion":"0.3.1","name":"` + att.net.name + `","ipam":{"type":"harvester-ipam","configuration_path":"/nonexistent","harvester_ipam":{"checkpoint_dir":"%CHECKPOINTS%"}}}`)
	case r < 0.15:
		return bytes.Replace(att.config, []byte(`"harvester_ipam":{`), []byte(`"harvester_ipam":{"a_future_option":true,`), 1)
	}
	return att.config
}

func (w *world) node(name string) *node {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// gc runs CNI GC on a node for one network, as a runtime that calls it does
// (CRI-O): every attachment it still knows of is valid.
func (w *world) gc(a *actor, n *node, net *network) {
	var valid []map[string]string
	for _, sb := range w.sbs {
		if sb.node == n.name && sb.state != sbDeleted {
			for _, att := range sb.atts {
				if att.net == net {
					valid = append(valid, map[string]string{"containerID": sb.id, "ifname": att.ifname})
				}
			}
		}
	}
	var conf map[string]any
	_ = json.Unmarshal(net.config(w), &conf)
	conf["cniVersion"] = "1.1.0"
	conf["cni.dev/valid-attachments"] = valid
	stdin, _ := json.Marshal(conf)
	// GC has no attachment: a stand-in carries the node's identity.
	probe := &attachment{sb: &sandbox{id: "gc", pod: &pod{ns: "-", name: "-"}, node: n.name}, net: net, ifname: "gc0"}
	_, err := w.call(a, n, "GC", probe, stdin)
	if a.killed {
		a.killed = false
	}
	w.tr.add("GC of %s on %s: %v", net.name, n.name, errOrOK(err))
}

func errOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	return strings.SplitN(errText(err), "\n", 2)[0]
}

// readExisting says whether whereabouts' ADD, failed on err ("... \"NAME\"
// already exists"), had itself read that reservation and found it.
func readExisting(read map[string]bool, err error) bool {
	for name, found := range read {
		if found && strings.Contains(err.Error(), strconv.Quote(name)+" already exists") {
			return true
		}
	}
	return false
}

// unreserved records that whereabouts' ADD of att left ip without its
// reservation (fake.Whereabouts.Unreserved): whereabouts' own bug, not the
// product's to keep.
func (w *world) unreserved(att *attachment, ip net.IP) {
	if att.unreserved == nil {
		att.unreserved = map[string]bool{}
	}
	att.unreserved[ip.String()] = true
	w.tr.add("whereabouts' ADD of %s leaves %s without its reservation: an earlier range's address had the pod's own (its skipOverlappingRangeUpdate)", att.name(), ip)
	w.stats["whereabouts' ADD leaves an address of a later range unreserved"]++
}
