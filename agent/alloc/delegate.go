package alloc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
)

// Delegate is the allocator in the place of the whereabouts binary in the
// plugin's ADD (plugin.Allocator): the plugin has recorded the attachment
// and released earlier sandboxes; Delegate allocates as whereabouts' ADD
// would and returns its result.
type Delegate struct {
	Batcher *Batcher
	// Load reads the config as whereabouts' loader does with CNI_ARGS (the
	// pod, static IP and GATEWAY), without touching whereabouts' log
	// (conf.Loader{Quiet: true}.Whereabouts).
	Load func(stdin []byte, cniArgs string) (*wbtypes.IPAMConfig, string, error)
}

// Add allocates for args from cfg's ranges. Its errors are whereabouts' as
// its binary reports them (a *types.Error of code 999, "error at storage
// engine: ..."), but for a store that did not answer, which is code 11 so
// that the runtime retries.
func (d Delegate) Add(ctx context.Context, store *shim.Store, cfg *conf.Config, args *skel.CmdArgs) (cnitypes.Result, error) {
	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	record := func(ip net.IPNet) error { return recordChosen(cp, args.ContainerID, args.IfName, ip) }
	forget := func(ip net.IPNet) error { return forgetChosen(cp, args.ContainerID, args.IfName, ip) }
	var recorded []net.IP
	if have, ok, err := cp.Read(args.ContainerID, args.IfName); err == nil && ok {
		recorded = have.Addresses()
	}
	return d.add(ctx, store, cfg, args, recorded, record, forget)
}

// AddRecording is Add writing the attachment's checkpoint rec itself
// (plugin.RecordingAllocator): with the first address chosen, durably, before
// that address is written anywhere; with each next one as it is chosen.
func (d Delegate) AddRecording(ctx context.Context, store *shim.Store, cfg *conf.Config, args *skel.CmdArgs, rec checkpoint.Record) (cnitypes.Result, error) {
	cp := checkpoint.Dir(cfg.Options.CheckpointDir)
	written := false
	// Asked again for the same ADD (an earlier range found an earlier
	// sandbox the reclaim's copy did not show), the record already names
	// what the first ask wrote: kept, and told to the allocator, which
	// knows by it an entry whose ifname whereabouts v0.7.0's CRD pruned.
	if have, ok, err := cp.Read(args.ContainerID, args.IfName); err == nil && ok {
		for _, addr := range have.IPs {
			if !slices.Contains(rec.IPs, addr) {
				rec.IPs = append(rec.IPs, addr)
			}
		}
		written = true
	}
	recorded := rec.Addresses()
	record := func(ip net.IPNet) error {
		addr := ip.String() // as the result gives it, and the plugin records it
		if !slices.Contains(rec.IPs, addr) {
			rec.IPs = append(rec.IPs, addr)
		}
		var err error
		if written {
			err = cp.Update(rec)
		} else if err = cp.Write(rec); err == nil {
			written = true
		}
		if err != nil {
			return cnitypes.NewError(cnitypes.ErrIOFailure, err.Error(), "the checkpoint directory must be writable by root ("+conf.OptionsKey+".checkpoint_dir)")
		}
		return nil
	}
	forget := func(ip net.IPNet) error {
		addr := ip.String()
		if !written || !slices.Contains(rec.IPs, addr) {
			return nil
		}
		rec.IPs = slices.DeleteFunc(rec.IPs, func(s string) bool { return s == addr })
		if err := cp.Update(rec); err != nil {
			return cnitypes.NewError(cnitypes.ErrIOFailure, err.Error(), "the checkpoint directory must be writable by root ("+conf.OptionsKey+".checkpoint_dir)")
		}
		return nil
	}
	return d.add(ctx, store, cfg, args, recorded, record, forget)
}

func (d Delegate) add(ctx context.Context, store *shim.Store, cfg *conf.Config, args *skel.CmdArgs, recorded []net.IP, record, forget func(net.IPNet) error) (cnitypes.Result, error) {
	wb, confVersion, err := d.Load(cfg.Delegated, args.Args)
	if err != nil {
		return nil, asCNI(err)
	}
	ips, err := d.Batcher.Allocate(ctx, Request{Store: store, IPAM: wb, ContainerID: args.ContainerID, IfName: args.IfName, Recorded: recorded, Chosen: record, Unchosen: forget})
	if errors.Is(err, shim.ErrEarlierSandbox) {
		return nil, err // the plugin releases it and asks again
	}
	if err != nil {
		return nil, asCNI(err)
	}
	return Result(wb, confVersion, ips)
}

// recordChosen adds ip to the attachment's checkpoint before it is written:
// an old CRD prunes the entry's ifname, and DEL then knows the entry by the
// address recorded.
func recordChosen(cp checkpoint.Dir, containerID, ifName string, ip net.IPNet) error {
	rec, ok, err := cp.Read(containerID, ifName)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no checkpoint of %s/%s to record %s in", containerID, ifName, ip)
	}
	addr := ip.String()
	for _, have := range rec.IPs {
		if have == addr {
			return nil
		}
	}
	rec.IPs = append(rec.IPs, addr)
	return cp.Update(rec)
}

// forgetChosen takes ip, chosen and not written, out of the attachment's
// checkpoint.
func forgetChosen(cp checkpoint.Dir, containerID, ifName string, ip net.IPNet) error {
	rec, ok, err := cp.Read(containerID, ifName)
	if err != nil || !ok {
		return err
	}
	addr := ip.String()
	if !slices.Contains(rec.IPs, addr) {
		return nil
	}
	rec.IPs = slices.DeleteFunc(rec.IPs, func(s string) bool { return s == addr })
	return cp.Update(rec)
}

// asCNI is err as the whereabouts binary's process reports it: its own CNI
// errors as they are, any other as code 999 (skel's ErrInternal).
func asCNI(err error) error {
	var ce *cnitypes.Error
	if errors.As(err, &ce) {
		return ce
	}
	return cnitypes.NewError(cnitypes.ErrInternal, err.Error(), "")
}

// Declines says why this allocator would not allocate exactly as the
// whereabouts binary would ("" when it would): the agent then leaves the ADD
// to the plugin, which runs whereabouts itself. It writes nothing.
func (d Delegate) Declines(cfg *conf.Config, args *skel.CmdArgs) string {
	wb, _, err := d.Load(cfg.Delegated, args.Args)
	if err != nil {
		return "whereabouts' loader: " + err.Error()
	}
	switch {
	case wb.SleepForRace > 0:
		return "sleep_for_race (whereabouts' own race test) is set"
	case wb.NodeSliceSize != "":
		return "node_slice_size"
	case len(wb.IPRanges) == 0:
		return "no range"
	}
	return ""
}
