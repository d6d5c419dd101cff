// Command passthrough is the bench's floor: a CNI IPAM plugin that does
// nothing but hand every verb to whereabouts, with the config's ipam.type
// changed and whereabouts started as early as harvester-ipam starts it. What
// it costs over whereabouts alone (one more process, one more exec) any
// delegating IPAM plugin pays; what harvester-ipam costs over it is its own.
package main

import (
	"context"
	"encoding/json"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/harvester/harvester-ipam/plugin/delegate"
)

const delegateName = "whereabouts"

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:   add,
		Del:   func(a *skel.CmdArgs) error { return pass(a, invoke.DelegateDel) },
		Check: func(a *skel.CmdArgs) error { return pass(a, invoke.DelegateCheck) },
	}, version.All, "passthrough: the bench's floor, whereabouts behind one more process")
}

func add(args *skel.CmdArgs) error {
	ctx := context.Background()
	early := delegate.Start(ctx, delegateName, "ADD", os.Stderr)
	defer early.Abandon()
	conf, err := retype(args.StdinData)
	if err != nil {
		return err
	}
	res, err := invoke.DelegateAdd(ctx, delegateName, conf, early)
	if err != nil {
		return err
	}
	return res.Print()
}

func pass(args *skel.CmdArgs, verb func(context.Context, string, []byte, invoke.Exec) error) error {
	conf, err := retype(args.StdinData)
	if err != nil {
		return err
	}
	return verb(context.Background(), delegateName, conf, nil)
}

// retype is the config with ipam.type set to the delegate's, every other
// value passed on byte for byte, as harvester-ipam hands it on. It does not
// call conf: conf links whereabouts' config loader, and the floor would then
// pay for a start-up that is harvester-ipam's.
func retype(stdin []byte) ([]byte, error) {
	var top, ipam map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrDecodingFailure, "the network config is not JSON", err.Error())
	}
	if err := json.Unmarshal(top["ipam"], &ipam); err != nil || ipam == nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "the network config has no ipam object", "")
	}
	ipam["type"], _ = json.Marshal(delegateName)
	var err error
	if top["ipam"], err = json.Marshal(ipam); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}
