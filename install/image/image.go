// Package image packs files into a container image archive without a
// container engine: one layer (gzipped, or for an archive that never leaves
// the machine, as the rig's, uncompressed), an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) that `ctr images import` reads, and beside it
// Docker's manifest.json and repositories, which `docker load` reads.
//
// The archive is reproducible: the same files, reference and time give the
// same bytes. Every timestamp is Spec.Created, tar entries are sorted and
// owned by 0:0 with fixed modes, gzip headers carry no name and no time, and
// every JSON document is marshalled from structs (fixed field order) or
// sorted maps.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"
)

// Media types (OCI image spec v1.1).
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	// MediaTypeLayerTar is an uncompressed layer (Spec.Uncompressed).
	MediaTypeLayerTar = "application/vnd.oci.image.layer.v1.tar"
)

// Annotations on the index's manifest entry.
const (
	// AnnotationRefName is the OCI layout's name of the image: its tag.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationImageName is containerd's full image name; `ctr images
	// import` names the image by it.
	AnnotationImageName = "io.containerd.image.name"
)

// File is one entry of the layer: a regular file (Content), a symbolic
// link (Link) or a directory (Dir). A file's parent directories need no
// entry of their own: they are made 0755.
type File struct {
	// Path in the image, absolute ("/usr/bin/harvester-ipam").
	Path string
	// Mode is its permission bits (0o755 for a binary, 0o1777 for /tmp); a
	// link's are 0777.
	Mode    int64
	Content []byte
	// Link is a symbolic link's target ("busybox").
	Link string
	// Dir makes a directory of Mode.
	Dir bool
}

// Spec is the image to pack.
type Spec struct {
	// Repository and Tag name the image: rancher/harvester-ipam and v0.1.0.
	Repository, Tag string
	// Created is every timestamp in the archive: the commit's time.
	Created time.Time
	// OS and Architecture are the platform (linux, amd64).
	OS, Architecture string
	Files            []File
	// Entrypoint, Env and User of the image config; no User is root.
	Entrypoint []string
	Env        []string
	User       string
	// Labels of the image config, also the manifest's annotations.
	Labels map[string]string
	// Uncompressed leaves the layer as it is (MediaTypeLayerTar): no CPU
	// goes to gzip for an archive that never leaves the machine.
	Uncompressed bool
}

// Descriptor points at a blob (OCI image spec).
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform of an index entry.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is the image manifest.
type Manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        Descriptor        `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Config is the image configuration; Docker's loader reads the same JSON.
type Config struct {
	Created      string          `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       ContainerConfig `json:"config"`
	RootFS       RootFS          `json:"rootfs"`
	History      []History       `json:"history"`
}

