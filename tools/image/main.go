// Command harvester-ipam-image builds the chart's image without a container
// engine: it builds harvester-ipam, harvester-ipam-agent,
// harvester-ipam-install and harvester-ipam-reconciler as static binaries
// and packs them into
// /usr/bin of a one-layer image archive (install/image) that `docker load`
// and `ctr images import` accept. Run from the repository (make image):
//
//	harvester-ipam-image -version v0.1.0 -o bin/harvester-ipam-image.tar
//
// The archive is reproducible for a commit: its timestamps are the commit's
// time (or SOURCE_DATE_EPOCH), and the builds are -trimpath without VCS stamps.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/harvester/harvester-ipam/install/image"
)

// defaultArch is the image's architecture unless -arch says otherwise:
// Harvester's nodes', whatever the machine that builds it.
const defaultArch = "amd64"

// checkArch refuses an architecture the image is not built for, and a list:
// one archive is one architecture (docker load and crane push read one).
func checkArch(arch string) error {
	switch arch {
	case "amd64", "arm64":
		return nil
	}
	if strings.Contains(arch, ",") {
		return fmt.Errorf("-arch %s: one architecture an archive; for both in a registry, build and push each under its own tag, then join them: crane index append -m <registry>/harvester-ipam:<tag>-amd64 -m <registry>/harvester-ipam:<tag>-arm64 -t <registry>/harvester-ipam:<tag>", arch)
	}
	return fmt.Errorf("-arch %s: amd64 or arm64", arch)
}

// Commands are the image's binaries, each built from CommandDir/<name>.
var Commands = []string{"harvester-ipam", "harvester-ipam-agent", "harvester-ipam-install", "harvester-ipam-reconciler"}

// CommandDir holds the image's commands, relative to the module's root.
var CommandDir = "./cmd"

func main() {
	var (
		out, version, repo, source, revision, binDir, arch string
		created                                            int64
	)
	fs := flag.NewFlagSet("harvester-ipam-image", flag.ContinueOnError)
	fs.StringVar(&out, "o", "", "the archive to write (required)")
	fs.StringVar(&version, "version", "", "the binaries' main.Version and the image's tag; empty: the chart's appVersion ("+chartFile+")")
	fs.StringVar(&repo, "repository", "rancher/harvester-ipam", "the image's repository")
	fs.StringVar(&source, "source", "https://github.com/harvester/harvester-ipam", "the org.opencontainers.image.source label")
	fs.StringVar(&revision, "revision", "", "the org.opencontainers.image.revision label; empty: the commit (git rev-parse HEAD)")
	fs.Int64Var(&created, "created", -1, "the image's time, Unix seconds; -1: SOURCE_DATE_EPOCH, else the commit's time")
	fs.StringVar(&binDir, "bin", "", "take the binaries from this directory instead of building them")
	fs.StringVar(&arch, "arch", defaultArch, "the image's architecture, GOARCH of its binaries: amd64 or arm64 (never the build machine's unless asked)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: harvester-ipam-image -o ARCHIVE [-version VERSION] [flags]\n\n"+
			"Builds rancher/harvester-ipam:<VERSION> (by default the chart's appVersion, which a release's git\n"+
			"tag must equal) as an OCI image archive. Exit status: 0 written; 1 failed; 2 bad flags.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if out == "" || fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	if err := checkArch(arch); err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-image:", err)
		os.Exit(2)
	}
	if version == "" {
		v, err := chartVersion(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, "harvester-ipam-image:", err)
			os.Exit(1)
		}
		version = v
	}
	if err := run(out, version, repo, source, revision, binDir, arch, created); err != nil {
		fmt.Fprintln(os.Stderr, "harvester-ipam-image:", err)
		os.Exit(1)
	}
}

