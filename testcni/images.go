package testcni

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// WhereaboutsImageRef is the image Harvester's chart runs whereabouts from.
func WhereaboutsImageRef(version string) string {
	return "ghcr.io/k8snetworkplumbingwg/whereabouts:" + version
}

// ChartImageRepository is the chart's image.repository.
const ChartImageRepository = "rancher/harvester-ipam"

// rigImages are the images a rig builds once, by name.
type rigImages struct {
	mu     sync.Mutex
	byRef  map[string]Image
	errs   map[string]error
	locks  map[string]*sync.Mutex
	tooled sync.Once
	packer string
	err    error
}

var imagesByRig sync.Map // the rig's build dir -> *rigImages

func (r *Rig) images() *rigImages {
	v, _ := imagesByRig.LoadOrStore(r.bin, &rigImages{byRef: map[string]Image{}, errs: map[string]error{}, locks: map[string]*sync.Mutex{}})
	return v.(*rigImages)
}

// once builds the image ref with build, once per rig; callers of the same
// ref wait for the one build.
func (ri *rigImages) once(ref string, build func() (Image, error)) (Image, error) {
	ri.mu.Lock()
	l := ri.locks[ref]
	if l == nil {
		l = &sync.Mutex{}
		ri.locks[ref] = l
	}
	ri.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	ri.mu.Lock()
	img, done := ri.byRef[ref]
	err := ri.errs[ref]
	ri.mu.Unlock()
	if done || err != nil {
		return img, err
	}
	img, err = build()
	ri.mu.Lock()
	if err != nil {
		ri.errs[ref] = err
	} else {
		ri.byRef[ref] = img
	}
	ri.mu.Unlock()
	return img, err
}

// WhereaboutsImage is whereabouts' image of a version as its Dockerfile lays
// it out: /whereabouts and /ip-control-loop, its own /install-cni.sh (and
// /lib.sh and /token-watcher.sh where the version has them), and a static
// busybox as /bin/sh, /bin/cp and every other applet, as in the images
// Harvester runs (upstream's on Alpine, RKE2's on SUSE BCI busybox): the
// `cp -f` that writes the node's bin dir is busybox's.
func (r *Rig) WhereaboutsImage(ctx context.Context, version string) (Image, error) {
	ref := WhereaboutsImageRef(version)
	return r.images().once(ref, func() (Image, error) {
		entries, err := r.busyboxEntries(ctx)
		if err != nil {
			return Image{}, err
		}
		entries = append(entries,
			imageEntry{Path: "whereabouts", Mode: 0o755, Source: r.Tools["whereabouts-"+version]},
			imageEntry{Path: "ip-control-loop", Mode: 0o755, Source: r.Tools["ip-control-loop-"+version]})
		// Its controllers, where the version has them: from v0.9.4 the
		// reconciler's Deployment runs /ip-reconciler, and node-slice
		// networks' controller /node-slice-controller (built with the
		// version's own end-to-end suite, testcni/tools.sh conformance).
		for path, tool := range map[string]string{"ip-reconciler": "whereabouts-reconciler-" + version, "node-slice-controller": "node-slice-controller-" + version} {
			if st, err := os.Stat(r.Tools[tool]); err == nil && st.Mode().IsRegular() {
				entries = append(entries, imageEntry{Path: path, Mode: 0o755, Source: r.Tools[tool]})
			}
		}
		scripts := r.Tools["whereabouts-script-"+version]
		for _, s := range []string{"install-cni.sh", "lib.sh", "token-watcher.sh"} {
			p := filepath.Join(scripts, s)
			if _, err := os.Stat(p); err == nil {
				entries = append(entries, imageEntry{Path: s, Mode: 0o755, Source: p})
			} else if s == "install-cni.sh" {
				return Image{}, fmt.Errorf("whereabouts %s's install-cni.sh: %w", version, err)
			}
		}
		out := filepath.Join(filepath.Dir(r.bin), "images", "whereabouts-"+version+".oci.tar")
		err = writeImage(out, ref, entries, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, nil)
		return Image{Ref: ref, Archive: out}, err
	})
}

// ChartImage is the chart's image, rancher/harvester-ipam:tag, as `make
// image` builds it (tools/image, from binaries built with
// main.Version tag, so that two tags are two builds).
func (r *Rig) ChartImage(ctx context.Context, tag string) (Image, error) {
	ri := r.images()
	ri.tooled.Do(func() {
		ri.packer = filepath.Join(r.bin, "harvester-ipam-image")
		ri.err = r.build(ctx, ri.packer, "./tools/image")
	})
	if ri.err != nil {
		return Image{}, ri.err
	}
	ref := ChartImageRepository + ":" + tag
	return ri.once(ref, func() (Image, error) {
		dir := filepath.Join(filepath.Dir(r.bin), "images", "harvester-ipam-"+tag)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return Image{}, err
		}
		// One go build for the four: their links run side by side.
		if err := r.build(ctx, dir+"/", "./cmd/harvester-ipam", "-buildvcs=false", "-ldflags=-s -w -X main.Version="+tag,
			"./cmd/harvester-ipam-agent", "./cmd/harvester-ipam-install", "./cmd/harvester-ipam-reconciler"); err != nil {
			return Image{}, err
		}
		out := filepath.Join(filepath.Dir(r.bin), "images", "harvester-ipam-"+tag+".oci.tar")
		cmd := exec.CommandContext(ctx, ri.packer, "-bin", dir, "-version", tag, "-revision", "rig", "-created", "0", "-o", out)
		cmd.Dir = r.Root
		if b, err := cmd.CombinedOutput(); err != nil {
			return Image{}, fmt.Errorf("harvester-ipam-image %s: %w: %s", tag, err, b)
		}
		return Image{Ref: "docker.io/" + ref, Archive: out}, nil
	})
}

// BusyboxImage is an image of the rig's own named ref: a static busybox as
// /bin/sh, /bin/ash and every other applet, and /tmp. whereabouts' own
// end-to-end suite runs its pods from quay.io/dougbtv/alpine:latest with
// `/bin/ash -c "trap : TERM INT; sleep infinity & wait"`, which this image
// runs as that one does; nothing is ever pulled.
func (r *Rig) BusyboxImage(ctx context.Context, ref string) (Image, error) {
	return r.images().once(ref, func() (Image, error) {
		entries, err := r.busyboxEntries(ctx)
		if err != nil {
			return Image{}, err
		}
		name := strings.NewReplacer("/", "_", ":", "_").Replace(ref)
		out := filepath.Join(filepath.Dir(r.bin), "images", name+".oci.tar")
		err = writeImage(out, ref, entries, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, nil)
		return Image{Ref: ref, Archive: out}, err
	})
}

// busyboxEntries are an image's /bin of a static busybox (every applet a
// link to it) and its /tmp.
func (r *Rig) busyboxEntries(ctx context.Context) ([]imageEntry, error) {
	bb := r.Tools["busybox"]
	applets, err := exec.CommandContext(ctx, bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list (%s; testcni/tools.sh busybox fetches it): %w", bb, err)
	}
	entries := []imageEntry{
		{Path: "bin", Dir: true, Mode: 0o755}, {Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "bin/busybox", Mode: 0o755, Source: bb},
	}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			entries = append(entries, imageEntry{Path: "bin/" + a, Link: "busybox"})
		}
	}
	return entries, nil
}
