package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/agent"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
)

func restConfig(kubeconfig, version string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "harvester-ipam-agent/" + version
	// Every pod of a node may start at once (after a reboot): never wait on
	// client-side throttling.
	rc.QPS, rc.Burst = 100, 200
	return rc, nil
}

// writeNodeFile tells the plugin where the socket is: written whole
// (a temporary file renamed over it), readable by all, as the CNI config
// directory's files are.
func writeNodeFile(path, socket string) error {
	b, err := json.Marshal(wire.NodeConf{Socket: socket})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".agent.conf.*")
	if err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("node file: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("node file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("node file: %w", err)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// watchPools starts informers of the pools and reservations of each
// namespace into objs, for as long as ctx lasts. It does not wait for them
// to list: the agent serves meanwhile, reading from the API server.
func watchPools(ctx context.Context, rc *rest.Config, objs *cache.Objects, namespaces []string, logf func(string, ...any)) error {
	// The REST client of whereabouts' CRDs the plugin's store uses, not
	// whereabouts' generated clientset: that one links client-go's discovery
	// and the scheme of every built-in API group (half the agent's binary).
	wb, params, err := shim.WhereaboutsClient(rc)
	if err != nil {
		return err
	}
	lw := func(ns, resource string, list func() runtime.Object) *toolscache.ListWatch {
		return &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				out := list()
				err := wb.Get().Namespace(ns).Resource(resource).VersionedParams(&o, params).Do(ctx).Into(out)
				return out, err
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.Watch = true
				req := wb.Get().Namespace(ns).Resource(resource).VersionedParams(&o, params)
				if o.TimeoutSeconds != nil {
					req = req.Timeout(time.Duration(*o.TimeoutSeconds) * time.Second)
				}
				return req.Watch(ctx)
			},
		}
	}
	for _, ns := range namespaces {
		pools := lw(ns, "ippools", func() runtime.Object { return &shim.PoolList{} })
		reservations := lw(ns, "overlappingrangeipreservations", func() runtime.Object { return &shim.ReservationList{} })
		go func() {
			if err := objs.Watch(ctx, ns, pools, reservations); err != nil && ctx.Err() == nil {
				logf("informers of %s: %v", ns, err)
			}
		}()
	}
	return nil
}

// identity names this start of the agent as a holder of whereabouts'
// Lease: its pod's UID (POD_UID, the downward API's metadata.uid; without
// it the host name, the pod's name) and a random part, since the pid is 1
// in every container and a restarted container keeps its pod's UID.
func identity(node string, getenv func(string) string) string {
	instance := getenv("POD_UID")
	if instance == "" {
		instance, _ = os.Hostname()
	}
	return agent.Identity(node, instance)
}
