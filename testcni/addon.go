package testcni

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Harvester's add-on objects and RKE2's helm-controller's.
var (
	AddonResource     = schema.GroupVersionResource{Group: "harvesterhci.io", Version: "v1beta1", Resource: "addons"}
	HelmChartResource = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
)

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
	addr := net.JoinHostPort(r.machine.IP, fmt.Sprint(port))
	ln, err := r.machine.listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + addr, func() { _ = srv.Close() }, nil
}
