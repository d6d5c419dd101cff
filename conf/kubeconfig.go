package conf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultNamespace is where whereabouts keeps its pools when the kubeconfig's
// current context names no namespace.
const DefaultNamespace = "kube-system"

// Re-reading a kubeconfig that is being written. whereabouts' install-cni.sh
// (at every start of its pod) and, from v0.9, its token-watcher.sh (whenever
// the service account token or CA changes) write the kubeconfig in place,
// `cat > file`: the shell truncates it, then cat writes it, so a reader in
// between sees an empty file or a prefix of it. The file is a few KiB and cat
// writes it in one or two writes, so the window is that of starting cat:
// milliseconds, tens on a loaded node. The pauses start short (the common
// case costs 10 ms) and double, up to kubeconfigPatience in all: far beyond
// such a window, yet small beside whereabouts' own ADD (about 100 ms, and
// seconds when it waits for its Lease) and the runtime's CNI timeout (minutes),
// and paid only when the file is broken. A file still broken after that is
// not being written by cat: its writer was killed midway (its pod restarts and
// writes it again) or something else is wrong; the verb then fails with "try
// again later", and the runtime retries the sandbox with its own backoff.
const (
	kubeconfigFirstPause = 10 * time.Millisecond
	kubeconfigPatience   = time.Second
)

// Kube is how to reach the IPPool store: the API server and the namespace.
type Kube struct {
	Path      string
	Namespace string
	Rest      *rest.Config
}

// LoadKubeconfig reads the kubeconfig whereabouts uses. The pools live in the
// namespace of its current context, as whereabouts reads it. A file that
// looks half-written is read again for up to a second (kubeconfigPatience),
// with sleep pausing between reads (nil is time.Sleep: tests count the pauses
// instead); one that is whole but wrong fails at once.
func LoadKubeconfig(path string, sleep func(time.Duration)) (*Kube, error) {
	if sleep == nil {
		sleep = time.Sleep
	}
	if path == "" {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, "no kubeconfig for the IPPool store",
			"set ipam.kubernetes.kubeconfig, or kubernetes.kubeconfig in the whereabouts flat file")
	}
	if err := checkFile("kubeconfig", path); err != nil {
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, err.Error(), "kubernetes.kubeconfig must name the whereabouts kubeconfig file")
	}
	var prev []byte
	var slept time.Duration
	pause := kubeconfigFirstPause
	for reads := 1; ; reads++ {
		data, err := os.ReadFile(path)
		if err != nil {
			// Not worth a second read: install-cni.sh touches the file before
			// it truncates it, so it is never missing while being written.
			return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("cannot load kubeconfig %s", path), err.Error())
		}
		kube, err := parseKubeconfig(path, data)
		var partial *partialError
		switch {
		case !errors.As(err, &partial):
			return kube, err
		case kube != nil && (bytes.Equal(data, prev) || slept >= kubeconfigPatience):
			// Usable, only its last line unended: the same as at the last
			// read, so nobody is writing it, or the best there is.
			return kube, nil
		case slept >= kubeconfigPatience:
			return nil, halfWritten(path, partial, reads, slept)
		}
		prev = data
		pause = min(pause, kubeconfigPatience-slept)
		sleep(pause)
		slept += pause
		pause *= 2
	}
}

// halfWritten is the error of a kubeconfig that still looked cut short at
// its last read: "try again later", since the writer that left it so is
// whereabouts' pod, which writes it whole when it starts again.
func halfWritten(path string, partial *partialError, reads int, slept time.Duration) error {
	return cnitypes.NewError(cnitypes.ErrTryAgainLater,
		fmt.Sprintf("kubeconfig %s %s (read %d times over %s)", path, partial.why, reads, slept),
		"whereabouts' pod rewrites this file in place (install-cni.sh when it starts, token-watcher.sh when its token or CA changes) "+
			"and may have been stopped midway; the runtime retries. If this persists, check the file and the whereabouts pod "+
			"on this node (on Harvester: kube-system/harvester-whereabouts)")
}

