package install

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	appsclient "k8s.io/client-go/kubernetes/typed/apps/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Owner is the chart release that runs this installer: its DaemonSet, the
// namespace the DaemonSet is in, and the node, read when the installer is
// told to stop (does the chart still stand in here?), and watched while it
// runs, so that a stop whose reads are refused still knows what was last
// seen. A pod-bound token is refused once its pod object is gone (a
// force-deleted pod), and an uninstall deletes the installer's Role and
// ServiceAccount right after its DaemonSet: a watch opened before goes on
// telling what happens to the objects it watches.
type Owner struct {
	Namespace, Name string
	// Place is where this installer stands in.
	Place Place
	// Get reads the DaemonSet; GetNamespace and GetNode read the namespace
	// and the node (nil: not read). NewOwner makes them ask the API server.
	Get          func(ctx context.Context) (*appsv1.DaemonSet, error)
	GetNamespace func(ctx context.Context) (*corev1.Namespace, error)
	GetNode      func(ctx context.Context) (*corev1.Node, error)

	// The watches, once Watch has started them.
	mu      sync.Mutex
	watches map[string]*watched
	// listWatch makes the watches' list and watch calls (NewOwner's).
	listWatch map[string]*cache.ListWatch
}

// watched is one object's watch: the store holds it while it exists.
type watched struct {
	store  cache.Store
	synced func() bool
}

// NewOwner reads namespace/name (and the namespace, and the node named in
// place, when not "") with kubeconfig, or with the pod's service account
// when kubeconfig is "". Each read has a timeout of its own.
func NewOwner(kubeconfig, namespace, name string, place Place) (*Owner, error) {
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
	apps, err := appsclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client to read DaemonSet %s/%s: %w", namespace, name, err)
	}
	// The watches' client has no overall timeout: a watch is a long request.
	wcfg := rest.CopyConfig(cfg)
	wcfg.Timeout = 0
	wapps, err := appsclient.NewForConfig(wcfg)
	if err != nil {
		return nil, err
	}
	core, err := coreclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	wcore, err := coreclient.NewForConfig(wcfg)
	if err != nil {
		return nil, err
	}
	within := func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, 3*time.Second)
	}
	o := &Owner{Namespace: namespace, Name: name, Place: place,
		Get: func(ctx context.Context) (*appsv1.DaemonSet, error) {
			ctx, cancel := within(ctx)
			defer cancel()
			return apps.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		},
		GetNamespace: func(ctx context.Context) (*corev1.Namespace, error) {
			ctx, cancel := within(ctx)
			defer cancel()
			return core.Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		},
		listWatch: map[string]*cache.ListWatch{},
	}
	o.listWatch["daemonset"] = oneObject(name,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return wapps.DaemonSets(namespace).List(ctx, opts)
		},
		func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return wapps.DaemonSets(namespace).Watch(ctx, opts)
		})
	o.listWatch["namespace"] = oneObject(namespace,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return wcore.Namespaces().List(ctx, opts)
		},
		func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return wcore.Namespaces().Watch(ctx, opts)
		})
	if node := place.Node; node != "" {
		o.GetNode = func(ctx context.Context) (*corev1.Node, error) {
			ctx, cancel := within(ctx)
			defer cancel()
			return core.Nodes().Get(ctx, node, metav1.GetOptions{})
		}
		o.listWatch["node"] = oneObject(node,
			func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return wcore.Nodes().List(ctx, opts)
			},
			func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return wcore.Nodes().Watch(ctx, opts)
			})
	}
	return o, nil
}

// oneObject lists and watches the one object called name (a field selector
// on metadata.name, which RBAC's resourceNames allow), each list bounded.
func oneObject(name string, list func(context.Context, metav1.ListOptions) (runtime.Object, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListFunc: func(opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return list(ctx, opts)
		},
		WatchFunc: func(opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			return watchFn(context.Background(), opts)
		},
	}
}

// Watch watches the DaemonSet, its namespace and the node until ctx ends:
// what Removing falls back on when a read is refused. ctx must outlive the
// stop (the watches go on while the installer decides).
func (o *Owner) Watch(ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.watches != nil {
		return
	}
	o.watches = map[string]*watched{}
	types := map[string]runtime.Object{"daemonset": &appsv1.DaemonSet{}, "namespace": &corev1.Namespace{}, "node": &corev1.Node{}}
	for what, lw := range o.listWatch {
		store, ctrl := cache.NewInformer(lw, types[what], 0, cache.ResourceEventHandlerFuncs{})
		go ctrl.Run(ctx.Done())
		o.watches[what] = &watched{store: store, synced: ctrl.HasSynced}
	}
}

// seen is what a watch last saw of its object: nil when it is gone; ok
// false when the watch has not listed it yet (or does not run).
func (o *Owner) seen(what string) (obj any, ok bool) {
	o.mu.Lock()
	w := o.watches[what]
	o.mu.Unlock()
	if w == nil || !w.synced() {
		return nil, false
	}
	items := w.store.List()
	if len(items) == 0 {
		return nil, true
	}
	return items[0], true
}

