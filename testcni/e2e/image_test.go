package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/harvester/harvester-ipam/install/image"
)

// `make image` of the chart's default image, twice: the same bytes. The archive is what `docker load`
// and `ctr images import` read: index.json -> manifest -> config -> layer,
// every digest and size right, Docker's manifest.json naming the same
// blobs; the layer holds the three static binaries in /usr/bin, and each
// runs from it: the plugin answers CNI VERSION, the installer and the
// reconciler print their usage.
func TestImageArchiveIsReproducibleAndRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The image the chart runs by default: a release, built on the tag that
	// is the chart's appVersion.
	ds := typed[appsv1.DaemonSet](t, objects(t, render(t, "harvester-ipam", "kube-system")), "DaemonSet")
	chartImage := ds.Spec.Template.Spec.Containers[0].Image
	repo, tag, _ := strings.Cut(chartImage, ":")
	require.Equal(t, "rancher/harvester-ipam", repo)
	var archives [][]byte
	for _, name := range []string{"a.tar", "b.tar"} {
		cmd := exec.CommandContext(ctx(t), "make", "-s", "-C", rig.Root, "image", "VERSION="+tag, "IMAGE="+filepath.Join(dir, name))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "make image: %s", out)
		assert.Contains(t, string(out), chartImage+" (linux/")
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		archives = append(archives, b)
	}
	require.True(t, bytes.Equal(archives[0], archives[1]), "two builds of one commit give the same archive")

	files := untar(t, archives[0])
	assert.Equal(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))
	var idx image.Index
	require.NoError(t, json.Unmarshal(files["index.json"], &idx))
	require.Len(t, idx.Manifests, 1)
	md := idx.Manifests[0]
	assert.Equal(t, tag, md.Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, "docker.io/"+chartImage, md.Annotations["io.containerd.image.name"])
	blob := func(d image.Descriptor) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		require.True(t, ok, "blob %s in the archive", d.Digest)
		s := sha256.Sum256(b)
		require.Equal(t, d.Digest, "sha256:"+hex.EncodeToString(s[:]), "digest of %s", d.MediaType)
		require.Equal(t, d.Size, int64(len(b)), "size of %s", d.MediaType)
		return b
	}
	var man image.Manifest
	require.NoError(t, json.Unmarshal(blob(md), &man))
	assert.Equal(t, image.MediaTypeManifest, man.MediaType)
	var cfg image.Config
	require.NoError(t, json.Unmarshal(blob(man.Config), &cfg))
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, []string{"/usr/bin/harvester-ipam-install"}, cfg.Config.Entrypoint)
	head, err := exec.Command("git", "-C", rig.Root, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	assert.Equal(t, strings.TrimSpace(string(head)), cfg.Config.Labels["org.opencontainers.image.revision"])
	assert.Equal(t, "https://github.com/harvester/harvester-ipam", cfg.Config.Labels["org.opencontainers.image.source"])
	ct, err := exec.Command("git", "-C", rig.Root, "log", "-1", "--format=%ct").Output()
	require.NoError(t, err)
	sec, err := strconv.ParseInt(strings.TrimSpace(string(ct)), 10, 64)
	require.NoError(t, err)
	assert.Equal(t, time.Unix(sec, 0).UTC().Format(time.RFC3339), cfg.Created, "created at the commit's time")

	require.Len(t, man.Layers, 1)
	zr, err := gzip.NewReader(bytes.NewReader(blob(man.Layers[0])))
	require.NoError(t, err)
	layer, err := io.ReadAll(zr)
	require.NoError(t, err)
	s := sha256.Sum256(layer)
	assert.Equal(t, []string{"sha256:" + hex.EncodeToString(s[:])}, cfg.RootFS.DiffIDs, "diff_id is the uncompressed layer's digest")

	var dm []image.DockerManifest
	require.NoError(t, json.Unmarshal(files["manifest.json"], &dm))
	require.Len(t, dm, 1)
	assert.Equal(t, []string{chartImage}, dm[0].RepoTags)
	assert.Equal(t, "blobs/sha256/"+strings.TrimPrefix(man.Config.Digest, "sha256:"), dm[0].Config)
	assert.Equal(t, []string{"blobs/sha256/" + strings.TrimPrefix(man.Layers[0].Digest, "sha256:")}, dm[0].Layers)
	assert.Contains(t, string(files["repositories"]), `"rancher/harvester-ipam":{"`+tag+`":`)

	// The layer, extracted as a runtime would, and each binary run from it.
	root := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(layer))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		assert.Equal(t, 0, h.Uid)
		assert.Equal(t, 0, h.Gid)
		p := filepath.Join(root, h.Name)
		if h.Typeflag == tar.TypeDir {
			require.NoError(t, os.MkdirAll(p, os.FileMode(h.Mode)))
			continue
		}
		assert.Equal(t, int64(0o755), h.Mode, h.Name)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, b, os.FileMode(h.Mode)))
	}
	assert.Equal(t, []string{"usr/", "usr/bin/", "usr/bin/harvester-ipam", "usr/bin/harvester-ipam-agent", "usr/bin/harvester-ipam-install", "usr/bin/harvester-ipam-reconciler"}, names)
	bin := filepath.Join(root, "usr", "bin")
	for _, c := range []string{"harvester-ipam", "harvester-ipam-agent", "harvester-ipam-install", "harvester-ipam-reconciler"} {
		// Static: no program interpreter (the plugin runs on the host, outside the image).
		f, err := elf.Open(filepath.Join(bin, c))
		require.NoError(t, err)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s is statically linked", c)
		}
		assert.Nil(t, f.Section(".symtab"), "%s is stripped (-s)", c)
		f.Close()
	}
	cmd := exec.Command(filepath.Join(bin, "harvester-ipam"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	out, err := cmd.Output()
	require.NoError(t, err)
	// Every version whereabouts answers (its skel's version.All).
	assert.Contains(t, string(out), `"supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]`)
	for c, usage := range map[string]string{
		"harvester-ipam":            "harvester-ipam " + tag + ": a CNI IPAM plugin",
		"harvester-ipam-install":    "-cni-bin-dir string",
		"harvester-ipam-reconciler": "harvester-ipam-reconciler inspect [--need N]",
		"harvester-ipam-agent":      "usage: harvester-ipam-agent [flags]",
	} {
		out, err := exec.Command(filepath.Join(bin, c), "--version").Output()
		require.NoError(t, err, "%s --version", c)
		assert.Equal(t, c+" "+tag+"\n", string(out), "%s --version prints the tag", c)
		out, err = exec.Command(filepath.Join(bin, c), "-h").CombinedOutput()
		assert.Contains(t, string(out), usage, "%s -h: %v", c, err)
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			c, err := io.ReadAll(tr)
			require.NoError(t, err)
			out[h.Name] = c
		}
	}
}
