package plugin

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
)

// Check verifies, against the pools, that (CNI_CONTAINERID, CNI_IFNAME) holds
// one allocation in every pool of the config and that they are the addresses
// of prevResult. It does not delegate: whereabouts (v0.8.0 and before)
// answers every CHECK with "not implemented".
func (p *Plugin) check(ctx context.Context, args *skel.CmdArgs) error {
	cfg, err := p.loadForAttachment(args)
	if err != nil {
		return err
	}
	if len(cfg.PrevResult) == 0 {
		return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "CHECK needs a prevResult", "the runtime passes the result of ADD as prevResult")
	}
	prev, err := parsePrevResult(cfg)
	if err != nil {
		return err
	}
	var podRef string
	if pod, err := conf.ParseArgs(args.Args); err == nil {
		podRef = pod.Ref()
	}
	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()

	var problems []string
	for _, pl := range cfg.Pools {
		_, ipnet, err := net.ParseCIDR(pl.Range)
		if err != nil {
			return cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("range %q", pl.Range), err.Error())
		}
		pool, err := store.Pool(ctx, pl.Name)
		if err != nil {
			return storeError("read pool "+pl.Name, err)
		}
		if pool == nil {
			problems = append(problems, fmt.Sprintf("pool %s/%s does not exist", store.Namespace(), pl.Name))
			continue
		}
		allocs, err := shim.Allocations(pool)
		if err != nil {
			return storeError("read pool "+pl.Name, err)
		}
		mine := map[string]bool{}
		for _, off := range shim.Attachment(args.ContainerID, args.IfName, prevIPs(prev), nil)(pool) {
			mine[off] = true
		}
		held := map[string]shim.Allocation{} // by address
		for _, a := range allocs {
			if mine[a.Offset] {
				held[a.IP.String()] = a
			}
		}
		var want []string
		for _, ip := range prev.IPs {
			if ipnet.Contains(ip.Address.IP) {
				want = append(want, ip.Address.IP.String())
			}
		}
		if len(held) == 0 {
			problems = append(problems, fmt.Sprintf("pool %s holds nothing for container %s ifname %s", pl.Name, args.ContainerID, args.IfName))
			continue
		}
		if len(want) == 0 {
			problems = append(problems, fmt.Sprintf("prevResult has no address in range %s, but pool %s holds %s for this attachment", pl.Range, pl.Name, keys(held)))
			continue
		}
		for _, ip := range want {
			// An if-chain, not a switch: gremlins v0.5.0 never counts a case
			// expression as covered (docs/testing.md, "Mutation testing").
			a, ok := held[ip]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s is not allocated to container %s ifname %s in pool %s (it holds %s)", ip, args.ContainerID, args.IfName, pl.Name, keys(held)))
			} else if podRef != "" && a.PodRef != podRef {
				problems = append(problems, fmt.Sprintf("%s in pool %s is recorded for pod %s, not %s", ip, pl.Name, a.PodRef, podRef))
			}
		}
	}
	if len(problems) > 0 {
		return cnitypes.NewError(cnitypes.ErrInternal, "CHECK failed: "+strings.Join(problems, "; "),
			"the attachment's allocation was released or changed; the runtime should recreate the sandbox")
	}
	return nil
}

func prevIPs(prev *current.Result) []net.IP {
	var out []net.IP
	for _, ip := range prev.IPs {
		out = append(out, ip.Address.IP)
	}
	return out
}

func parsePrevResult(cfg *conf.Config) (*current.Result, error) {
	res, err := version.NewResult(cfg.CNIVersion, cfg.PrevResult)
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "prevResult does not parse", err.Error())
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "prevResult does not convert", err.Error())
	}
	return cur, nil
}

func keys(m map[string]shim.Allocation) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	if len(ks) == 0 {
		return "nothing"
	}
	return strings.Join(ks, ", ")
}