// Seen judges the chart by what the watches last saw; ok is false when the
// DaemonSet's watch has not listed it yet.
func (o *Owner) Seen() (v Verdict, ok bool) {
	obj, ok := o.seen("daemonset")
	if !ok {
		return Verdict{}, false
	}
	ds, _ := obj.(*appsv1.DaemonSet)
	ns, node := o.seenNamespace(), o.seenNode()
	return Judge(ds, ns, node, o.Place), true
}

func (o *Owner) seenNamespace() *corev1.Namespace {
	obj, _ := o.seen("namespace")
	ns, _ := obj.(*corev1.Namespace)
	return ns
}

func (o *Owner) seenNode() *corev1.Node {
	obj, _ := o.seen("node")
	node, _ := obj.(*corev1.Node)
	return node
}

// Removal is what the chart's state says of this installer's stop.
type Removal struct {
	// GiveBack: the chart no longer stands in here (its DaemonSet gone or
	// being deleted, its namespace being deleted, its newest revision not
	// standing in at this name and dir, or not running on this node): the
	// stand-in's name is given back.
	GiveBack bool
	// Why says what was read, for the log.
	Why string
}

// Attempts and the pause between them bound Removing's reads; a refused
// read is not read again, but waited on the watch for a while.
const (
	removalAttempts = 3
	removalPause    = time.Second
	// watchWait is how long a stop whose reads are refused waits for the
	// watch to tell a deletion: helm uninstall deletes the DaemonSet before
	// the garbage collector deletes its pods, so the watch has it before
	// the pod is told to stop; a force-deleted pod waits it out and keeps.
	watchWait = 5 * time.Second
)

// Removing tells a give-back from a restart, a rollout, a node's shutdown
// or a force-deleted pod, the way istio-cni's node agent does, and more: it
// reads the DaemonSet now (and the namespace and the node); when the
// DaemonSet can be read, or is gone, Judge says. When the read is refused
// (the pod's token, once the pod object is gone; the account or the role,
// deleted by an uninstall) it goes by what the watches last saw, waiting a
// little for them to see a deletion. When neither tells (the API server
// unreachable since the start), it keeps what it installed.
func (o *Owner) Removing(ctx context.Context, sleep func(time.Duration)) Removal {
	ds := o.Namespace + "/" + o.Name
	var last error
	for attempt := 1; ; attempt++ {
		got, err := o.Get(ctx)
		if apierrors.IsNotFound(err) {
			got, err = nil, nil
		}
		if err == nil {
			if got == nil {
				return Removal{true, fmt.Sprintf("DaemonSet %s is gone", ds)}
			}
			v := Judge(got, o.readNamespace(ctx), o.readNode(ctx), o.Place)
			if v.StandsIn {
				return Removal{false, fmt.Sprintf("DaemonSet %s is in place and stands in here (a restart, an upgrade, a node's shutdown or a force-deleted pod)", ds)}
			}
			return Removal{true, v.Why}
		}
		last = err
		if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || attempt >= removalAttempts || ctx.Err() != nil {
			break
		}
		sleep(removalPause)
	}
	if errors.Is(last, context.Canceled) || errors.Is(last, context.DeadlineExceeded) {
		last = fmt.Errorf("no answer: %w", last)
	}
	v, ok := o.Seen()
	refused := apierrors.IsUnauthorized(last) || apierrors.IsForbidden(last)
	for waited := time.Duration(0); refused && ok && v.StandsIn && waited < watchWait && ctx.Err() == nil; waited += 200 * time.Millisecond {
		sleep(200 * time.Millisecond)
		v, ok = o.Seen()
	}
	if !ok {
		return Removal{false, fmt.Sprintf("DaemonSet %s could not be read (%v), and no watch saw it, so this may be a restart", ds, last)}
	}
	if v.StandsIn {
		return Removal{false, fmt.Sprintf("DaemonSet %s could not be read now (%v); as last seen, it stands in here (a force-deleted pod, a restart)", ds, last)}
	}
	return Removal{true, fmt.Sprintf("DaemonSet %s could not be read now (%v); as last seen, %s", ds, last, v.Why)}
}

// readNamespace reads the namespace now, else what its watch last saw.
func (o *Owner) readNamespace(ctx context.Context) *corev1.Namespace {
	if o.GetNamespace != nil {
		if ns, err := o.GetNamespace(ctx); err == nil {
			return ns
		}
	}
	return o.seenNamespace()
}

// readNode reads the node now, else what its watch last saw.
func (o *Owner) readNode(ctx context.Context) *corev1.Node {
	if o.GetNode != nil {
		if n, err := o.GetNode(ctx); err == nil {
			return n
		}
	}
	return o.seenNode()
}

// StillStandsIn says, from what the watches last saw, whether the chart
// still stands in here; true when they have not seen it yet.
func (o *Owner) StillStandsIn() (bool, string) {
	v, ok := o.Seen()
	if !ok {
		return true, ""
	}
	return v.StandsIn, v.Why
}
