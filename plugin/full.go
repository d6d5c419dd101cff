package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
)

// ReconcilerCommand runs the reconciler in the chart's DaemonSet's pod,
// whose account carries the reconciler's permissions: it works whatever
// the reconciler's mode (a CronJob by default).
const ReconcilerCommand = "kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler"

// rangeFull is what whereabouts says (every version) when no address is left.
const rangeFull = "Could not allocate IP in range"

// Bounds of the explanation of a full range: it runs on the failure path
// only, and must not turn a quick failure into a slow one.
const (
	explainTimeout  = 10 * time.Second
	explainPodNS    = 3  // namespaces whose pods are listed
	explainPodPages = 10 // pages of 500 pods, per namespace
	explainNames    = 5  // pods named in the message
)

// explainFull says in words why a range is full: for each pool of the
// config, one fresh read, how many entries it holds and how many of those
// look stale by a count of its own (the entries of a pod's earlier sandboxes,
// all but the sandbox holding the most; the entries of pods that are gone or
// finished), naming the pods, and what to run. It is a count, not the
// reconciler's judgement (which reads network-status and nodes): the message
// says so, and points at the reconciler for the judgement. Pods are listed with whereabouts' identity, in the
// namespaces the entries name: whereabouts' own ClusterRole grants pods
// list, this chart's Role does not add it; when the list fails the pool's
// own facts are still given.
func (p *Plugin) explainFull(store *shim.Store, cfg *conf.Config) (facts, hint string) {
	ctx, cancel := context.WithTimeout(context.Background(), explainTimeout)
	defer cancel()
	var parts []string
	for _, pl := range cfg.Pools {
		pool, err := store.Pool(ctx, pl.Name)
		switch {
		case err != nil:
			parts = append(parts, fmt.Sprintf("pool %s/%s could not be read (%v)", store.Namespace(), pl.Name, err))
			continue
		case pool == nil:
			parts = append(parts, fmt.Sprintf("pool %s/%s does not exist", store.Namespace(), pl.Name))
			continue
		}
		parts = append(parts, p.explainPool(ctx, store.Namespace(), pool, cfg.Kubeconfig()))
	}
	hint = "see every pool's stale entries with `" + ReconcilerCommand + " inspect`; release them now with `" +
		ReconcilerCommand + " --grace 0 --dry-run` (to see), then the same without --dry-run (the chart's DaemonSet is " +
		"harvester-ipam in kube-system unless it was installed under another name); if none is stale, widen the range"
	return strings.Join(parts, "; "), hint
}

// explainServed adds to a node agent's answer that a range is full (its
// ADD's error) the explanation the plugin's own ADD gives: the agent gives
// none, since it lists no pods with whereabouts' kubeconfig (its token is
// bound to whereabouts' pod), and here, on the host, the plugin runs as
// whereabouts would.
func (p *Plugin) explainServed(args *skel.CmdArgs, e *cnitypes.Error) {
	if e == nil || !strings.Contains(e.Msg, rangeFull) {
		return
	}
	cfg, err := p.loadForAttachment(args)
	if err != nil || len(cfg.Pools) == 0 {
		return
	}
	store, err := p.store(cfg.Kubeconfig())
	if err != nil {
		return
	}
	facts, hint := p.explainFull(store, cfg)
	e.Msg += ": " + facts
	e.Details = strings.TrimSuffix(hint+"; "+e.Details, "; ")
	log := p.logger(cfg, "ADD", args.ContainerID)
	defer log.close()
	log.Errorf("%s", e.Msg)
}