// ContainerConfig is what a container of the image runs with.
type ContainerConfig struct {
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	User       string            `json:"User,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// RootFS lists the layers' uncompressed digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// History is one history entry.
type History struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// DockerManifest is one entry of Docker's manifest.json.
type DockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// Result says what was written.
type Result struct {
	Ref            string // repository:tag
	Manifest       Descriptor
	Config, Layer  Descriptor
	DiffID         string // the uncompressed layer's digest
	ArchiveSHA256  string
	ArchiveSize    int64
	LayerFileCount int // the files and links, directories left out
}

// Ref is the image reference, repository:tag.
func (s Spec) Ref() string { return s.Repository + ":" + s.Tag }

func (s Spec) check() error {
	if s.Repository == "" || s.Tag == "" {
		return errors.New("image: repository and tag are required")
	}
	if strings.ContainsAny(s.Tag, ":/@ ") || len(s.Tag) > 128 {
		return fmt.Errorf("image: tag %q: want at most 128 of [A-Za-z0-9_.-]", s.Tag)
	}
	if s.Created.IsZero() {
		return errors.New("image: a creation time is required (the commit's): it is what makes the archive reproducible")
	}
	if s.OS == "" || s.Architecture == "" {
		return errors.New("image: OS and architecture are required")
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("image: file path %q: want a clean absolute path", f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("image: file %s given twice", f.Path)
		}
		if f.Dir && (f.Link != "" || f.Content != nil) || f.Link != "" && f.Content != nil {
			return fmt.Errorf("image: file %s: one of a directory, a link and content", f.Path)
		}
		seen[f.Path] = true
	}
	return nil
}

// Write writes the image archive of s to w.
func Write(w io.Writer, s Spec) (*Result, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	created := s.Created.UTC().Truncate(time.Second)
	stamp := created.Format(time.RFC3339)

	layerTar, n, err := layer(s.Files, created)
	if err != nil {
		return nil, err
	}
	diffID := digest(layerTar)
	layerBlob, layerType := layerTar, MediaTypeLayerTar
	if !s.Uncompressed {
		if layerBlob, err = gz(layerTar); err != nil {
			return nil, err
		}
		layerType = MediaTypeLayer
	}

	var paths []string
	for _, f := range s.Files {
		paths = append(paths, f.Path)
	}
	sort.Strings(paths)
	cfg := Config{
		Created: stamp, Architecture: s.Architecture, OS: s.OS,
		Config:  ContainerConfig{Env: s.Env, Entrypoint: s.Entrypoint, User: s.User, WorkingDir: "/", Labels: s.Labels},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{diffID}},
		History: []History{{Created: stamp, CreatedBy: "harvester-ipam-image: " + strings.Join(paths, " ")}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Ref: s.Ref(), DiffID: diffID, LayerFileCount: n,
		Config: Descriptor{MediaType: MediaTypeConfig, Digest: digest(cfgJSON), Size: int64(len(cfgJSON))},
		Layer:  Descriptor{MediaType: layerType, Digest: digest(layerBlob), Size: int64(len(layerBlob))},
	}
	man := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: res.Config, Layers: []Descriptor{res.Layer}, Annotations: s.Labels}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return nil, err
	}
	res.Manifest = Descriptor{MediaType: MediaTypeManifest, Digest: digest(manJSON), Size: int64(len(manJSON)),
		Platform: &Platform{Architecture: s.Architecture, OS: s.OS},
		Annotations: map[string]string{
			AnnotationRefName:   s.Tag,
			AnnotationImageName: FullName(s.Repository) + ":" + s.Tag,
		}}
	idxJSON, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{res.Manifest}})
	if err != nil {
		return nil, err
	}
	dockerJSON, err := json.Marshal([]DockerManifest{{
		Config:   blobPath(res.Config.Digest),
		RepoTags: []string{s.Ref()},
		Layers:   []string{blobPath(res.Layer.Digest)},
	}})
	if err != nil {
		return nil, err
	}
	// Docker's legacy "repositories": repository -> tag -> top layer ID.
	reposJSON, err := json.Marshal(map[string]map[string]string{s.Repository: {s.Tag: strings.TrimPrefix(res.Layer.Digest, "sha256:")}})
	if err != nil {
		return nil, err
	}

	entries := map[string][]byte{
		"oci-layout":                  []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json":                  idxJSON,
		"manifest.json":               dockerJSON,
		"repositories":                reposJSON,
		blobPath(res.Config.Digest):   cfgJSON,
		blobPath(res.Layer.Digest):    layerBlob,
		blobPath(res.Manifest.Digest): manJSON,
	}
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(w, h)}
	if err := archive(cw, entries, []string{"blobs/", "blobs/sha256/"}, created); err != nil {
		return nil, err
	}
	res.ArchiveSHA256, res.ArchiveSize = hex.EncodeToString(h.Sum(nil)), cw.n
	return res, nil
}

// FullName is a repository as containerd names it: docker.io/ for a
// repository without a registry, library/ for a bare name.
func FullName(repo string) string {
	first, _, hasSlash := strings.Cut(repo, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return repo
	}
	if !hasSlash {
		repo = "library/" + repo
	}
	return "docker.io/" + repo
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// layer is the uncompressed layer: the files and their parent directories,
// sorted, each owned by root with fixed modes and the one timestamp.
func layer(files []File, mtime time.Time) ([]byte, int, error) {
	dirs := map[string]int64{} // a directory's mode, by its name with a slash
	content := map[string]File{}
	for _, f := range files {
		p := strings.TrimPrefix(f.Path, "/")
		if f.Dir {
			dirs[p+"/"] = f.Mode & 0o7777
		} else {
			content[p] = f
		}
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := dirs[d+"/"]; !ok {
				dirs[d+"/"] = 0o755
			}
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	for p := range content {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		hdr := &tar.Header{Name: name, ModTime: mtime, Format: tar.FormatUSTAR}
		switch f, isFile := content[name]; {
		case !isFile:
			hdr.Typeflag, hdr.Mode = tar.TypeDir, dirs[name]
		case f.Link != "":
			hdr.Typeflag, hdr.Mode, hdr.Linkname = tar.TypeSymlink, 0o777, f.Link
		default:
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, f.Mode&0o7777, int64(len(f.Content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, 0, fmt.Errorf("layer: %s: %w", name, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(content[name].Content); err != nil {
				return nil, 0, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), len(content), nil
}

// gz compresses with a header that has no name, no time and no OS: the
// same input gives the same bytes.
func gz(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	zw.Header = gzip.Header{OS: 255} // unknown OS, no name, no ModTime
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// archive writes the outer tar: directories, then files, each sorted.
func archive(w io.Writer, files map[string][]byte, dirs []string, mtime time.Time) error {
	tw := tar.NewWriter(w)
	sort.Strings(dirs)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b := files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
