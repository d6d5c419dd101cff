// Package install puts the harvester-ipam binary into a node's CNI bin dir so
// that the runtime only ever sees a complete binary that runs: the new one, or
// the old one left as it was.
package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/install/standin"
)

// tempPrefix names the installer's temporary files. They live in the bin dir
// itself, because only a rename within one filesystem is atomic.
const tempPrefix = ".harvester-ipam.install-"

// Options say what to install where.
type Options struct {
	// Source is the binary to install (the image's /usr/bin/harvester-ipam).
	Source string
	// BinDir is the host's CNI bin dir as this process sees it (a hostPath mount).
	BinDir string
	// Name is the file name in BinDir; "harvester-ipam" when empty.
	Name string
	// Require are CNI versions the binary must support; "0.3.1" (the storage
	// network NAD's cniVersion) when nil.
	Require []string
	// Timeout bounds each run of the binary; 10 s when zero.
	Timeout time.Duration
}

// Result is what Install did.
type Result struct {
	Path    string
	Changed bool   // false when the binary there was this one already
	About   string // the binary's own first line about itself ("harvester-ipam v1.2.3: ...")
	// Supported are the CNI versions the installed binary reports.
	Supported []string
}

func (o *Options) defaults() error {
	if o.Name == "" {
		o.Name = "harvester-ipam"
	}
	if o.Require == nil {
		o.Require = []string{"0.3.1"}
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Name != filepath.Base(o.Name) || o.Name == "." || o.Name == ".." || strings.HasPrefix(o.Name, tempPrefix) {
		return fmt.Errorf("install name %q: want a plain file name", o.Name)
	}
	if !filepath.IsAbs(o.BinDir) {
		return fmt.Errorf("CNI bin dir %q: want an absolute path", o.BinDir)
	}
	// A missing bin dir means a wrong hostPath, not a dir to create: a binary
	// written anywhere else is never found by the runtime.
	st, err := os.Stat(o.BinDir)
	if err != nil {
		return fmt.Errorf("CNI bin dir: %w (is the host path right?)", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("CNI bin dir %s is not a directory", o.BinDir)
	}
	return nil
}

// Install copies Source to BinDir/Name atomically: a temporary file in BinDir,
// fsynced, run with CNI_COMMAND=VERSION, then renamed over the old binary and
// the directory fsynced. When anything fails, the old binary stays as it was
// and the temporary file is removed. A binary already there with Source's
// content is verified and left alone, so Install is safe to run again, also
// concurrently: installers on one node take turns on a lock on BinDir.
func Install(ctx context.Context, opt Options) (res Result, err error) {
	if err := opt.defaults(); err != nil {
		return res, err
	}
	dst := filepath.Join(opt.BinDir, opt.Name)
	res.Path = dst
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return res, err
	}
	defer unlock()
	// Only a killed installer leaves these, and the lock says none is running.
	if err := removeTemps(opt.BinDir); err != nil {
		return res, err
	}

	srcSum, err := fileSum(opt.Source)
	if err != nil {
		return res, fmt.Errorf("source binary: %w", err)
	}
	if same, err := sameBinary(dst, srcSum); err != nil {
		return res, err
	} else if same {
		res.About, res.Supported, err = probe(ctx, dst, opt)
		if err != nil {
			return res, fmt.Errorf("installed %s has the source's content but does not run: %w", dst, err)
		}
		return res, nil
	}

	tmp, err := copyTemp(opt.Source, opt.BinDir, srcSum)
	if err != nil {
		return res, fmt.Errorf("copy %s into %s: %w; %s left as it was", opt.Source, opt.BinDir, err, dst)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if res.About, res.Supported, err = probe(ctx, tmp, opt); err != nil {
		return res, fmt.Errorf("the new binary does not run: %w; %s left as it was", err, dst)
	}
	if err = os.Rename(tmp, dst); err != nil {
		return res, fmt.Errorf("replace %s: %w; left as it was", dst, err)
	}
	res.Changed = true
	// The rename is durable only once the directory is on disk.
	if err := syncDir(opt.BinDir); err != nil {
		return res, fmt.Errorf("installed %s, but fsync of %s failed: %w", dst, opt.BinDir, err)
	}
	return res, nil
}

// Verify reports whether BinDir/Name is Source's content and runs: what a
// readiness probe asks. It writes nothing.
func Verify(ctx context.Context, opt Options) (Result, error) {
	res := Result{}
	if err := opt.defaults(); err != nil {
		return res, err
	}
	res.Path = filepath.Join(opt.BinDir, opt.Name)
	sum, err := fileSum(opt.Source)
	if err != nil {
		return res, fmt.Errorf("source binary: %w", err)
	}
	same, err := sameBinary(res.Path, sum)
	if err != nil {
		return res, err
	}
	if !same {
		return res, fmt.Errorf("%s is not the image's %s (missing, or another version)", res.Path, opt.Source)
	}
	res.About, res.Supported, err = probe(ctx, res.Path, opt)
	if err != nil {
		return res, fmt.Errorf("installed %s does not run: %w", res.Path, err)
	}
	return res, nil
}

// Preflight lists what harvester-ipam needs beside itself on the node and
// does not find: whereabouts, the delegate, in BinDir, and its flat file.
// They are warnings: whereabouts' own DaemonSet may simply not have run yet.
func Preflight(binDir, delegate, flatFile string) []string {
	var warn []string
	if delegate != "" {
		if st, err := os.Stat(filepath.Join(binDir, delegate)); err != nil || st.Mode()&0o111 == 0 {
			warn = append(warn, fmt.Sprintf("no executable %s in %s: harvester-ipam delegates every ADD to it; is whereabouts installed?", delegate, binDir))
		}
	}
	if flatFile != "" {
		if _, err := os.Stat(flatFile); err != nil {
			warn = append(warn, fmt.Sprintf("no whereabouts flat file %s: harvester-ipam reads its kubeconfig from it; is whereabouts installed?", flatFile))
		}
	}
	return warn
}

type sum [sha256.Size]byte

func fileSum(path string) (sum, error) {
	var s sum
	f, err := os.Open(path)
	if err != nil {
		return s, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return s, err
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return s, fmt.Errorf("%s is not a non-empty regular file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return s, fmt.Errorf("read %s: %w", path, err)
	}
	copy(s[:], h.Sum(nil))
	return s, nil
}

// sameBinary: dst exists, is executable and has the content want.
func sameBinary(dst string, want sum) (bool, error) {
	st, err := os.Stat(dst)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("installed binary: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return false, nil
	}
	have, err := fileSum(dst)
	if err != nil {
		return false, fmt.Errorf("installed binary: %w", err)
	}
	return have == want, nil
}

// copyTemp writes src to a new temporary file in dir, executable and
// fsynced, and checks that what landed on disk is what was read.
func copyTemp(src, dir string, want sum) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return "", err
	}
	// Not a named result: a return statement would blank it before the
	// deferred cleanup reads it.
	tmp := out.Name()
	ok := false
	defer func() {
		if !ok {
			out.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		return "", err
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
		return "", fmt.Errorf("%s changed while it was copied", src)
	}
	if err := out.Chmod(0o755); err != nil {
		return "", err
	}
	if err := out.Sync(); err != nil {
		return "", fmt.Errorf("fsync: %w", err)
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	ok = true
	return tmp, nil
}

// probe runs the binary as the runtime would ask for its versions, and once
// more without a command for the line it prints about itself.
func probe(ctx context.Context, path string, opt Options) (about string, supported []string, err error) {
	supported, err = versions(ctx, path, opt)
	if err != nil {
		return "", nil, err
	}
	// skel prints the about line to stderr when CNI_COMMAND is unset.
	if o, err := run(ctx, path, opt.Timeout); err == nil {
		about, _, _ = strings.Cut(strings.TrimSpace(string(o.stderr)), "\n")
	}
	return about, supported, nil
}

// versions runs the binary as the runtime asks for its versions, and checks
// it supports opt.Require.
func versions(ctx context.Context, path string, opt Options) ([]string, error) {
	out, err := run(ctx, path, opt.Timeout, "CNI_COMMAND=VERSION")
	if err != nil {
		return nil, fmt.Errorf("CNI_COMMAND=VERSION: %w", err)
	}
	var v struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out.stdout, &v); err != nil || len(v.SupportedVersions) == 0 {
		return nil, fmt.Errorf("CNI_COMMAND=VERSION printed no CNI version info: %q: %w", trim(out.stdout), standin.ErrBroken)
	}
	for _, r := range opt.Require {
		if !slices.Contains(v.SupportedVersions, r) {
			return nil, fmt.Errorf("supports CNI versions %v, not %s", v.SupportedVersions, r)
		}
	}
	return v.SupportedVersions, nil
}

type output struct{ stdout, stderr []byte }

func run(ctx context.Context, path string, timeout time.Duration, env ...string) (output, error) {
	var out output
	var err error
	var timedOut bool
	// A file just closed can still be open for writing in a child forked
	// meanwhile (ETXTBSY): that passes in moments.
	for attempt := 0; attempt < 20; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		cmd := exec.CommandContext(cctx, path)
		cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		timedOut = cctx.Err() != nil
		cancel()
		out = output{stdout.Bytes(), stderr.Bytes()}
		if !errors.Is(err, syscall.ETXTBSY) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	switch {
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		return out, ctx.Err()
	case timedOut:
		return out, fmt.Errorf("no answer within %s: %w", timeout, context.DeadlineExceeded)
	}
	return out, fmt.Errorf("%w: %s%s", standin.RunError(err), trim(out.stdout), trim(out.stderr))
}

func trim(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return s
}

// lockDir takes an exclusive flock on dir, waiting for another installer on
// the same node (a DaemonSet rollout with surge, a hand run) to finish.
func lockDir(ctx context.Context, dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s to lock it: %w", dir, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another installer's lock on %s: %w", dir, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func removeTemps(dir string) error {
	leftovers, err := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	if err != nil {
		return err
	}
	for _, p := range leftovers {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove a killed installer's leftover: %w", err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Describe says what the binary at path is, for a person: the line it prints
// about itself, the CNI versions it answers, and the start of its sha256.
func Describe(ctx context.Context, path string, opt Options) (string, error) {
	about, supported, err := probe(ctx, path, Options{Timeout: opt.Timeout})
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if about == "" {
		about = "(prints nothing about itself)"
	}
	return fmt.Sprintf("%s: %s; CNI %s; sha256 %x", path, about, strings.Join(supported, ", "), h.Sum(nil)[:6]), nil
}
