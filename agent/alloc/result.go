package alloc

import (
	"encoding/json"
	"fmt"
	"net"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
)

// Result is the result of whereabouts' ADD for the addresses allocated, as
// its binary builds and prints it and a runtime reads it back: the config's
// DNS and routes, each address with the config's gateway, then the static
// addresses (the config's and CNI_ARGS' IP and GATEWAY), at the config's
// cniVersion (cmd/whereabouts.go, cmdAdd).
func Result(ipam *wbtypes.IPAMConfig, confVersion string, ips []net.IPNet) (cnitypes.Result, error) {
	r := &current.Result{DNS: ipam.DNS, Routes: ipam.Routes}
	for _, ip := range ips {
		r.IPs = append(r.IPs, &current.IPConfig{Address: ip, Gateway: ipam.Gateway})
	}
	for _, v := range ipam.Addresses {
		r.IPs = append(r.IPs, &current.IPConfig{Address: v.Address, Gateway: v.Gateway})
	}
	// As printed (cnitypes.PrintResult) ...
	printed, err := r.GetAsVersion(confVersion)
	if err != nil {
		return nil, fmt.Errorf("whereabouts' result as version %q: %w", confVersion, err)
	}
	b, err := json.Marshal(printed)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	// ... and as the runtime decodes it (invoke reads the version the
	// result names).
	return version.NewResult(confVersion, b)
}
