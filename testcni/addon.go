package testcni

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Harvester's add-on objects and RKE2's helm-controller's.
var (
	AddonResource     = schema.GroupVersionResource{Group: "harvesterhci.io", Version: "v1beta1", Resource: "addons"}
	HelmChartResource = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
)

// ApplyAddonCRDs installs the two Addon CRDs every Harvester serves:
// Harvester's (addons.harvesterhci.io, from its v1.6.0 chart) and k3s'
// (addons.k3s.cattle.io, which RKE2 registers), and waits until both serve
// and discovery lists two resources named addons: kubectl's `addon` is as
// ambiguous here as on a Harvester node, so that a command that names the
// resource short would meet what it meets there.
func (r *Rig) ApplyAddonCRDs(ctx context.Context) error {
	for _, f := range []string{
		filepath.Join(r.Tools["harvester-crds"], "harvesterhci.io_addons.yaml"),
		filepath.Join(r.Tools["k3s-crds"], "k3s.cattle.io_addons.yaml"),
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("an Addon CRD (testcni/tools.sh harvester-crds and k3s-crds copy them): %w", err)
		}
		if err := r.Apply(ctx, b, false); err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
	}
	var groups []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		groups = groups[:0]
		_, lists, err := r.Kube.Discovery().ServerGroupsAndResources()
		if err == nil {
			for _, l := range lists {
				for _, res := range l.APIResources {
					if res.Name == "addons" {
						groups = append(groups, l.GroupVersion)
					}
				}
			}
			if len(groups) >= 2 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("discovery lists addons in %v (%v): want Harvester's and k3s'", groups, err)
		}
	}
}

// KlipperHelmImageRef names the rig's stand-in for klipper-helm, the image
// helm-controller runs its Jobs with (RKE2 sets it with --default-job-image,
// as the rig does).
const KlipperHelmImageRef = "docker.io/rancher/klipper-helm:rig-stand-in"

// KlipperHelmImage is the rig's stand-in for klipper-helm: the real helm
// (the rig's pinned helm) and, as its entrypoint, testcni/klipperhelm, which
// does what klipper-helm's entry script does for a chart from a repository;
// non-root (uid 1000) with its home at /home/klipper-helm, as the real
// image, whose Jobs run with runAsNonRoot and a read-only root filesystem.
func (r *Rig) KlipperHelmImage(ctx context.Context) (Image, error) {
	return r.images().once(KlipperHelmImageRef, func() (Image, error) {
		dir := filepath.Join(filepath.Dir(r.bin), "images")
		entry := filepath.Join(dir, "klipperhelm-entry")
		if err := r.build(ctx, entry, "./testcni/klipperhelm", "-ldflags=-s -w"); err != nil {
			return Image{}, err
		}
		out := filepath.Join(dir, "klipper-helm-rig.oci.tar")
		err := writeImageAs(out, KlipperHelmImageRef, []imageEntry{
			{Path: "usr", Dir: true, Mode: 0o755}, {Path: "usr/bin", Dir: true, Mode: 0o755},
			{Path: "usr/bin/entry", Mode: 0o755, Source: entry},
			{Path: "usr/bin/helm", Mode: 0o755, Source: r.Tools["helm"]},
			{Path: "home", Dir: true, Mode: 0o755}, {Path: "home/klipper-helm", Dir: true, Mode: 0o777},
			{Path: "tmp", Dir: true, Mode: 0o1777},
		}, []string{"PATH=/usr/bin", "HOME=/home/klipper-helm"}, []string{"/usr/bin/entry"}, "1000")
		return Image{Ref: KlipperHelmImageRef, Archive: out}, err
	})
}

// StartHelmController runs RKE2's helm-controller on the cluster's machine,
// as RKE2's supervisor runs it: every namespace, its Jobs with jobImage and
// the cluster-admin ClusterRole. It registers its CRDs (HelmChart,
// HelmChartConfig) itself.
func (r *Rig) StartHelmController(ctx context.Context, jobImage string) error {
	bin := r.Tools["helm-controller"]
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("no helm-controller at %q (testcni/tools.sh helm-controller builds it)", bin)
	}
	args := []string{"--kubeconfig", r.Kubeconfig, "--default-job-image", jobImage}
	if _, err := r.StartOnMachine("helm-controller", bin, args...); err != nil {
		return err
	}
	// helm-controller exits when it loses its leader lease (on a loaded
	// machine, an API call slower than the renewal); RKE2's supervisor
	// starts it again, and so does the rig, until the cluster closes.
	go func() {
		for {
			time.Sleep(2 * time.Second)
			r.mu.Lock()
			var last *proc
			for _, p := range r.controllers {
				if p.name == "helm-controller" {
					last = p
				}
			}
			closed := r.closed
			r.mu.Unlock()
			if closed || last == nil {
				return
			}
			if last.exited() {
				_, _ = r.StartOnMachine("helm-controller", bin, args...)
			}
		}
	}()
	// Ready once its CRD serves.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := r.Dynamic.Resource(HelmChartResource).List(ctx, metav1.ListOptions{})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("helm-controller's HelmChart CRD does not serve: %w", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ServeOnMachine serves handler over HTTP at the machine's address and
