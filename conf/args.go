package conf

import (
	"fmt"
	"strings"
	"unicode/utf8"

	cnitypes "github.com/containernetworking/cni/pkg/types"
)

// Pod is the identity the runtime passes in CNI_ARGS.
type Pod struct {
	Namespace string
	Name      string
}

// Ref is the pod as whereabouts records it: "namespace/name".
func (p Pod) Ref() string { return p.Namespace + "/" + p.Name }

// ParseArgs reads K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS
// ("K1=V1;K2=V2"). Other keys are ignored whatever IgnoreUnknown says: they
// belong to the delegate, which reads CNI_ARGS itself.
func ParseArgs(cniArgs string) (Pod, error) {
	var pod Pod
	for _, pair := range strings.Split(cniArgs, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return Pod{}, cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("CNI_ARGS entry %q is not KEY=VALUE", pair), "CNI_ARGS is a ';'-separated list of KEY=VALUE pairs")
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			pod.Namespace = v
		case "K8S_POD_NAME":
			pod.Name = v
		}
	}
	var missing []string
	if pod.Namespace == "" {
		missing = append(missing, "K8S_POD_NAMESPACE")
	}
	if pod.Name == "" {
		missing = append(missing, "K8S_POD_NAME")
	}
	if len(missing) > 0 {
		return Pod{}, cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS lacks %s", strings.Join(missing, " and ")),
			"harvester-ipam needs the pod's identity: the runtime (Multus) passes K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS")
	}
	if strings.Contains(pod.Namespace, "/") || strings.Contains(pod.Name, "/") {
		return Pod{}, cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS pod %q is not a Kubernetes namespace and name", pod.Ref()), "neither may contain '/'")
	}
	// The podref is matched against, and recorded in, JSON, which holds UTF-8 only.
	if !utf8.ValidString(pod.Ref()) {
		return Pod{}, cnitypes.NewError(cnitypes.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS pod %q is not a Kubernetes namespace and name", pod.Ref()), "both must be UTF-8")
	}
	return pod, nil
}
