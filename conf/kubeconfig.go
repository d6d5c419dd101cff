package conf

import (
	"fmt"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultNamespace is where whereabouts keeps its pools when the kubeconfig's
// current context names no namespace.
const DefaultNamespace = "kube-system"

// Kube is how to reach the IPPool store: the API server and the namespace.
type Kube struct {
	Path      string
	Namespace string
	Rest      *rest.Config
}

// LoadKubeconfig reads the kubeconfig whereabouts uses. The pools live in the
// namespace of its current context, as whereabouts reads it.
func LoadKubeconfig(path string) (*Kube, error) {
	if path == "" {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "no kubeconfig for the IPPool store",
			"set ipam.kubernetes.kubeconfig, or kubernetes.kubeconfig in the whereabouts flat file")
	}
	if err := checkFile("kubeconfig", path); err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, err.Error(), "kubernetes.kubeconfig must name the whereabouts kubeconfig file")
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("cannot load kubeconfig %s", path), err.Error())
	}
	ctx, ok := raw.Contexts[raw.CurrentContext]
	if !ok || ctx == nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig,
			fmt.Sprintf("kubeconfig %s: current context %q not found", path, raw.CurrentContext),
			"set current-context to a context of the file")
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("kubeconfig %s is not usable", path), err.Error())
	}
	rc.UserAgent = "harvester-ipam"
	// A handful of requests per call: never wait on client-side throttling.
	rc.QPS, rc.Burst = 100, 200
	ns := ctx.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	return &Kube{Path: path, Namespace: ns, Rest: rc}, nil
}
