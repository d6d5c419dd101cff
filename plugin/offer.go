package plugin

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

// answerGrace is how much longer than a verb's timeout the plugin waits for
// the node agent's answer: the agent's own timeout of the verb, which starts
// a little later, then answers first.
const answerGrace = 10 * time.Second

// through is a verb offered to the node agent first: its answer when it
// serves, the verb done here otherwise (and at once for a node-slice
// config, which the agent never serves). An ADD the agent took and lost (the
// connection broke after go) is done here too, after the attachment's
// entries are released: see addAfterLost. A DEL, CHECK, GC or STATUS lost
// is done again here as it is: each is idempotent.
func (p *Plugin) through(command string) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		if p.Agent == nil {
			return p.Run(context.Background(), command, args)
		}
		// A config that never names the key (almost every one) is not
		// parsed for it on every verb's way to the agent; one that names it
		// otherwise (escaped) is declined by the agent, with the same result.
		if bytes.Contains(args.StdinData, []byte(`"node_slice_size"`)) && nodeSlices(args.StdinData) {
			// The agent declines every verb of it (agent.admitLoaded):
			// not asked, which on a busy node costs a wait for its CPU.
			here := *p
			here.fallback = "node_slice_size: whereabouts' own, not offered to the node agent"
			return here.Run(context.Background(), command, args)
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.timeout()+answerGrace)
		res := p.Agent.Do(ctx, requestOf(command, args))
		cancel()
		if res.Outcome == client.Served {
			if command == wire.Add && res.Answer.Error != nil {
				e := &cnitypes.Error{Code: res.Answer.Error.Code, Msg: res.Answer.Error.Msg, Details: res.Answer.Error.Details}
				p.explainServed(args, e)
				res.Answer.Error.Msg, res.Answer.Error.Details = e.Msg, e.Details
			}
			return p.answer(res.Answer)
		}
		here := *p
		here.fallback = res.Reason
		if res.Outcome == client.Lost && command == wire.Add {
			return here.addAfterLost(context.Background(), args)
		}
		return here.Run(context.Background(), command, args)
	}
}

// requestOf is a verb as the agent takes it: the CNI environment as skel
// read it, and the config.
func requestOf(command string, args *skel.CmdArgs) wire.Request {
	env := map[string]string{
		wire.EnvContainerID: args.ContainerID,
		wire.EnvNetns:       args.Netns,
		wire.EnvIfName:      args.IfName,
		wire.EnvArgs:        args.Args,
		wire.EnvPath:        args.Path,
	}
	if args.NetnsOverride != "" {
		env[wire.EnvNetnsOverride] = args.NetnsOverride
	}
	return wire.NewRequest(command, env, args.StdinData)
}

// answer gives the agent's answer as the plugin gives its own: the log on
// stderr, the result on stdout or the CNI error.
func (p *Plugin) answer(a wire.Answer) error {
	if len(a.Stderr) > 0 {
		_, _ = p.stderr().Write(a.Stderr)
	}
	if len(a.Log) > 0 {
		p.appendLog(a.LogFile, a.Log)
	}
	if a.Error != nil {
		return &cnitypes.Error{Code: a.Error.Code, Msg: a.Error.Msg, Details: a.Error.Details}
	}
	_, err := p.stdout().Write(a.Stdout)
	return err
}

// appendLog writes what the agent logged for a log file to that file, as
// the plugin's own logger would have (the file is the host's); a file that
// is not an absolute path, or does not open, gets stderr.
func (p *Plugin) appendLog(file string, lines []byte) {
	if filepath.IsAbs(file) {
		f, err := os.OpenFile(filepath.Clean(file), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err == nil {
			_, err = f.Write(lines)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				return
			}
		}
		fmt.Fprintf(p.stderr(), "harvester-ipam: cannot write log_file %s: %v; logging to stderr\n", file, err)
	}
	_, _ = p.stderr().Write(lines)
}