func run(out, version, repo, source, revision, binDir, arch string, created int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if revision == "" {
		r, err := git(ctx, "rev-parse", "HEAD")
		if err != nil {
			return fmt.Errorf("the revision label: %w (or give -revision)", err)
		}
		revision = r
	}
	when, err := creationTime(ctx, created)
	if err != nil {
		return err
	}
	if binDir == "" {
		tmp, err := os.MkdirTemp("", "harvester-ipam-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := build(ctx, tmp, version, arch); err != nil {
			return err
		}
		binDir = tmp
	}
	spec := image.Spec{
		Repository: repo, Tag: version, Created: when, OS: "linux", Architecture: arch,
		// The DaemonSet's command; the chart names each container's command anyway.
		Entrypoint: []string{"/usr/bin/harvester-ipam-install"},
		Env:        []string{"PATH=/usr/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.source":   source,
			"org.opencontainers.image.revision": revision,
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.created":  when.UTC().Format(time.RFC3339),
			"org.opencontainers.image.title":    "harvester-ipam",
			"org.opencontainers.image.licenses": "Apache-2.0",
		},
	}
	for _, c := range Commands {
		b, err := os.ReadFile(filepath.Join(binDir, c))
		if err != nil {
			return fmt.Errorf("binary: %w", err)
		}
		spec.Files = append(spec.Files, image.File{Path: "/usr/bin/" + c, Mode: 0o755, Content: b})
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	// Write beside, then rename: a failed run leaves no half archive.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".harvester-ipam-image-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	res, err := image.Write(tmp, spec)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("%s: %s (%s/%s), manifest %s, %d bytes, sha256 %s\n", out, res.Ref, "linux", arch, res.Manifest.Digest, res.ArchiveSize, res.ArchiveSHA256)
	fmt.Printf("push it to a registry:  crane push %s <registry>/harvester-ipam:%s\n", out, version)
	fmt.Printf("or import it on each Harvester (RKE2) node:  /var/lib/rancher/rke2/bin/ctr --address /run/k3s/containerd/containerd.sock -n k8s.io images import %s\n", filepath.Base(out))
	return nil
}

// chartFile holds the chart's appVersion: the release's version, its image's
// tag and the chart's default image.tag.
const chartFile = "install/chart/harvester-ipam/Chart.yaml"

// chartVersion is the version a build is tagged with when none is given:
// the chart's appVersion, so that the chart's default image is this build.
// A commit tagged for a release must carry the tag that equals it.
func chartVersion(ctx context.Context) (string, error) {
	b, err := os.ReadFile(chartFile)
	if err != nil {
		return "", fmt.Errorf("the chart's appVersion: %w (run from the repository, or give -version)", err)
	}
	tags, _ := git(ctx, "tag", "--points-at", "HEAD")
	return releaseVersion(b, strings.Fields(tags))
}

// releaseVersion reads appVersion from a Chart.yaml and checks it against
// the release tags (v<digit>...) on the commit: one of them must equal it.
func releaseVersion(chartYAML []byte, tags []string) (string, error) {
	app := ""
	for _, line := range strings.Split(string(chartYAML), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			app = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	if app == "" {
		return "", fmt.Errorf("%s has no appVersion", chartFile)
	}
	var releases []string
	for _, t := range tags {
		if len(t) > 1 && t[0] == 'v' && t[1] >= '0' && t[1] <= '9' {
			releases = append(releases, t)
		}
	}
	if len(releases) > 0 && !slices.Contains(releases, app) {
		return "", fmt.Errorf("this commit is tagged %s but %s says appVersion %s: a release's tag must equal the chart's appVersion (bump the chart's version and appVersion, or give -version)",
			strings.Join(releases, ", "), chartFile, app)
	}
	return app, nil
}

// creationTime is -created, else SOURCE_DATE_EPOCH, else the commit's time:
// never the clock, which would make every build differ.
func creationTime(ctx context.Context, flagValue int64) (time.Time, error) {
	if flagValue >= 0 {
		return time.Unix(flagValue, 0).UTC(), nil
	}
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	s, err := git(ctx, "log", "-1", "--format=%ct")
	if err != nil {
		return time.Time{}, fmt.Errorf("the commit's time: %w (or give -created or SOURCE_DATE_EPOCH)", err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("the commit's time %q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

// build builds each command as the image wants it: static, trimmed, no VCS
// stamp (the revision is a label), stripped, with the version.
func build(ctx context.Context, dir, version, arch string) error {
	for _, c := range Commands {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
			"-ldflags", "-s -w -X main.Version="+version, "-o", filepath.Join(dir, c), CommandDir+"/"+c)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s/%s: %w\n%s", CommandDir, c, err, b)
		}
	}
	return nil
}

func git(ctx context.Context, args ...string) (string, error) {
	b, err := exec.CommandContext(ctx, "git", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(b)), nil
}