// partialError says a kubeconfig looks cut short: what a reader sees while
// it is being written in place.
type partialError struct{ why string }

func (e *partialError) Error() string { return e.why }

// parseKubeconfig makes a Kube of a kubeconfig's bytes, as clientcmd reads
// them. A *partialError says the bytes look like a prefix of a kubeconfig,
// worth reading again (with a Kube when they are usable all the same); any
// other error is final.
//
// whereabouts writes current-context last (its lib.sh), so every prefix of
// its file cut at a line's end lacks it, and one cut inside a line either
// does not decode (the token is quoted) or names a context that is not there
// in a file whose last line has no newline. A file that decodes, ends its
// last line and names a current context is whole: what is wrong with it
// (a context, cluster or user that it names and lacks) fails at once. (A
// wrong one without its last newline is taken for cut, and fails after the
// patience: every writer known here, the shell's here-document, kubectl and
// YAML encoders, ends its last line.)
func parseKubeconfig(path string, data []byte) (*Kube, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		// clientcmd takes an empty file for an empty config.
		return nil, &partialError{"is empty"}
	}
	raw, err := clientcmd.Load(data)
	if err != nil {
		// clientcmd's decoding errors name a line, an offset or the kind,
		// never a value such as the token.
		return nil, &partialError{"does not parse: " + err.Error()}
	}
	if raw.CurrentContext == "" {
		return nil, &partialError{"names no current-context"}
	}
	kube, bad := kubeOf(path, raw)
	unended := data[len(data)-1] != '\n'
	switch {
	case bad != nil && unended:
		return nil, &partialError{"ends mid-line: " + bad.what}
	case bad != nil:
		return nil, cnitypes.NewError(cnitypes.ErrInvalidNetworkConfig, fmt.Sprintf("kubeconfig %s: %s", path, bad.what), bad.hint)
	case unended:
		// Usable, but its last value (a token?) may be cut: the caller reads
		// it again to see it unchanged.
		return kube, &partialError{"ends mid-line"}
	}
	return kube, nil
}

// badKubeconfig is what is wrong with a whole kubeconfig, and what to do.
type badKubeconfig struct{ what, hint string }

// kubeOf is the Kube of a decoded kubeconfig, or what is wrong with it.
func kubeOf(path string, raw *clientcmdapi.Config) (*Kube, *badKubeconfig) {
	// As clientcmd.LoadFromFile does, for clientcmd's own messages.
	for _, c := range raw.Clusters {
		c.LocationOfOrigin = path
	}
	for _, a := range raw.AuthInfos {
		a.LocationOfOrigin = path
	}
	for _, c := range raw.Contexts {
		c.LocationOfOrigin = path
	}
	ctx, ok := raw.Contexts[raw.CurrentContext]
	if !ok || ctx == nil {
		return nil, &badKubeconfig{fmt.Sprintf("current context %q not found", raw.CurrentContext), "set current-context to a context of the file"}
	}
	// clientcmd would take a missing cluster for "no configuration has been
	// provided" and a missing user for anonymous access: say what is missing.
	// A context without a user is anonymous on purpose.
	if _, ok := raw.Clusters[ctx.Cluster]; !ok {
		return nil, &badKubeconfig{fmt.Sprintf("context %q names cluster %q, which is not in the file", raw.CurrentContext, ctx.Cluster), "name a cluster of the file in the context"}
	}
	if _, ok := raw.AuthInfos[ctx.AuthInfo]; !ok && ctx.AuthInfo != "" {
		return nil, &badKubeconfig{fmt.Sprintf("context %q names user %q, which is not in the file", raw.CurrentContext, ctx.AuthInfo), "name a user of the file in the context"}
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		// clientcmd's validation names fields and files, never credentials.
		return nil, &badKubeconfig{"not usable: " + err.Error(), "the cluster of its current context must name the API server"}
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