// addAfterLost is ADD after the node agent took it and the connection
// broke before its answer: the agent may have allocated for this very
// attachment (CNI_CONTAINERID, CNI_IFNAME). ADD's reclaim keeps the current
// container's entries, and whereabouts v0.7.0 never hands back an existing
// one, so a second address would be allocated beside the first; and
// whereabouts' ADD (every version) fails after writing its pool entry when
// its reservation is already there. So what the attachment holds in the
// config's pools is released first, as DEL releases it, then ADD runs here
// as ever.
func (p *Plugin) addAfterLost(ctx context.Context, args *skel.CmdArgs) error {
	if err := p.releaseLost(ctx, args); err != nil {
		return err
	}
	return p.add(ctx, args)
}

func (p *Plugin) releaseLost(ctx context.Context, args *skel.CmdArgs) error {
	if unmanagedAdd(args) != "" {
		return nil // handed on to whereabouts as it came, by the agent as here
	}
	cfg, err := p.loadForAttachment(args)
	if err != nil {
		return nil // nothing can have been allocated by it; ADD says why
	}
	reason := p.fallback
	log := p.logger(cfg, "ADD", args.ContainerID)
	defer log.close()
	log.Verbosef("the node agent took this ADD and did not answer (%s): releasing what %s/%s holds, then allocating here", reason, args.ContainerID, args.IfName)
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return err
	}
	defer log.retried(store)
	// The addresses this attachment recorded, and those the sandbox's other
	// attachments to each pool did: an entry without an ifname is this
	// one's only at an address of none of them.
	sib, own, errs := readSiblings(checkpoint.Dir(cfg.Options.CheckpointDir), args.ContainerID, args.IfName)
	for _, err := range errs {
		log.Errorf("ignoring unreadable checkpoint: %v", err)
	}
	var recorded []net.IP
	for _, rec := range own {
		recorded = append(recorded, rec.Addresses()...)
	}
	for _, pool := range cfg.Pools {
		ns := store.Namespace()
		pick := shim.LostAttachment(args.ContainerID, args.IfName, recorded, sib.of(ns, pool.Name), sib.unsureOf(ns, pool.Name))
		plan, err := store.Plan(ctx, pool.Name, cfg.IPAM.NetworkName, pick)
		if err != nil {
			return storeError(fmt.Sprintf("read pool %s/%s", store.Namespace(), pool.Name), err)
		}
		if _, err := p.release(ctx, store, plan, "lost", fmt.Sprintf("ADD of %s/%s lost by the node agent", args.ContainerID, args.IfName), log, nil); err != nil {
			return storeError(fmt.Sprintf("release %s/%s from pool %s/%s", args.ContainerID, args.IfName, store.Namespace(), pool.Name), err)
		}
	}
	// The agent releases the entries first: killed before it judged their
	// reservations (the reclaim of an earlier sandbox of this pod), it left
	// them without entries, where this ADD's reclaim does not look and
	// whereabouts v0.7.0 takes their addresses as taken. The earlier
	// sandbox's checkpoint on this node still names them (it is removed
	// only by its DEL or GC).
	// Only addresses an earlier sandbox of the pod recorded on this node.
	if pod, err := conf.ParseArgs(args.Args); err == nil {
		all, _ := checkpoint.Dir(cfg.Options.CheckpointDir).List()
		var earlier []net.IP
		for _, rec := range all {
			if rec.PodRef == pod.Ref() && rec.ContainerID != args.ContainerID && rec.Namespace == store.Namespace() {
				earlier = append(earlier, rec.Addresses()...)
			}
		}
		deleted, err := store.ReleaseStrayReservations(ctx, pod.Ref(), cfg.IPAM.NetworkName, earlier)
		if err != nil {
			return storeError(fmt.Sprintf("release the reservations of %s that no entry holds in %s", pod.Ref(), store.Namespace()), err)
		}
		if len(deleted) > 0 {
			log.Verbosef("released reservations of %s that no entry holds (a release the node agent did not finish): %s", pod.Ref(), strings.Join(deleted, ", "))
		}
	}
	return nil
}
