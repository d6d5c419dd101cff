package testcni

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"
)

// SandboxImage is the name of the rig's pause image, the CRI plugin's
// sandbox_image. The registry does not exist: nothing is ever pulled.
const SandboxImage = "registry.invalid/harvester-ipam/pause:rig"

// Image is a container image as an OCI image archive (oci-layout,
// index.json, blobs), which `ctr images import` reads, and the name it
// imports as.
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
// archive named ref, with env and entrypoint as its config; nothing in it
// depends on the clock, so the same entries give the same archive. An
// uncompressed layer: containerd imports it as fast, and no CPU goes to
// gzip for an archive that never leaves the machine.
func writeImage(out, ref string, entries []imageEntry, env, entrypoint []string) error {
	return writeImageAs(out, ref, entries, env, entrypoint, "")
}

// writeImageAs is writeImage with the config's user ("" is root).
func writeImageAs(out, ref string, entries []imageEntry, env, entrypoint []string, user string) error {
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	epoch := time.Unix(0, 0)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, e := range entries {
		h := &tar.Header{Name: e.Path, Mode: e.Mode, ModTime: epoch, Typeflag: tar.TypeReg}
		var body []byte
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, e.Path+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
		case e.Source != "":
			b, err := os.ReadFile(e.Source)
			if err != nil {
				return fmt.Errorf("image %s: %w", ref, err)
			}
			body = b
		default:
			body = e.Content
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	desc := func(mediaType string, b []byte) map[string]any {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(b))
		blobs[d] = b
		return map[string]any{"mediaType": mediaType, "digest": d, "size": len(b)}
	}
	cfg := map[string]any{"Env": env}
	if len(entrypoint) > 0 {
		cfg["Entrypoint"] = entrypoint
	}
	if user != "" {
		cfg["User"] = user
	}
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "config": cfg,
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{fmt.Sprintf("sha256:%x", sha256.Sum256(layer.Bytes()))}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": desc("application/vnd.oci.image.config.v1+json", config),
		"layers": []any{desc("application/vnd.oci.image.layer.v1.tar", layer.Bytes())},
	})
	md := desc("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
	md["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []any{md}})

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".image-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	aw := tar.NewWriter(tmp)
	add := func(name string, b []byte) error {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(aw, bytes.NewReader(b))
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := add(path.Join("blobs/sha256", d[len("sha256:"):]), blobs[d]); err != nil {
			return err
		}
	}
	if err := aw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
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
