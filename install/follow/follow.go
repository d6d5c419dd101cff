package follow

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
)

// NADResource is the NetworkAttachmentDefinition resource of Multus' CRD.
var NADResource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// The labels Harvester's controllers put on the NADs they generate: the sha1
// of the setting's value. Harvester finds its NAD by this label and never
// rewrites its config, so a switched NAD stays switched.
const (
	StorageNetworkLabel = "storage-network.settings.harvesterhci.io/hash"
	RWXNetworkLabel     = "rwx-network.settings.harvesterhci.io/hash"
)

// DefaultSelectors match the NADs of Harvester's storage network and of its
// RWX network: a NAD that has either label. Label selectors only AND their
// requirements, so "either" is two selectors, each watched on its own.
var DefaultSelectors = []string{StorageNetworkLabel, RWXNetworkLabel}

// Event reasons, on the NAD.
const (
	ReasonSwitchedToHarvesterIPAM = "SwitchedToHarvesterIPAM"
	ReasonSwitchedToWhereabouts   = "SwitchedToWhereabouts"
	ReasonNotSwitched             = "NotSwitched"
)

// Config is what a Follower needs.
type Config struct {
	// Client reads and writes NADs.
	Client dynamic.Interface
	// Events records Events on the NADs.
	Events typedcorev1.EventsGetter
	// Namespace holds the NADs to follow; empty is every namespace.
	Namespace string
	// Selectors: a NAD matching any of them is followed. Empty is
	// DefaultSelectors.
	Selectors []string
	// Resync re-examines every matching NAD this often, besides watching
	// them; 0 is 10 minutes.
	Resync time.Duration
	// Timeout bounds every API call; 0 is 30 s.
	Timeout time.Duration
	// Component names the follower in its Events (source.component).
	Component string
	// Logf logs; nil logs to stderr.
	Logf func(format string, args ...any)
}

// Follower switches matching NADs' ipam.type (see the package comment).
type Follower struct {
	cfg       Config
	selectors []labels.Selector
	instance  string

	mu     sync.Mutex
	warned map[types.UID]string // NAD -> resourceVersion already warned about
}

// ParseSelectors parses label selectors, refusing empty ones: an empty
// selector would match every NAD, Harvester's or not.
func ParseSelectors(ss []string) ([]labels.Selector, error) {
	if len(ss) == 0 {
		ss = DefaultSelectors
	}
	var out []labels.Selector
	for _, s := range ss {
		sel, err := labels.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("NAD selector %q: %w", s, err)
		}
		if sel.Empty() {
			return nil, fmt.Errorf("NAD selector %q matches every NAD: name a label", s)
		}
		out = append(out, sel)
	}
	return out, nil
}

// New checks cfg and makes a Follower.
func New(cfg Config) (*Follower, error) {
	if cfg.Client == nil || cfg.Events == nil {
		return nil, errors.New("follow: a NAD client and an events client are required")
	}
	sels, err := ParseSelectors(cfg.Selectors)
	if err != nil {
		return nil, err
	}
	if cfg.Resync == 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Component == "" {
		cfg.Component = "harvester-ipam-follower"
	}
	if cfg.Logf == nil {
		l := log.New(os.Stderr, "", log.LstdFlags)
		cfg.Logf = l.Printf
	}
	host, _ := os.Hostname()
	return &Follower{cfg: cfg, selectors: sels, instance: host, warned: map[types.UID]string{}}, nil
}

// matches says whether a NAD's labels match any selector.
func (f *Follower) matches(l map[string]string) bool {
	for _, s := range f.selectors {
		if s.Matches(labels.Set(l)) {
			return true
		}
	}
	return false
}

func (f *Follower) nads(ns string) dynamic.ResourceInterface {
	return f.cfg.Client.Resource(NADResource).Namespace(ns)
}

// Result is what happened to one NAD.
type Result struct {
	Namespace, Name string
	// Outcome is set when the config was read and could be switched.
	Outcome Outcome
	// Found is the ipam.type the NAD had; To the one it was to get.
	Found, To string
	// Gone: the NAD was deleted, or no longer matches the selectors.
	Gone bool
	// Unswitchable says why the NAD's config cannot be switched.
	Unswitchable error
	Err          error
}

func (r Result) String() string {
	ref := r.Namespace + "/" + r.Name
	switch {
	case r.Err != nil:
		return fmt.Sprintf("%s: not switched: %v", ref, r.Err)
	case r.Gone:
		return ref + ": gone or no longer matches the selector; left alone"
	case r.Unswitchable != nil:
		return fmt.Sprintf("%s: left alone: %v", ref, r.Unswitchable)
	case r.Outcome == Switched:
		return fmt.Sprintf("%s: ipam.type %q -> %q", ref, r.Found, r.To)
	}
	return fmt.Sprintf("%s: ipam.type is %q; left alone", ref, r.Found)
}

