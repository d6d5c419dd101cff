package testcni

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harvester/harvester-ipam/install/image"
)

// The rig's images, written by install/image's writer: named as the nodes'
// `ctr images import` names them (the ref whole), an uncompressed layer with
// the directories, links and user asked for, and the same bytes again for
// the same entries (nothing of the clock).
func TestTheRigsImagesAreNamedByTheirRef(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bb")
	if err := os.WriteFile(src, []byte("busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(out string) []byte {
		t.Helper()
		err := writeImageAs(out, KlipperHelmImageRef, []imageEntry{
			{Path: "bin/busybox", Mode: 0o755, Source: src}, {Path: "bin/sh", Link: "busybox"},
			{Path: "tmp", Dir: true, Mode: 0o1777}, {Path: "etc/motd", Mode: 0o644, Content: []byte("hi")},
		}, []string{"PATH=/bin"}, []string{"/bin/sh"}, "1000")
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := write(filepath.Join(dir, "a", "x.oci.tar"))
	if b := write(filepath.Join(dir, "b", "x.oci.tar")); !bytes.Equal(a, b) {
		t.Error("two archives of the same entries differ")
	}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	blob := func(d image.Descriptor) []byte { return files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")] }
	var idx image.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	if got := idx.Manifests[0].Annotations[image.AnnotationImageName]; got != KlipperHelmImageRef {
		t.Errorf("imported as %q, want %q", got, KlipperHelmImageRef)
	}
	var man image.Manifest
	if err := json.Unmarshal(blob(idx.Manifests[0]), &man); err != nil || len(man.Layers) != 1 || man.Layers[0].MediaType != image.MediaTypeLayerTar {
		t.Fatalf("manifest %+v: %v", man, err)
	}
	var cfg image.Config
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil || cfg.Config.User != "1000" || cfg.Config.Entrypoint[0] != "/bin/sh" {
		t.Errorf("config %+v: %v", cfg, err)
	}
	lr := tar.NewReader(bytes.NewReader(blob(man.Layers[0])))
	var got []string
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %c %o %s", h.Name, h.Typeflag, h.Mode, h.Linkname))
	}
	want := []string{"bin/ 5 755 ", "bin/busybox 0 755 ", "bin/sh 2 777 busybox", "etc/ 5 755 ", "etc/motd 0 644 ", "tmp/ 5 1777 "}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("layer %q, want %q", got, want)
	}
}
