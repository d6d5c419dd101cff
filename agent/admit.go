package agent

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/wire"
)

// ipamKeys are the ipam fields whereabouts reads (pkg/types IPAMConfig,
// v0.7.0 to v0.9.4), spelled as it documents them, and harvester-ipam's
// own. The agent declines a config with any other: a field it does not know
// may mean something it would not honour. etcd's are left out: whereabouts
// keeps its pools in Kubernetes only.
var ipamKeys = map[string]bool{
	"type": true, conf.OptionsKey: true,
	"addresses": true, "configuration_path": true, "datastore": true, "dns": true,
	"enable_overlapping_ranges": true, "exclude": true, "gateway": true, "ipRanges": true,
	"kubernetes": true, "leader_lease_duration": true, "leader_renew_deadline": true,
	"leader_retry_period": true, "log_file": true, "log_level": true, "network_name": true,
	"range": true, "range_end": true, "range_start": true, "reconciler_cron_expression": true,
	"routes": true, "sleep_for_race": true,
	// read, and declined below with a reason of its own
	"node_slice_size": true,
}

// admit decides whether the agent serves req. It reads the config, the
// kubeconfig's namespace and, for DEL, the checkpoint; it writes nothing.
// A decline is a short reason (the metrics' label) and what to log and
// tell the client.
func (s *Server) admit(req wire.Request) (j *Job, reason, detail string) {
	if d := s.ready(req); d != nil {
		return nil, d.reason, d.detail
	}
	j = s.job(req)
	if req.Command == wire.Probe {
		return j, "", ""
	}
	if d := s.admitConfig(j); d != nil {
		return nil, d.reason, d.detail
	}
	return j, "", ""
}

// declined is why the agent leaves a request to the plugin: a short reason
// (the metrics' label) and what to log and tell the client.
type declined struct{ reason, detail string }

func decline(reason, format string, a ...any) *declined {
	return &declined{reason, fmt.Sprintf(format, a...)}
}

// ready says why the agent serves no request now (nil: it may): stopping,
// unhealthy, its copy behind, or a request from its own delegate.
func (s *Server) ready(req wire.Request) *declined {
	if d := s.declinesAll(); d != nil {
		return d
	}
	if req.Env[wire.EnvGuard] != "" {
		return decline("guard", "started as a delegate of harvester-ipam (%s is set)", wire.EnvGuard)
	}
	return nil
}

// declinesAll says why the agent declines every request now, the probe's
// too (nil: it serves): stopping, unhealthy, or its copy of the pools
// behind. So its readiness probe fails, saying why, and the metric
// harvester_ipam_agent_declining names the reason, while the plugin does
// every verb alone. A change of whether the copy follows is logged.
func (s *Server) declinesAll() *declined {
	if s.stopping.Load() {
		return decline("stopping", "stopping")
	}
	if h := s.health.Load(); h.reason != "" {
		return decline("unhealthy", "%s", h.reason)
	}
	var behind error
	if s.o.Following != nil {
		behind = s.o.Following()
	}
	if was := s.behind.Swap(behind != nil); was != (behind != nil) {
		if behind != nil {
			s.log.Printf("declining every request: its copy of the pools may not follow the cluster: %v", behind)
		} else {
			s.log.Printf("serving again: its copy of the pools follows the cluster")
		}
	}
	if behind != nil {
		return decline("behind", "its copy of the pools may not follow the cluster: %v", behind)
	}
	return nil
}

// decliningFor is the reason the agent declines every request now ("":
// none), for the metrics.
func (s *Server) decliningFor() string {
	if d := s.declinesAll(); d != nil {
		return d.reason
	}
	return ""
}

// job is req's verb: its arguments and, but for a probe, its environment.
func (s *Server) job(req wire.Request) *Job {
	j := &Job{req: req, args: &skel.CmdArgs{
		ContainerID:   req.Env[wire.EnvContainerID],
		Netns:         req.Env[wire.EnvNetns],
		IfName:        req.Env[wire.EnvIfName],
		Args:          req.Env[wire.EnvArgs],
		Path:          req.Env[wire.EnvPath],
		NetnsOverride: req.Env[wire.EnvNetnsOverride],
		StdinData:     req.Config,
	}}
	if req.Command == wire.Probe {
		return j
	}
	j.env = append([]string(nil), s.env...)
	for _, k := range wire.EnvKeys {
		if v, ok := req.Env[k]; ok && k != wire.EnvGuard {
			j.env = append(j.env, k+"="+v)
		}
	}
	return j
}