// Switch switches one NAD's ipam.type from -> to, when it is from and the
// NAD matches the selectors, and records an Event. It reads the NAD fresh
// and writes with its resourceVersion, retrying a conflict (a concurrent
// writer: Harvester relabelling its NAD, say) with a fresh read, a bounded
// number of times. A config that cannot be switched gets a Warning Event,
// once per resourceVersion.
func (f *Follower) Switch(ctx context.Context, ns, name, from, to string) Result {
	res := Result{Namespace: ns, Name: name, To: to}
	var updated *unstructured.Unstructured
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		res = Result{Namespace: ns, Name: name, To: to}
		cctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
		defer cancel()
		obj, err := f.nads(ns).Get(cctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			res.Gone = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if !f.matches(obj.GetLabels()) {
			res.Gone = true
			return nil
		}
		config, ok, err := unstructured.NestedString(obj.Object, "spec", "config")
		if err != nil || !ok {
			res.Unswitchable = fmt.Errorf("%w: no spec.config string", ErrNotSwitchable)
			f.warn(ctx, obj, res.Unswitchable)
			return nil
		}
		out, found, o, err := SetIPAMType([]byte(config), from, to)
		res.Found, res.Outcome = found, o
		if err != nil {
			res.Unswitchable = err
			f.warn(ctx, obj, err)
			return nil
		}
		if o != Switched {
			return nil
		}
		if err := unstructured.SetNestedField(obj.Object, string(out), "spec", "config"); err != nil {
			return err
		}
		// Update carries the resourceVersion just read: a NAD changed since
		// is refused with a conflict, and read again.
		updated, err = f.nads(ns).Update(cctx, obj, metav1.UpdateOptions{FieldManager: f.cfg.Component})
		if err != nil {
			return err // a conflict is retried; wrapped below
		}
		return nil
	})
	if err != nil {
		res.Err = fmt.Errorf("switch ipam.type of NAD %s/%s from %s to %s: %w", ns, name, from, to, err)
		return res
	}
	if updated != nil {
		reason := ReasonSwitchedToHarvesterIPAM
		if to == Whereabouts {
			reason = ReasonSwitchedToWhereabouts
		}
		f.event(ctx, updated, corev1.EventTypeNormal, reason,
			fmt.Sprintf("ipam.type %q -> %q in spec.config; every other byte of it kept as it was", from, to))
	}
	return res
}

// warn records a Warning Event on a NAD whose config cannot be switched,
// once per resourceVersion: resyncs do not repeat it.
func (f *Follower) warn(ctx context.Context, obj *unstructured.Unstructured, why error) {
	f.mu.Lock()
	rv, seen := f.warned[obj.GetUID()]
	seen = seen && rv == obj.GetResourceVersion()
	f.warned[obj.GetUID()] = obj.GetResourceVersion()
	f.mu.Unlock()
	if seen {
		return
	}
	f.cfg.Logf("NAD %s/%s left alone: %v", obj.GetNamespace(), obj.GetName(), why)
	f.event(ctx, obj, corev1.EventTypeWarning, ReasonNotSwitched,
		fmt.Sprintf("ipam.type not switched, the NAD is left as it is: %v", why))
}

// event records an Event on the NAD. It is written directly rather than
// through client-go's EventBroadcaster: that one sends asynchronously and
// drops what is queued when the process exits, and `unfollow` exits as soon
// as it is done. A follower writes one Event per switch, so there is nothing
// to aggregate. A failed Event fails nothing but is logged.
func (f *Follower) event(ctx context.Context, obj *unstructured.Unstructured, typ, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go's recorder names them.
			Name:      fmt.Sprintf("%v.%x", obj.GetName(), now.UnixNano()),
			Namespace: obj.GetNamespace(),
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(),
			Namespace: obj.GetNamespace(), Name: obj.GetName(),
			UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion(),
		},
		Reason: reason, Message: msg, Type: typ,
		Source:         corev1.EventSource{Component: f.cfg.Component, Host: f.instance},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "harvesterhci.io/" + f.cfg.Component, ReportingInstance: f.instance,
	}
	cctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	if _, err := f.cfg.Events.Events(ev.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		f.cfg.Logf("event %s on NAD %s/%s not recorded: %v", reason, obj.GetNamespace(), obj.GetName(), err)
	}
}

