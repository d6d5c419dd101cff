package main

// The NAD follower's wiring: its flags in loop mode, and the unfollow
// subcommand. The follower itself is package install/follow.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/install/follow"
)

// selectorList is a repeatable --nad-selector.
type selectorList []string

func (s *selectorList) String() string     { return strings.Join(*s, " | ") }
func (s *selectorList) Set(v string) error { *s = append(*s, v); return nil }

type followOptions struct {
	enabled   bool
	selectors selectorList
	namespace string
	resync    time.Duration
}

// register adds the follower's flags to the loop's flag set.
func (f *followOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "follow-nads", false, "also switch the ipam.type of NADs matching --nad-selector from whereabouts to harvester-ipam, as they appear (loop mode only)")
	f.registerCommon(fs)
	fs.DurationVar(&f.resync, "nad-resync", 10*time.Minute, "how often the follower re-examines every matching NAD")
}

func (f *followOptions) registerCommon(fs *flag.FlagSet) {
	fs.Var(&f.selectors, "nad-selector", fmt.Sprintf("label selector of the NADs to follow; repeat it to follow NADs matching any (default %q and %q)", follow.StorageNetworkLabel, follow.RWXNetworkLabel))
	fs.StringVar(&f.namespace, "nad-namespace", "harvester-system", "namespace of the NADs to follow; empty is every namespace")
}

// check refuses a follower that could not run: it needs the loop (one pass
// and exit would switch only the NADs there at that moment).
func (f *followOptions) check(interval time.Duration, inspect bool) error {
	if !f.enabled {
		return nil
	}
	if inspect || interval <= 0 {
		return errors.New("--follow-nads runs beside the loop: give --interval a duration above 0 (a Deployment, not a CronJob)")
	}
	_, err := follow.ParseSelectors(f.selectors)
	return err
}

// startFollower starts the follower in the background when enabled; it
// stops with ctx. It has a client of its own, so that its requests are not
// counted as the passes'.
func startFollower(ctx context.Context, kubeconfig string, f followOptions) error {
	if !f.enabled {
		return nil
	}
	fl, _, err := newFollower(kubeconfig, f, 0)
	if err != nil {
		return err
	}
	go func() {
		if err := fl.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "harvester-ipam-reconciler: follower:", err)
		}
	}()
	return nil
}

func newFollower(kubeconfig string, f followOptions, timeout time.Duration) (*follow.Follower, kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "harvester-ipam-follower"
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	fl, err := follow.New(follow.Config{
		Client: dyn, Events: kube.CoreV1(), Namespace: f.namespace, Selectors: f.selectors, Resync: f.resync, Timeout: timeout,
		Component: "harvester-ipam-follower",
		Logf:      func(format string, args ...any) { fmt.Fprintf(os.Stderr, "follower: "+format+"\n", args...) },
	})
	return fl, kube, err
}

// unfollowMain is `harvester-ipam-reconciler unfollow`: stop the follower,
// then switch every matching NAD whose ipam.type is harvester-ipam back to
// whereabouts. It exits 1 when any could not be switched back, 2 on bad
// flags.
func unfollowMain(args []string) int {
	var f followOptions
	var kubeconfig, stop string
	var timeout, wait time.Duration
	fs := flag.NewFlagSet("harvester-ipam-reconciler unfollow", flag.ContinueOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig; empty uses the in-cluster service account")
	f.registerCommon(fs)
	fs.StringVar(&stop, "stop-deployment", "", "NAMESPACE/NAME of the Deployment whose follower to stop first (scaled to 0, its pods gone)")
	fs.DurationVar(&wait, "stop-wait", 2*time.Minute, "how long to wait for the stopped Deployment's pods to go")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "bound of every API call")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: harvester-ipam-reconciler unfollow [flags]\n\n"+
			"Switches every NAD matching --nad-selector whose ipam.type is harvester-ipam back to whereabouts,\n"+
			"every other byte of its config kept, with an Event on it. Exits 1 if any NAD could not be switched.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unfollow: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	stopNS, stopName, ok := strings.Cut(stop, "/")
	if stop != "" && (!ok || stopNS == "" || stopName == "") {
		fmt.Fprintf(os.Stderr, "unfollow: --stop-deployment=%q: want NAMESPACE/NAME\n", stop)
		return 2
	}
	if _, err := follow.ParseSelectors(f.selectors); err != nil {
		fmt.Fprintln(os.Stderr, "unfollow:", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	fl, kube, err := newFollower(kubeconfig, f, timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "unfollow:", err)
		return 1
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "unfollow: "+format+"\n", args...) }
	if stop != "" {
		if err := follow.StopDeployment(ctx, kube, stopNS, stopName, timeout, wait, logf); err != nil {
			fmt.Fprintln(os.Stderr, "unfollow: the follower is not stopped, so no NAD is switched back:", err)
			return 1
		}
	}
	results, err := fl.Unfollow(ctx)
	switched, failed := 0, 0
	for _, r := range results {
		fmt.Println(r)
		switch {
		case r.Err != nil:
			failed++
		case r.Outcome == follow.Switched && !r.Gone && r.Unswitchable == nil:
			switched++
		}
	}
	if err != nil && failed == 0 { // the NADs could not even be listed
		fmt.Fprintln(os.Stderr, "unfollow:", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "unfollow: %d of %d NADs not switched back to whereabouts:\n%v\n", failed, len(results), err)
		return 1
	}
	fmt.Printf("unfollow: %d NADs switched back to whereabouts, %d left as they were\n", switched, len(results)-switched)
	return 0
}