// admitConfig says why the agent would not do j's verb as the plugin would
// (nil: it would), from the request's config, kubeconfig and (DEL)
// checkpoint; what it read goes into j for the verb.
func (s *Server) admitConfig(j *Job) *declined {
	req := j.req
	if key := unknownIPAMKey(req.Config); key != "" {
		return decline("field", "ipam field %q is unknown to this agent", key)
	}
	cfg, err := s.loader.Load(req.Config)
	if err != nil {
		if req.Command == wire.Del {
			// A DEL goes on by the attachment's checkpoint when its config
			// cannot be read (the NAD gone, an option of a newer release):
			// the agent does it so when it holds that checkpoint.
			if why := s.admitByCheckpoint(j); why != "" {
				return decline("config", "config: %s; %s", errText(err), why)
			}
			return nil
		}
		// The plugin says exactly what is wrong.
		return decline("config", "config: %s", errText(err))
	}
	if d := s.admitLoaded(j, cfg); d != nil {
		return d
	}
	ns, err := s.namespaceOf(cfg.Kubeconfig())
	if err != nil {
		return decline("kubeconfig", "kubeconfig: %s", errText(err))
	}
	if !s.serves(ns) {
		return decline("namespace", "pool namespace %s is not served here (this agent serves %s)", ns, strings.Join(s.o.Namespaces, ", "))
	}
	// The verb reads the same config and kubeconfig: once is enough.
	j.cfg, j.kubeconfig, j.namespace = cfg, cfg.Kubeconfig(), ns
	if req.Command == wire.Del {
		// DEL also releases what the checkpoint names, maybe elsewhere.
		rec, ok, err := checkpoint.Dir(cfg.Options.CheckpointDir).Read(j.args.ContainerID, j.args.IfName)
		if err != nil {
			return decline("checkpoint", "checkpoint: %v", err)
		}
		if ok && rec.Namespace != "" && !s.serves(rec.Namespace) {
			return decline("namespace", "the checkpoint names pool namespace %s, not served here", rec.Namespace)
		}
	}
	if req.Command == wire.Add && s.o.Allocator != nil {
		if why := s.o.Allocator.Declines(cfg, j.args); why != "" {
			return decline("allocator", "%s", why)
		}
	}
	return nil
}

// admitLoaded says why the agent would not serve a config as loaded: a CNI
// version the plugin does not answer, node slices, no range, CNI_ARGS the
// ADD cannot read, a checkpoint directory not its own, a delegate it does
// not see.
func (s *Server) admitLoaded(j *Job, cfg *conf.Config) *declined {
	req := j.req
	// A config of a version the plugin does not answer is its skel's to refuse.
	if !slices.Contains(conf.SpecVersions().SupportedVersions(), cfg.CNIVersion) {
		return decline("version", "cniVersion %q", cfg.CNIVersion)
	}
	if cfg.NodeSliceSize != "" {
		return decline("node_slice_size", "node_slice_size")
	}
	if len(cfg.Pools) == 0 {
		return decline("config", "config names no range")
	}
	if req.Command == wire.Add {
		if _, err := conf.ParseArgs(j.args.Args); err != nil {
			return decline("config", "CNI_ARGS: %s", errText(err))
		}
	}
	if !slices.Contains(s.o.CheckpointDirs, cfg.Options.CheckpointDir) {
		return decline("checkpoint", "checkpoint directory %s is not the agent's (%s)", cfg.Options.CheckpointDir, strings.Join(s.o.CheckpointDirs, ", "))
	}
	// A verb that runs the delegate runs it from the agent's view of the
	// request's CNI_PATH: the same binaries, when the node's bin dirs are
	// mounted at their paths; a delegate the agent does not see is left to
	// the plugin.
	if (req.Command == wire.Add && s.o.Allocator == nil) || req.Command == wire.GC || req.Command == wire.Status {
		if _, err := delegate.Find(cfg.Options.Delegate, filepath.SplitList(j.args.Path)); err != nil {
			return decline("delegate", "delegate %s: %s", cfg.Options.Delegate, errText(err))
		}
	}
	return nil
}

// admitByCheckpoint says why the agent would not do a DEL whose config it
// cannot read by the attachment's checkpoint ("" when it would): the
// checkpoint must be in a directory of the agent's, and name a pool
// namespace it serves. It reads, and writes nothing.
func (s *Server) admitByCheckpoint(j *Job) string {
	salvage := conf.SalvageConfig(j.args.StdinData)
	if !slices.Contains(s.o.CheckpointDirs, salvage.CheckpointDir) {
		return fmt.Sprintf("checkpoint directory %s is not the agent's", salvage.CheckpointDir)
	}
	rec, ok, err := checkpoint.Dir(salvage.CheckpointDir).Read(j.args.ContainerID, j.args.IfName)
	switch {
	case err != nil:
		return fmt.Sprintf("checkpoint: %v", err)
	case !ok:
		return "no checkpoint of the attachment"
	case !s.serves(rec.Namespace):
		return fmt.Sprintf("the checkpoint names pool namespace %s, not served here", rec.Namespace)
	}
	// The verb's store is made from the kubeconfig the checkpoint names.
	if rec.Kubeconfig != "" {
		ns, err := s.namespaceOf(rec.Kubeconfig)
		if err != nil {
			return fmt.Sprintf("the checkpoint's kubeconfig: %s", errText(err))
		}
		if !s.serves(ns) {
			return fmt.Sprintf("the checkpoint's kubeconfig %s names pool namespace %s, not served here", rec.Kubeconfig, ns)
		}
	}
	return ""
}

// unknownIPAMKey is the first ipam field of a config that the agent does not
// know, "" when there is none (or no ipam object: Load says what is wrong).
func unknownIPAMKey(config []byte) string {
	var c struct {
		IPAM map[string]json.RawMessage `json:"ipam"`
	}
	if json.Unmarshal(config, &c) != nil {
		return ""
	}
	var unknown []string
	for k := range c.IPAM {
		if !ipamKeys[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	sort.Strings(unknown)
	return unknown[0]
}

// errText is a CNI error's message with its details, or any error's text.
func errText(err error) string {
	if ce, ok := err.(*cnitypes.Error); ok && ce.Details != "" {
		return ce.Msg + ": " + ce.Details
	} else if ok {
		return ce.Msg
	}
	return err.Error()
}
