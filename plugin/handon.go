package plugin

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/delegate"
)

// Standing in for whereabouts at its name, harvester-ipam receives every
// config that names whereabouts, including ones it does not manage: it hands
// those to the real binary, byte for byte, and whereabouts does what it
// always did with them. A NAD that names harvester-ipam chose it, and gets
// harvester-ipam's errors instead.

// namesDelegate says whether a config's ipam.type is the default delegate's
// own name: harvester-ipam then runs in its place.
func namesDelegate(stdin []byte) bool {
	var c struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	return json.Unmarshal(stdin, &c) == nil && c.IPAM.Type == conf.DefaultDelegate
}

// unmanagedAdd says why an ADD of a config naming whereabouts is not
// harvester-ipam's to manage, or "" when it is: whereabouts' node slices
// (per-node pools and Leases harvester-ipam does not manage), and a caller
// that names no pod (nothing to reclaim by).
func unmanagedAdd(args *skel.CmdArgs) string {
	if !namesDelegate(args.StdinData) {
		return ""
	}
	if nodeSlices(args.StdinData) {
		return "node_slice_size"
	}
	if _, err := conf.ParseArgs(args.Args); err != nil {
		return "no pod in CNI_ARGS"
	}
	return ""
}

// nodeSlices says whether a config asks for whereabouts' node slices
// (ipam.node_slice_size, any value but null: whereabouts' to judge).
// harvester-ipam manages none of them, and the node agent declines every
// verb of such a config, so the plugin does not ask it (see through).
func nodeSlices(stdin []byte) bool {
	var c struct {
		IPAM struct {
			NodeSliceSize json.RawMessage `json:"node_slice_size"`
		} `json:"ipam"`
	}
	return json.Unmarshal(stdin, &c) == nil && len(c.IPAM.NodeSliceSize) > 0 && string(c.IPAM.NodeSliceSize) != "null"
}

// handOnAdd runs the real whereabouts' ADD on the config as it came.
func (p *Plugin) handOnAdd(ctx context.Context, args *skel.CmdArgs) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	res, err := delegate.Add(ctx, conf.DefaultDelegate, args.StdinData, p.exec(), p.Env)
	if err != nil {
		return delegateError(conf.DefaultDelegate, "ADD", err)
	}
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(args.StdinData, &v)
	out, err := res.GetAsVersion(v.CNIVersion)
	if err != nil {
		return cnitypes.NewError(cnitypes.ErrIncompatibleCNIVersion, fmt.Sprintf("%s returned a result that cannot be given as version %s", conf.DefaultDelegate, v.CNIVersion), err.Error())
	}
	return out.PrintTo(p.stdout())
}
