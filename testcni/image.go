package testcni

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// SandboxImage is the name of the rig's pause image, the CRI plugin's
// sandbox_image. The registry does not exist: nothing is ever pulled.
const SandboxImage = "registry.invalid/harvester-ipam/pause:rig"

// buildSandboxImage builds testcni/pause (static) and packs it as an OCI image
// archive (oci-layout, index.json, blobs), as `ctr images import` reads it.
func (r *Rig) buildSandboxImage(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	if err := r.build(ctx, bin, "./testcni/pause", "-ldflags=-s -w"); err != nil {
		return "", err
	}
	pause, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	// The layer: one file, /pause.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(pause)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(pause); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(layer.Bytes()); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) string {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(b))
		blobs[d] = b
		return d
	}
	desc := func(mediaType string, b []byte) map[string]any {
		return map[string]any{"mediaType": mediaType, "digest": put(b), "size": len(b)}
	}
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/pause"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{fmt.Sprintf("sha256:%x", sha256.Sum256(layer.Bytes()))}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": desc("application/vnd.oci.image.config.v1+json", config),
		"layers": []any{desc("application/vnd.oci.image.layer.v1.tar+gzip", gz.Bytes())},
	})
	md := desc("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": SandboxImage, "org.opencontainers.image.ref.name": SandboxImage}
	md["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []any{md}})

	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	add := func(name string, b []byte) error {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := aw.Write(b)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return "", err
	}
	if err := add("index.json", index); err != nil {
		return "", err
	}
	for d, b := range blobs {
		if err := add("blobs/sha256/"+d[len("sha256:"):], b); err != nil {
			return "", err
		}
	}
	if err := aw.Close(); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause.oci.tar")
	if err := os.WriteFile(out, archive.Bytes(), 0o644); err != nil {
		return "", err
	}
	return out, nil
}
