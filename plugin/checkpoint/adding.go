package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// addingSuffix names the file an ADD in flight holds locked.
const addingSuffix = ".adding"

// Adding marks an ADD of the attachment as in flight until done is called
// or its process dies: an exclusive flock on "<id>:<ifname>.adding", which
// the kernel drops with the process, so that a crash never leaves an ADD
// that seems in flight. Taken before the attachment's record is written, it
// tells a DEL of an earlier sandbox of the pod, on this node, that the ADD
// which will take that sandbox's entry over (or release it) has not yet done
// so (InFlight). done is idempotent.
func (d Dir) Adding(containerID, ifName string) (done func(), err error) {
	p, err := d.path(containerID, ifName)
	if err != nil {
		return nil, err
	}
	p = strings.TrimSuffix(p, ".json") + addingSuffix
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return nil, fmt.Errorf("create checkpoint dir %s: %w", d, err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("mark ADD of %s/%s in flight: %w", containerID, ifName, err)
	}
	// The runtime runs one verb of an attachment at a time; a mark still
	// held is an earlier ADD of it that its client gave up on (the node
	// agent's, the plugin falling back) and that still runs. This ADD goes
	// on unmarked rather than wait on it: a DEL then does what it did
	// before marks were kept.
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return func() {}, nil
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mark ADD of %s/%s in flight: lock %s: %w", containerID, ifName, p, err)
	}
	closed := false
	return func() {
		if closed {
			return
		}
		closed = true
		// Removed while held: an InFlight that opened it before finds it
		// unlocked once closed, and the ADD is done by then.
		_ = os.Remove(p)
		f.Close()
	}, nil
}

// InFlight returns the records of the attachments whose ADD holds its mark
// (Adding) at this instant, read as they are: the ADD may finish the next
// instant, never the other way round. A mark without a record yet (the ADD
// has not written it) is not returned; records that do not read are
// returned as errors beside them.
func (d Dir) InFlight() ([]Record, []error) {
	entries, err := d.files()
	if err != nil {
		return nil, []error{err}
	}
	var recs []Record
	var errs []error
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), addingSuffix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if !held(filepath.Join(string(d), e.Name())) {
			continue
		}
		id, ifName, ok := strings.Cut(name, ":")
		if !ok {
			continue
		}
		r, ok, err := d.Read(id, ifName)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			recs = append(recs, r)
		}
	}
	return recs, errs
}

// held says whether a process holds the flock of path. A file gone, or one
// that does not open, is not held.
func held(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true
	}
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	}
	return false
}
