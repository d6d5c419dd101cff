package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Identity is the chart release an installer runs for: its DaemonSet, and
// the pod it runs in. An installer run by hand has no DaemonSet.
type Identity struct {
	Namespace, DaemonSet string
	// Pod names this run: the pod's name (the chart's POD_NAME), or the
	// process by hand.
	Pod string
}

// ByHand is the release of an installer run without a DaemonSet.
const ByHand = "by hand"

// Release names the release: "namespace/daemonset", or ByHand.
func (id Identity) Release() string {
	if id.DaemonSet == "" {
		return ByHand
	}
	return id.Namespace + "/" + id.DaemonSet
}

// Record is what the bin dir keeps of a stand-in: which release took the
// name, and which of its pods holds it now. It is written under the
// installers' lock when an installer stands in (or is about to), and removed
// when its release gives the name back. It lets a pod of a later revision
// give back what an earlier one took (the stand-in turned off, its name
// changed), and two releases on one node agree which one stands in.
type Record struct {
	// Name is the plugin stood in for.
	Name string `json:"name"`
	// Release is Identity.Release of the installer that took it; Pod the
	// pod of that release that holds it now (the last one to start).
	Release string `json:"release"`
	Pod     string `json:"pod"`
	// HostDir is the bin dir's path on the host, for the reader.
	HostDir string `json:"hostDir,omitempty"`
}

// recordPrefix names the records in the bin dir: one a stand-in name.
const recordPrefix = ".harvester-ipam.owner."

// alivePrefix names the files a release's running installers hold a shared
// lock on, one a release.
const alivePrefix = ".harvester-ipam.alive."

func recordPath(binDir, name string) string { return filepath.Join(binDir, recordPrefix+name) }

// ReadRecord reads the record of the stand-in name in binDir; ok is false
// when there is none, or one that cannot be read as a record (it is
// written whole and renamed into place, so only a hand can make one).
func ReadRecord(binDir, name string) (rec Record, ok bool, err error) {
	b, err := os.ReadFile(recordPath(binDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read the stand-in's record: %w", err)
	}
	if json.Unmarshal(b, &rec) != nil || rec.Name != name || rec.Release == "" {
		return Record{}, false, nil
	}
	return rec, true, nil
}

// Records are the stand-in records in binDir.
func Records(binDir string) ([]Record, error) {
	paths, err := filepath.Glob(filepath.Join(binDir, recordPrefix+"*"))
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, p := range paths {
		name := strings.TrimPrefix(filepath.Base(p), recordPrefix)
		if strings.HasPrefix(name, tempPrefix) || strings.Contains(name, ".tmp-") {
			continue
		}
		rec, ok, err := ReadRecord(binDir, name)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out, nil
}

// writeRecord writes rec whole: a temporary file, fsynced, renamed over the
// record and the dir fsynced.
func writeRecord(binDir string, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := recordPath(binDir, rec.Name)
	tmp, err := os.CreateTemp(binDir, recordPrefix+rec.Name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write the stand-in's record: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write the stand-in's record %s: %w", path, err)
	}
	return syncDir(binDir)
}

// removeRecord removes the record of name, and any temporary file of it a
// kill left.
func removeRecord(binDir, name string) error {
	leftovers, _ := filepath.Glob(filepath.Join(binDir, recordPrefix+name+".tmp-*"))
	for _, p := range append(leftovers, recordPath(binDir, name)) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the stand-in's record: %w", err)
		}
	}
	return syncDir(binDir)
}

func alivePath(binDir, release string) string {
	key := strings.NewReplacer("/", ".", " ", "-").Replace(release)
	return filepath.Join(binDir, alivePrefix+key)
}

// HoldAlive takes, for as long as the installer runs (until the returned
// func is called, or the process ends), a shared lock that tells the other
// installers on the node that a pod of release runs here. The kernel lets
// go of it when the process ends, however it ends.
//
// The descriptor is a raw one, not an *os.File: nothing closes it until
// unlock does (an *os.File dropped by the caller is closed by the garbage
// collector, and the lock with it), and the binaries the installer runs do
// not inherit it (O_CLOEXEC).
func HoldAlive(binDir, release string) (unlock func(), err error) {
	path := alivePath(binDir, release)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("say that %s runs here: open %s: %w", release, path, err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_SH); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("say that %s runs here: lock %s: %w", release, path, err)
	}
	var once sync.Once
	return func() { once.Do(func() { syscall.Close(fd) }) }, nil
}

// IsAlive says whether an installer of release runs on the node: whether
// any process holds its lock.
func IsAlive(binDir, release string) (bool, error) {
	f, err := os.Open(alivePath(binDir, release))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return false, nil // closing lets go of it
}

// removeAlive removes the lock file of release, held or not: its release
// leaves the node.
func removeAlive(binDir, release string) error {
	if err := os.Remove(alivePath(binDir, release)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeDeadAlive removes the lock files no process holds (a give-back by
// hand, when the pods are gone).
func removeDeadAlive(binDir string) {
	paths, _ := filepath.Glob(filepath.Join(binDir, alivePrefix+"*"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.Remove(p)
		}
		f.Close()
	}
}

// handPod names an installer run by hand: its process.
func handPod() string {
	host, _ := os.Hostname()
	return "pid " + strconv.Itoa(os.Getpid()) + " on " + host
}

// heldByAnother is the record of the stand-in at name when another release
// holds it and an installer of that release runs on the node.
// A run by hand (an operator's --verify) has no release: it checks its own
// image's build.
func heldByAnother(binDir, name string, me Identity) (Record, bool) {
	if name == "" || me.Release() == ByHand {
		return Record{}, false
	}
	rec, ok, err := ReadRecord(binDir, name)
	if err != nil || !ok || rec.Release == me.Release() {
		return Record{}, false
	}
	alive, err := IsAlive(binDir, rec.Release)
	return rec, err == nil && alive
}

// InstallAs is Install for an installer of a release that stands in at name
// (or would): while another release stands in there and runs on the node,
// harvester-ipam under its own name is that release's build, and this one
// leaves it as it is (two builds must not rewrite it in turn), saying why.
func InstallAs(ctx context.Context, opt Options, name string, me Identity) (Result, string, error) {
	if rec, ok := heldByAnother(opt.BinDir, name, me); ok {
		if err := opt.defaults(); err != nil {
			return Result{}, "", err
		}
		return Result{Path: filepath.Join(opt.BinDir, opt.Name)}, fmt.Sprintf("release %s (pod %s) stands in for %s here: %s is its build, and this release (%s) leaves it",
			rec.Release, rec.Pod, name, filepath.Join(opt.BinDir, opt.Name), me.Release()), nil
	}
	res, err := Install(ctx, opt)
	return res, "", err
}

// VerifyAs is Verify for an installer of a release that stands in at name:
// while another release stands in there and runs on the node, the build
// under harvester-ipam's own name is that release's, and it need only run.
func VerifyAs(ctx context.Context, opt Options, name string, me Identity) (Result, error) {
	rec, ok := heldByAnother(opt.BinDir, name, me)
	if !ok {
		return Verify(ctx, opt)
	}
	if err := opt.defaults(); err != nil {
		return Result{}, err
	}
	res := Result{Path: filepath.Join(opt.BinDir, opt.Name)}
	about, supported, err := probe(ctx, res.Path, opt)
	if err != nil {
		return res, fmt.Errorf("installed %s does not run: %w", res.Path, err)
	}
	res.About, res.Supported = fmt.Sprintf("%s (release %s's build)", about, rec.Release), supported
	return res, nil
}
