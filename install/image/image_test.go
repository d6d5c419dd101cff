package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

func spec() Spec {
	return Spec{
		Repository: "rancher/harvester-ipam", Tag: "v0.1.0",
		Created: time.Date(2026, 11, 22, 4, 5, 6, 789, time.UTC),
		OS:      "linux", Architecture: "amd64",
		Files: []File{
			{Path: "/usr/bin/harvester-ipam-reconciler", Mode: 0o755, Content: []byte("reconciler")},
			{Path: "/usr/bin/harvester-ipam", Mode: 0o755, Content: []byte("plugin")},
			{Path: "/usr/bin/harvester-ipam-install", Mode: 0o755, Content: []byte("installer")},
		},
		Entrypoint: []string{"/usr/bin/harvester-ipam-install"},
		Env:        []string{"PATH=/usr/bin"},
		Labels:     map[string]string{"org.opencontainers.image.revision": "abc", "org.opencontainers.image.source": "https://github.com/harvester/harvester-ipam"},
	}
}

// entries reads a tar stream: name -> header and content, in order.
func entries(t *testing.T, r io.Reader) ([]string, map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(r)
	var order []string
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return order, hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, h.Name)
		hdrs[h.Name], data[h.Name] = h, b
	}
}

func sum(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

// Same spec, same bytes; the files' order in the spec does not matter; any
// change of content, tag or time gives other bytes.
func TestWriteIsReproducible(t *testing.T) {
	var a, b bytes.Buffer
	ra, err := Write(&a, spec())
	if err != nil {
		t.Fatal(err)
	}
	s := spec()
	s.Files[0], s.Files[2] = s.Files[2], s.Files[0]
	if _, err := Write(&b, s); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two archives of one spec differ")
	}
	if got := sum(a.Bytes()); got != "sha256:"+ra.ArchiveSHA256 || ra.ArchiveSize != int64(a.Len()) {
		t.Fatalf("result says %s %d, archive is %s %d", ra.ArchiveSHA256, ra.ArchiveSize, got, a.Len())
	}
	for name, change := range map[string]func(*Spec){
		"content": func(s *Spec) { s.Files[1].Content = []byte("plugin2") },
		"tag":     func(s *Spec) { s.Tag = "v0.1.1" },
		"time":    func(s *Spec) { s.Created = s.Created.Add(time.Second) },
		"mode":    func(s *Spec) { s.Files[1].Mode = 0o700 },
	} {
		s := spec()
		change(&s)
		var c bytes.Buffer
		if _, err := Write(&c, s); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(a.Bytes(), c.Bytes()) {
			t.Errorf("a changed %s gives the same archive", name)
		}
	}
}

// The archive is an OCI image layout and a docker-load archive of the same
// blobs; every digest and size holds; the layer holds exactly the files.
func TestWriteLayout(t *testing.T) {
	var buf bytes.Buffer
	res, err := Write(&buf, spec())
	if err != nil {
		t.Fatal(err)
	}
	order, hdrs, data := entries(t, &buf)
	for _, h := range hdrs {
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || !h.ModTime.Equal(time.Date(2026, 11, 22, 4, 5, 6, 0, time.UTC)) {
			t.Errorf("%s: owner %d:%d %q, mtime %v", h.Name, h.Uid, h.Gid, h.Uname, h.ModTime)
		}
	}
	want := []string{"blobs/", "blobs/sha256/"}
	if strings.Join(order[:2], ",") != strings.Join(want, ",") {
		t.Errorf("order %v", order)
	}
	if string(data["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %s", data["oci-layout"])
	}
	var idx Index
	if err := json.Unmarshal(data["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != MediaTypeIndex || len(idx.Manifests) != 1 {
		t.Fatalf("index %+v", idx)
	}
	md := idx.Manifests[0]
	if md.Annotations[AnnotationRefName] != "v0.1.0" || md.Annotations[AnnotationImageName] != "docker.io/rancher/harvester-ipam:v0.1.0" ||
		md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != "amd64" {
		t.Errorf("index entry %+v", md)
	}
	blob := func(d Descriptor) []byte {
		t.Helper()
		b, ok := data["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if !ok || sum(b) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s (%d bytes) missing or wrong", d.Digest, d.Size)
		}
		return b
	}
	var man Manifest
	if err := json.Unmarshal(blob(md), &man); err != nil {
		t.Fatal(err)
	}
	if man.MediaType != MediaTypeManifest || man.Config.MediaType != MediaTypeConfig || len(man.Layers) != 1 || man.Layers[0].MediaType != MediaTypeLayer {
		t.Fatalf("manifest %+v", man)
	}
	var cfg Config
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Created != "2026-11-22T04:05:06Z" || cfg.Config.Entrypoint[0] != "/usr/bin/harvester-ipam-install" || cfg.Config.Labels["org.opencontainers.image.revision"] != "abc" {
		t.Errorf("config %+v", cfg)
	}
	gzl := blob(man.Layers[0])
	zr, err := gzip.NewReader(bytes.NewReader(gzl))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header has name %q, time %v", zr.Name, zr.ModTime)
	}
	layerTar, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if sum(layerTar) != cfg.RootFS.DiffIDs[0] || cfg.RootFS.DiffIDs[0] != res.DiffID {
		t.Errorf("diff_id %s, layer %s", cfg.RootFS.DiffIDs[0], sum(layerTar))
	}
	lorder, lhdrs, ldata := entries(t, bytes.NewReader(layerTar))
	if got := strings.Join(lorder, " "); got != "usr/ usr/bin/ usr/bin/harvester-ipam usr/bin/harvester-ipam-install usr/bin/harvester-ipam-reconciler" {
		t.Errorf("layer entries %s", got)
	}
	if lhdrs["usr/bin/harvester-ipam"].Mode != 0o755 || lhdrs["usr/bin/"].Mode != 0o755 || string(ldata["usr/bin/harvester-ipam"]) != "plugin" {
		t.Errorf("layer file %+v", lhdrs["usr/bin/harvester-ipam"])
	}

	var dm []DockerManifest
	if err := json.Unmarshal(data["manifest.json"], &dm); err != nil {
		t.Fatal(err)
	}
	if len(dm) != 1 || dm[0].RepoTags[0] != "rancher/harvester-ipam:v0.1.0" || dm[0].Config != "blobs/sha256/"+strings.TrimPrefix(man.Config.Digest, "sha256:") ||
		dm[0].Layers[0] != "blobs/sha256/"+strings.TrimPrefix(man.Layers[0].Digest, "sha256:") {
		t.Errorf("manifest.json %+v", dm)
	}
	var repos map[string]map[string]string
	if err := json.Unmarshal(data["repositories"], &repos); err != nil || repos["rancher/harvester-ipam"]["v0.1.0"] == "" {
		t.Errorf("repositories %s", data["repositories"])
	}
}