func (p *Plugin) explainPool(ctx context.Context, ns string, pool *shim.Pool, kubeconfig string) string {
	byPod := map[string][]shim.IPAllocation{}
	for _, a := range pool.Spec.Allocations {
		byPod[a.PodRef] = append(byPod[a.PodRef], a)
	}
	// A pod's entries under other sandboxes than the one holding the most:
	// two attachments of one sandbox (lhnet1, lhnet2) are not extra.
	stale := map[string]int{}     // podref -> entries that look stale
	sandboxes := map[string]int{} // podref -> sandboxes holding its entries
	var dups []string
	for ref, as := range byPod {
		if ref == "" {
			continue
		}
		per := map[string]int{}
		most := 0
		for _, a := range as {
			per[a.ContainerID]++
			most = max(most, per[a.ContainerID])
		}
		if extra := len(as) - most; extra > 0 {
			stale[ref], sandboxes[ref] = extra, len(per)
			dups = append(dups, ref)
		}
	}
	sort.Slice(dups, func(i, j int) bool {
		if len(byPod[dups[i]]) != len(byPod[dups[j]]) {
			return len(byPod[dups[i]]) > len(byPod[dups[j]])
		}
		return dups[i] < dups[j]
	})

	gone, podsNote := p.gonePods(ctx, kubeconfig, byPod)
	for _, ref := range gone {
		stale[ref] = len(byPod[ref])
	}
	total := 0
	for _, n := range stale {
		total += n
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s/%s (%s) holds %d entries, %d of them stale by this count", ns, pool.Name, pool.Spec.Range, len(pool.Spec.Allocations), total)
	var why []string
	if len(dups) > 0 {
		extra := 0
		named := make([]string, 0, explainNames)
		for i, ref := range dups {
			extra += stale[ref]
			if i < explainNames {
				named = append(named, fmt.Sprintf("%s holds %d under %d sandboxes", ref, len(byPod[ref]), sandboxes[ref]))
			}
		}
		why = append(why, fmt.Sprintf("%d entries of earlier sandboxes of %d pods (%s)", extra, len(dups), more(named, len(dups))))
	}
	if len(gone) > 0 {
		n := 0
		for _, ref := range gone {
			n += len(byPod[ref])
		}
		why = append(why, fmt.Sprintf("%d entries of %d pods gone or finished (%s)", n, len(gone), more(gone[:min(len(gone), explainNames)], len(gone))))
	}
	if podsNote != "" {
		why = append(why, podsNote)
	}
	if len(why) > 0 {
		b.WriteString(": " + strings.Join(why, "; "))
	}
	return b.String()
}

// gonePods lists the pods of the namespaces the entries name (the busiest
// first, a few at most) and returns the podrefs that are gone or finished
// (Succeeded, Failed), sorted; note says what could not be checked.
func (p *Plugin) gonePods(ctx context.Context, kubeconfig string, byPod map[string][]shim.IPAllocation) (gone []string, note string) {
	perNS := map[string]int{}
	for ref, as := range byPod {
		if ns, _, ok := strings.Cut(ref, "/"); ok && ns != "" {
			perNS[ns] += len(as)
		}
	}
	nss := make([]string, 0, len(perNS))
	for ns := range perNS {
		nss = append(nss, ns)
	}
	sort.Slice(nss, func(i, j int) bool {
		if perNS[nss[i]] != perNS[nss[j]] {
			return perNS[nss[i]] > perNS[nss[j]]
		}
		return nss[i] < nss[j]
	})
	if len(nss) == 0 {
		return nil, ""
	}
	list := p.Pods
	if list == nil {
		list = func(ctx context.Context, kubeconfig, namespace string) ([]Pod, error) {
			return kubePods(ctx, kubeconfig, namespace, p.Sleep)
		}
	}
	checked := map[string]bool{}
	var notes []string
	for i, ns := range nss {
		if i == explainPodNS {
			notes = append(notes, fmt.Sprintf("pods of %d more namespaces not checked", len(nss)-i))
			break
		}
		pods, err := list(ctx, kubeconfig, ns)
		if err != nil {
			notes = append(notes, fmt.Sprintf("could not check pods in %s (%v)", ns, err))
			continue
		}
		checked[ns] = true
		present := map[string]bool{}
		for _, pod := range pods {
			if pod.Phase != "Succeeded" && pod.Phase != "Failed" {
				present[pod.Namespace+"/"+pod.Name] = true
			}
		}
		for ref := range byPod {
			if pns, _, _ := strings.Cut(ref, "/"); pns == ns && !present[ref] {
				gone = append(gone, ref)
			}
		}
	}
	sort.Strings(gone)
	if len(checked) > 0 {
		notes = append(notes, "nodes not checked")
	}
	return gone, strings.Join(notes, "; ")
}

func more(names []string, total int) string {
	s := strings.Join(names, ", ")
	if total > len(names) {
		s += fmt.Sprintf(", and %d more", total-len(names))
	}
	return s
}

// Pod is what explaining a full range needs to know of a pod.
type Pod struct {
	Namespace, Name string
	// Phase is the pod's status.phase: Pending, Running, Succeeded, Failed.
	Phase string
}

// podList is the part of a core/v1 PodList that Pod is made from.
type podList struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"metadata"`
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	} `json:"items"`
}

// kubePods lists a namespace's pods through a bare REST client on the
// kubeconfig, decoding only names and phases: the core/v1 types and their
// scheme would be linked into every exec of the plugin (a quarter of its
// start-up) for a path taken only when a range is full.
func kubePods(ctx context.Context, kubeconfig, namespace string, sleep func(time.Duration)) ([]Pod, error) {
	kube, err := conf.LoadKubeconfig(kubeconfig, sleep)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(kube.Rest)
	cfg.APIPath, cfg.GroupVersion = "/api", &schema.GroupVersion{Version: "v1"}
	// A scheme of meta/v1 only: the server's errors (a Status) still decode.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	var out []Pod
	cont := ""
	for page := 0; page < explainPodPages; page++ {
		res := rc.Get().Namespace(namespace).Resource("pods").
			Param("limit", "500").Param("continue", cont).
			Timeout(explainTimeout).Do(ctx)
		if err := res.Error(); err != nil { // the server's Status, in its words
			return nil, err
		}
		body, _ := res.Raw()
		var l podList
		if err := json.Unmarshal(body, &l); err != nil {
			return nil, fmt.Errorf("decode the pods of %s: %w", namespace, err)
		}
		for _, it := range l.Items {
			out = append(out, Pod{Namespace: it.Metadata.Namespace, Name: it.Metadata.Name, Phase: it.Status.Phase})
		}
		if cont = l.Metadata.Continue; cont == "" {
			return out, nil
		}
	}
	return nil, errors.New("too many pods to list here")
}