// Run follows the NADs until ctx ends: every NAD that matches a selector,
// when it appears, changes or is resynced, and has ipam.type whereabouts, is
// switched to harvester-ipam. It returns once its workers have stopped.
func (f *Follower) Run(ctx context.Context) error {
	q := workqueue.NewRateLimitingQueueWithConfig(workqueue.DefaultControllerRateLimiter(), workqueue.RateLimitingQueueConfig{Name: "nad-follower"})
	defer q.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			q.Add(key)
		}
	}
	var stores []cache.Store
	var synced []cache.InformerSynced
	for _, sel := range f.selectors {
		inf := cache.NewSharedIndexInformer(f.listWatch(ctx, sel.String()), &unstructured.Unstructured{}, f.cfg.Resync, cache.Indexers{})
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) }, // resyncs too
		}); err != nil {
			return fmt.Errorf("follow NADs: %w", err)
		}
		stores = append(stores, inf.GetStore())
		synced = append(synced, inf.HasSynced)
		go inf.Run(ctx.Done())
	}
	f.cfg.Logf("following NADs in %s matching %s: ipam.type %s -> %s", f.where(), f.selectorText(), Whereabouts, HarvesterIPAM)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	// One worker: NADs change rarely, and one at a time keeps the log plain.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f.next(ctx, q, stores) {
		}
	}()
	<-ctx.Done()
	q.ShutDown() // the worker finishes the NAD in hand, then stops
	<-done
	return nil
}

// maxRequeues bounds the retries of one NAD's failed switch; the next
// resync (or change of the NAD) tries again.
const maxRequeues = 8

func (f *Follower) next(ctx context.Context, q workqueue.RateLimitingInterface, stores []cache.Store) bool {
	item, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(item)
	key := item.(string)
	// The informers' cache says whether there is anything to do; the switch
	// itself reads the NAD fresh. A resync of switched NADs costs no request.
	var cached *unstructured.Unstructured
	for _, s := range stores {
		if obj, ok, _ := s.GetByKey(key); ok {
			cached = obj.(*unstructured.Unstructured)
			break
		}
	}
	if cached == nil { // deleted
		q.Forget(item)
		return true
	}
	config, _, _ := unstructured.NestedString(cached.Object, "spec", "config")
	if t, err := IPAMType([]byte(config)); err == nil && t != Whereabouts {
		q.Forget(item) // already switched, or another IPAM: left alone, no request
		return true
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	r := f.Switch(ctx, ns, name, Whereabouts, HarvesterIPAM)
	switch {
	case r.Err != nil && ctx.Err() == nil:
		if q.NumRequeues(item) < maxRequeues {
			f.cfg.Logf("%v (retrying)", r.Err)
			q.AddRateLimited(item)
			return true
		}
		f.cfg.Logf("%v (giving up until the next resync, in %s)", r.Err, f.cfg.Resync)
	case r.Err == nil && r.Outcome == Switched && !r.Gone && r.Unswitchable == nil:
		f.cfg.Logf("%s", r)
	}
	q.Forget(item)
	return true
}

// listWatch lists and watches the NADs of one selector, each list bounded
// by the timeout; a watch lives until ctx ends or the server closes it.
func (f *Follower) listWatch(ctx context.Context, selector string) cache.ListerWatcher {
	return &cache.ListWatch{
		ListFunc: func(opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			cctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
			defer cancel()
			return f.nads(f.cfg.Namespace).List(cctx, opts)
		},
		WatchFunc: func(opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return f.nads(f.cfg.Namespace).Watch(ctx, opts)
		},
	}
}

func (f *Follower) where() string {
	if f.cfg.Namespace == "" {
		return "every namespace"
	}
	return "namespace " + f.cfg.Namespace
}

func (f *Follower) selectorText() string {
	var s []string
	for _, sel := range f.selectors {
		s = append(s, fmt.Sprintf("%q", sel.String()))
	}
	return strings.Join(s, " or ")
}

// Unfollow switches every NAD that matches a selector and has ipam.type
// harvester-ipam back to whereabouts, each byte-for-byte as it was but
// that token, with an Event. It returns what happened to each matching NAD
// (sorted), and an error when any could not be switched back or the NADs
// could not be listed.
func (f *Follower) Unfollow(ctx context.Context) ([]Result, error) {
	seen := map[string]bool{}
	var keys []string
	for _, sel := range f.selectors {
		opts := metav1.ListOptions{LabelSelector: sel.String(), Limit: 250}
		for {
			cctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
			l, err := f.nads(f.cfg.Namespace).List(cctx, opts)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("list NADs in %s matching %q: %w", f.where(), sel.String(), err)
			}
			for _, o := range l.Items {
				if k := o.GetNamespace() + "/" + o.GetName(); !seen[k] {
					seen[k] = true
					keys = append(keys, k)
				}
			}
			if opts.Continue = l.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	sort.Strings(keys)
	var results []Result
	var errs []error
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		r := f.Switch(ctx, ns, name, HarvesterIPAM, Whereabouts)
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
		results = append(results, r)
	}
	return results, errors.Join(errs...)
}