func TestSpecRefused(t *testing.T) {
	for name, tt := range map[string]struct {
		change func(*Spec)
		want   string
	}{
		"no tag":        {func(s *Spec) { s.Tag = "" }, "repository and tag are required"},
		"bad tag":       {func(s *Spec) { s.Tag = "a/b" }, `tag "a/b"`},
		"no time":       {func(s *Spec) { s.Created = time.Time{} }, "a creation time is required"},
		"relative path": {func(s *Spec) { s.Files[0].Path = "usr/bin/x" }, `file path "usr/bin/x"`},
		"twice":         {func(s *Spec) { s.Files[0].Path = s.Files[1].Path }, "given twice"},
	} {
		s := spec()
		tt.change(&s)
		if _, err := Write(io.Discard, s); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestFullName(t *testing.T) {
	for in, want := range map[string]string{
		"rancher/harvester-ipam": "docker.io/rancher/harvester-ipam", "busybox": "docker.io/library/busybox",
		"registry.suse.com/x/y": "registry.suse.com/x/y", "localhost/x": "localhost/x", "host:5000/x": "host:5000/x",
	} {
		if got := FullName(in); got != want {
			t.Errorf("%s: %s", in, got)
		}
	}
}

// The rig's images: directories of their own modes (/tmp sticky), symbolic
// links, a user, and an uncompressed layer, whose digest is its diff_id.
func TestWriteDirsLinksUserUncompressed(t *testing.T) {
	s := spec()
	s.Files = []File{
		{Path: "/bin/busybox", Mode: 0o755, Content: []byte("bb")},
		{Path: "/bin/sh", Link: "busybox"},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/home/u", Dir: true, Mode: 0o777},
	}
	s.User, s.Uncompressed = "1000", true
	var buf bytes.Buffer
	res, err := Write(&buf, s)
	if err != nil {
		t.Fatal(err)
	}
	_, _, data := entries(t, &buf)
	blob := func(d Descriptor) []byte { return data["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")] }
	if res.Layer.MediaType != MediaTypeLayerTar || res.Layer.Digest != res.DiffID || res.LayerFileCount != 2 {
		t.Errorf("layer %+v, diff_id %s, %d files", res.Layer, res.DiffID, res.LayerFileCount)
	}
	var cfg Config
	if err := json.Unmarshal(blob(res.Config), &cfg); err != nil || cfg.Config.User != "1000" {
		t.Errorf("config %+v: %v", cfg, err)
	}
	order, hdrs, _ := entries(t, bytes.NewReader(blob(res.Layer)))
	if got := strings.Join(order, " "); got != "bin/ bin/busybox bin/sh home/ home/u/ tmp/" {
		t.Errorf("layer entries %s", got)
	}
	for name, want := range map[string]struct {
		typ  byte
		mode int64
		link string
	}{
		"bin/": {tar.TypeDir, 0o755, ""}, "bin/sh": {tar.TypeSymlink, 0o777, "busybox"}, "home/u/": {tar.TypeDir, 0o777, ""},
		"tmp/": {tar.TypeDir, 0o1777, ""}, "home/": {tar.TypeDir, 0o755, ""},
	} {
		if h := hdrs[name]; h == nil || h.Typeflag != want.typ || h.Mode != want.mode || h.Linkname != want.link {
			t.Errorf("%s: %+v, want %+v", name, h, want)
		}
	}
	s.Files = append(s.Files, File{Path: "/x", Link: "y", Content: []byte("z")})
	if _, err := Write(io.Discard, s); err == nil || !strings.Contains(err.Error(), "one of a directory, a link and content") {
		t.Errorf("a link with content: %v", err)
	}
}
