package testcni

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/install/image"
)

// SandboxImage is the name of the rig's pause image, the CRI plugin's
// sandbox_image. The registry does not exist: nothing is ever pulled.
const SandboxImage = "registry.invalid/harvester-ipam/pause:rig"

// Image is a container image as an OCI image archive (oci-layout,
// index.json, blobs; and Docker's manifest.json), which `ctr images import`
// reads, and the name it imports as.
type Image struct {
	Ref     string
	Archive string
}

// imageEntry is one entry of an image's only layer: a file (from Source,
// or Content), a symlink (Link), or a directory (Dir).
type imageEntry struct {
	Path    string // in the image, without the leading /
	Mode    int64
	Source  string
	Content []byte
	Link    string
	Dir     bool
}

// writeImage packs entries as one uncompressed layer into an OCI image
// archive named ref (install/image's writer, the one that packs the chart's
// image), with env and entrypoint as its config; nothing in it depends on
// the clock, so the same entries give the same archive. An uncompressed
// layer: containerd imports it as fast, and no CPU goes to gzip for an
// archive that never leaves the machine.
func writeImage(out, ref string, entries []imageEntry, env, entrypoint []string) error {
	return writeImageAs(out, ref, entries, env, entrypoint, "")
}

// writeImageAs is writeImage with the config's user ("" is root).
func writeImageAs(out, ref string, entries []imageEntry, env, entrypoint []string, user string) error {
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon < slash {
		return fmt.Errorf("image %s: no tag", ref)
	}
	spec := image.Spec{
		Repository: ref[:colon], Tag: ref[colon+1:], Created: time.Unix(0, 0),
		OS: "linux", Architecture: "amd64", Env: env, Entrypoint: entrypoint, User: user, Uncompressed: true,
	}
	for _, e := range entries {
		f := image.File{Path: "/" + e.Path, Mode: e.Mode, Content: e.Content, Link: e.Link, Dir: e.Dir}
		if e.Source != "" {
			b, err := os.ReadFile(e.Source)
			if err != nil {
				return fmt.Errorf("image %s: %w", ref, err)
			}
			f.Content = b
		}
		spec.Files = append(spec.Files, f)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".image-*")
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := image.Write(tmp, spec); err != nil {
		tmp.Close()
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}

// buildSandboxImage builds testcni/pause (static) and packs it as the
// sandbox image: one file, /pause.
func (r *Rig) buildSandboxImage(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	if err := r.build(ctx, bin, "./testcni/pause", "-ldflags=-s -w"); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause.oci.tar")
	return out, writeImage(out, SandboxImage, []imageEntry{{Path: "pause", Mode: 0o755, Source: bin}}, nil, []string{"/pause"})
}
