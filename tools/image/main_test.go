package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harvester/harvester-ipam/install/image"
)

// A build is tagged with the chart's appVersion, so that the chart's default
// image is the build; a commit tagged for a release must carry that version.
func TestReleaseVersion(t *testing.T) {
	chart := []byte("apiVersion: v2\nname: harvester-ipam\nversion: 0.2.0\nappVersion: v0.2.0\n")
	for _, tc := range []struct {
		name  string
		chart []byte
		tags  []string
		want  string
		err   string
	}{
		{"no tag: the appVersion", chart, nil, "v0.2.0", ""},
		{"the release's tag", chart, []string{"v0.2.0"}, "v0.2.0", ""},
		{"a quoted appVersion", []byte("appVersion: \"v0.2.0\"\n"), nil, "v0.2.0", ""},
		{"tags that are not releases", chart, []string{"demo", "before-refactor"}, "v0.2.0", ""},
		{"a release tag that is not the chart's", chart, []string{"v0.3.0"}, "", "tagged v0.3.0 but install/chart/harvester-ipam/Chart.yaml says appVersion v0.2.0"},
		{"two release tags, one of them the chart's", chart, []string{"v0.1.9", "v0.2.0"}, "v0.2.0", ""},
		{"no appVersion", []byte("version: 0.2.0\n"), nil, "", "has no appVersion"},
	} {
		got, err := releaseVersion(tc.chart, tc.tags)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %q, %v; want an error saying %q", tc.name, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// The repository's chart: its appVersion is the image's default tag and its
// version the same release without the v, so that a release is one number.
func TestTheChartsVersions(t *testing.T) {
	// go test runs in the package's directory.
	b, err := os.ReadFile(filepath.Join("..", "..", chartFile))
	if err != nil {
		t.Fatal(err)
	}
	app, err := releaseVersion(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nversion: "+strings.TrimPrefix(app, "v")+"\n") {
		t.Errorf("the chart's version is not its appVersion %s without the v:\n%s", app, b)
	}
}

// `make image` builds for linux/amd64 (Harvester's nodes) whatever the
// machine it runs on; ARCH chooses another.
func TestMakeImageArchitecture(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-arch amd64"},
		{[]string{"ARCH=arm64"}, "-arch arm64"},
		{[]string{"ARCH=amd64"}, "-arch amd64"},
	} {
		cmd := exec.Command("make", append([]string{"-n", "image"}, tc.args...)...)
		cmd.Dir = root
		// The machine's own architecture must not leak in.
		cmd.Env = append(os.Environ(), "GOARCH=arm64", "GOHOSTARCH=arm64", "ARCH=x86_64")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n image %v: %v\n%s", tc.args, err, out)
		}
		if !strings.Contains(string(out), tc.want+" ") {
			t.Errorf("make -n image %v: want %q in\n%s", tc.args, tc.want, out)
		}
	}
	if defaultArch != "amd64" {
		t.Errorf("harvester-ipam-image's default architecture %s, want amd64", defaultArch)
	}
	for arch, want := range map[string]string{"amd64": "", "arm64": "", "x86_64": "amd64 or arm64", "amd64,arm64": "crane index append"} {
		if err := checkArch(arch); want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("-arch %s: %v, want %q", arch, err, want)
		}
	}
}

// The archive is of the architecture asked for: its index entry, its
// config and Docker's side say so, and every binary in it is an ELF for
// that machine. (The builder's own command stands for the image's four:
// the same build, a fraction of the time.)
func TestTheArchiveIsOfTheArchitectureAsked(t *testing.T) {
	saved, savedDir := Commands, CommandDir
	Commands, CommandDir = []string{"image"}, "./tools"
	defer func() { Commands, CommandDir = saved, savedDir }()
	t.Chdir(filepath.Join("..", ".."))
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		t.Run(arch, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "image.tar")
			if err := run(out, "v0.0.0-test", "rancher/harvester-ipam", "https://example.com", "abc", "", arch, 0); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			files := map[string][]byte{}
			tr := tar.NewReader(f)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = b
			}
			blob := func(digest string) []byte {
				b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
				if !ok {
					t.Fatalf("no blob %s", digest)
				}
				return b
			}
			var idx image.Index
			if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
				t.Fatalf("index.json %s: %v", files["index.json"], err)
			}
			if p := idx.Manifests[0].Platform; p == nil || p.OS != "linux" || p.Architecture != arch {
				t.Errorf("index entry's platform %+v, want linux/%s", p, arch)
			}
			var man image.Manifest
			if err := json.Unmarshal(blob(idx.Manifests[0].Digest), &man); err != nil {
				t.Fatal(err)
			}
			var cfg image.Config
			if err := json.Unmarshal(blob(man.Config.Digest), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != arch {
				t.Errorf("config's platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, arch)
			}
			// install/Dockerfile is the alternative build for a machine with a
			// container engine: a container of either runs as the same user
			// with the same command. (The chart sets each container's user,
			// but the give-back's `kubectl debug node` pod runs as the image's.)
			user, entrypoint := dockerfileFinalStage(t, filepath.Join("install", "Dockerfile"))
			if rootUser(user) != rootUser(cfg.Config.User) {
				t.Errorf("install/Dockerfile runs as user %q, the archive as %q", user, cfg.Config.User)
			}
			if got := strings.Join(cfg.Config.Entrypoint, " "); entrypoint != got {
				t.Errorf("install/Dockerfile's ENTRYPOINT %q, the archive's %q", entrypoint, got)
			}
			var dm []image.DockerManifest
			if err := json.Unmarshal(files["manifest.json"], &dm); err != nil || len(dm) != 1 || dm[0].Config != "blobs/sha256/"+strings.TrimPrefix(man.Config.Digest, "sha256:") {
				t.Errorf("manifest.json %s (%v): not the config of the index's manifest", files["manifest.json"], err)
			}
			zr, err := gzip.NewReader(bytes.NewReader(blob(man.Layers[0].Digest)))
			if err != nil {
				t.Fatal(err)
			}
			lr := tar.NewReader(zr)
			n := 0
			for {
				h, err := lr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if h.Typeflag != tar.TypeReg {
					continue
				}
				b, err := io.ReadAll(lr)
				if err != nil {
					t.Fatal(err)
				}
				ef, err := elf.NewFile(bytes.NewReader(b))
				if err != nil {
					t.Errorf("%s: not an ELF: %v", h.Name, err)
					continue
				}
				if ef.Machine != machine || ef.OSABI != elf.ELFOSABI_NONE && ef.OSABI != elf.ELFOSABI_LINUX {
					t.Errorf("%s: ELF for %v (%v), want %v", h.Name, ef.Machine, ef.OSABI, machine)
				}
				n++
			}
			if n != len(Commands) {
				t.Errorf("%d binaries in the layer, want %d", n, len(Commands))
			}
		})
	}
}

// dockerfileFinalStage is the USER and ENTRYPOINT (an exec form's words, by
// spaces) of a Dockerfile's last stage.
func dockerfileFinalStage(t *testing.T, path string) (user, entrypoint string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			user, entrypoint = "", ""
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			var words []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(line[len(f[0]):])), &words); err != nil {
				t.Fatalf("%s: ENTRYPOINT not in exec form: %s", path, line)
			}
			entrypoint = strings.Join(words, " ")
		}
	}
	return user, entrypoint
}

// rootUser is user with root's spellings made one.
func rootUser(user string) string {
	switch user {
	case "", "0", "root", "0:0", "root:root":
		return "root"
	}
	return user
}
