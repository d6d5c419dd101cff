package install

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsclient "k8s.io/client-go/kubernetes/typed/apps/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Owner is the DaemonSet that runs this installer, read when it is told to
// stop: its answer tells an uninstall from a restart.
type Owner struct {
	Namespace, Name string
	// Get reads the DaemonSet; NewOwner makes one that asks the API server.
	Get func(ctx context.Context) (*appsv1.DaemonSet, error)
}

// NewOwner reads namespace/name with kubeconfig, or with the pod's service
// account when kubeconfig is "". Each read has a timeout of its own.
func NewOwner(kubeconfig, namespace, name string) (*Owner, error) {
	if namespace == "" || name == "" {
		return nil, fmt.Errorf("the installer's DaemonSet needs a namespace and a name (have %q/%q)", namespace, name)
	}
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("a client to read DaemonSet %s/%s: %w", namespace, name, err)
	}
	cfg.Timeout = 3 * time.Second
	c, err := appsclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client to read DaemonSet %s/%s: %w", namespace, name, err)
	}
	return &Owner{Namespace: namespace, Name: name, Get: func(ctx context.Context) (*appsv1.DaemonSet, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return c.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	}}, nil
}

// Removal is what the DaemonSet's state says of this installer's stop.
type Removal struct {
	// Uninstall: the DaemonSet is gone or being deleted, or the installer's
	// service account is (its token is refused): no pod of it comes back
	// to this node, so the stand-in's name is given back.
	Uninstall bool
	// Why says what was read, for the log.
	Why string
}

// Attempts and the pause between them bound Removing: a stop has the pod's
// grace period (30 s in the chart), and giving the name back needs some.
const (
	removalAttempts = 3
	removalPause    = time.Second
	// forbiddenAttempts bounds the reads a 403 gets: helm uninstall deletes
	// the installer's Role right after its DaemonSet, and its ServiceAccount
	// last, but kube-apiserver accepts a token it authenticated within the
	// last 10 s (its cache of successful token authentications), so an
	// uninstall answers 403 for up to 10 s before it refuses the token (401).
	forbiddenAttempts = 15
)

// Removing reads the DaemonSet to tell an uninstall from a restart, an
// upgrade, a rollout or a node's shutdown (the way istio-cni's node agent
// does): gone, marked for deletion, or its service account's token refused
// (helm uninstall deletes the account beside the DaemonSet) is an
// uninstall; present is not. Anything else (the API server unreachable,
// access refused) is read again, a few times, and then is not an uninstall:
// when it cannot tell, the installer keeps what it installed.
func (o *Owner) Removing(ctx context.Context, sleep func(time.Duration)) Removal {
	ds := o.Namespace + "/" + o.Name
	var last error
	for attempt := 1; ; attempt++ {
		got, err := o.Get(ctx)
		switch {
		case err == nil && got.DeletionTimestamp != nil:
			return Removal{true, fmt.Sprintf("DaemonSet %s is being deleted (since %s)", ds, got.DeletionTimestamp.UTC().Format(time.RFC3339))}
		case err == nil:
			return Removal{false, fmt.Sprintf("DaemonSet %s is in place (a restart, an upgrade or a node's shutdown)", ds)}
		case apierrors.IsNotFound(err):
			return Removal{true, fmt.Sprintf("DaemonSet %s is gone", ds)}
		case apierrors.IsUnauthorized(err):
			return Removal{true, fmt.Sprintf("the installer's service account is gone (its token is refused: %v)", err)}
		}
		last = err
		limit := removalAttempts
		if apierrors.IsForbidden(err) {
			limit = forbiddenAttempts
		}
		if attempt >= limit || ctx.Err() != nil {
			break
		}
		sleep(removalPause)
	}
	if errors.Is(last, context.Canceled) || errors.Is(last, context.DeadlineExceeded) {
		last = fmt.Errorf("no answer: %w", last)
	}
	return Removal{false, fmt.Sprintf("DaemonSet %s could not be read (%v), so this may be a restart", ds, last)}
}