// port, for the cluster's pods and nodes: http://<machine>:<port>.
func (r *Rig) ServeOnMachine(port int, handler http.Handler) (string, func(), error) {
	if r.machine == nil {
		return "", nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	return r.ServeOnMachineAt(net.JoinHostPort(r.machine.IP, fmt.Sprint(port)), handler)
}

// ServeOnMachineAt serves handler over HTTP at addr in the machine's
// network (127.0.0.1:<port>: its nodes' localhost, where their containerd
// pulls over plain HTTP).
func (r *Rig) ServeOnMachineAt(addr string, handler http.Handler) (string, func(), error) {
	if r.machine == nil {
		return "", nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	ln, err := r.machine.listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + addr, func() { _ = srv.Close() }, nil
}

// MachineIP is the address of the cluster's machine, which the tests reach.
func (r *Rig) MachineIP() string {
	if r.machine == nil {
		return ""
	}
	return r.machine.IP
}

// Harvester's Addon states (harvesterhci.io/v1beta1 AddonState).
const (
	AddonEnabling  = "AddonEnabling"
	AddonDeployed  = "AddonDeploySuccessful"
	AddonUpdating  = "AddonUpdating"
	AddonDisabling = "AddonDisabling"
	AddonDisabled  = "AddonDisabled"
)

// StartAddonController stands in for Harvester's addon controller
// (pkg/controller/master/addon) for the Addons of namespace, as its source
// does: a new Addon, disabled, becomes AddonDisabled; enabled, it gets a
// HelmChart of its name, owned by it, with its chart, repo, version and
// valuesContent (AddonEnabling), and AddonDeploySuccessful once a
// helm-install Job created after that has succeeded; a change of those four
// while deployed updates the HelmChart (AddonUpdating, then
// AddonDeploySuccessful in the same way); disabled, the HelmChart is
// deleted (AddonDisabling) and, once it is gone (helm-controller's
// helm-delete Job ran), AddonDisabled. A Job that failed leaves the Addon
// in its state, as Harvester's marks it failed and waits. What it does not
// do: the Job's backoff patch and the conditions' messages.
func (r *Rig) StartAddonController(ctx context.Context, namespace string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	started := map[string]time.Time{} // an Addon's operation, since
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list, err := r.Dynamic.Resource(AddonResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range list.Items {
					r.syncAddon(ctx, &list.Items[i], started)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (r *Rig) syncAddon(ctx context.Context, a *unstructured.Unstructured, started map[string]time.Time) {
	ns, name := a.GetNamespace(), a.GetName()
	key := ns + "/" + name
	status, _, _ := unstructured.NestedString(a.Object, "status", "status")
	enabled, _, _ := unstructured.NestedBool(a.Object, "spec", "enabled")
	spec := map[string]any{}
	for _, f := range []string{"chart", "repo", "version", "valuesContent"} {
		v, _, _ := unstructured.NestedString(a.Object, "spec", f)
		spec[f] = v
	}
	charts := r.Dynamic.Resource(HelmChartResource).Namespace(ns)
	hc, err := charts.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		hc, err = nil, nil
	}
	if err != nil {
		return
	}
	setStatus := func(s string) {
		b := a.DeepCopy()
		_ = unstructured.SetNestedField(b.Object, s, "status", "status")
		_, _ = r.Dynamic.Resource(AddonResource).Namespace(ns).UpdateStatus(ctx, b, metav1.UpdateOptions{})
	}
	// jobDone: the helm-install Job of this operation has succeeded.
	jobDone := func() bool {
		j, err := r.Kube.BatchV1().Jobs(ns).Get(ctx, "helm-install-"+name, metav1.GetOptions{})
		if err != nil || j.CreationTimestamp.Time.Before(started[key].Truncate(time.Second)) {
			return false
		}
		return j.Status.Succeeded > 0
	}
	if !enabled {
		switch {
		case status == AddonDisabled:
		case status != AddonDisabling:
			setStatus(AddonDisabling)
		case hc != nil && hc.GetDeletionTimestamp() == nil:
			_ = charts.Delete(ctx, name, metav1.DeleteOptions{})
		case hc == nil:
			setStatus(AddonDisabled)
		}
		return
	}
	switch status {
	case "", AddonDisabled, AddonDisabling:
		if hc != nil {
			return // the one before still going
		}
		hc = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{
				"name": name, "namespace": ns,
				"ownerReferences": []any{map[string]any{"apiVersion": a.GetAPIVersion(), "kind": a.GetKind(), "name": name, "uid": string(a.GetUID())}},
			},
			"spec": spec,
		}}
		started[key] = time.Now()
		if _, err := charts.Create(ctx, hc, metav1.CreateOptions{}); err == nil {
			setStatus(AddonEnabling)
		}
	case AddonEnabling, AddonUpdating:
		if jobDone() {
			setStatus(AddonDeployed)
		}
	case AddonDeployed:
		if hc == nil {
			return
		}
		changed := false
		for f, v := range spec {
			if have, _, _ := unstructured.NestedString(hc.Object, "spec", f); have != v {
				changed = true
				_ = unstructured.SetNestedField(hc.Object, v, "spec", f)
			}
		}
		if !changed {
			return
		}
		started[key] = time.Now()
		if _, err := charts.Update(ctx, hc, metav1.UpdateOptions{}); err == nil {
			setStatus(AddonUpdating)
		}
	}
}
