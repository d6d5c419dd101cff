package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// addingSuffix names the file an ADD in flight holds locked.
const addingSuffix = ".adding"

// Adding marks the ADD of rec's attachment as in flight until done is called
// or its process dies: "<id>:<ifname>.adding", holding rec, under an
// exclusive flock that the kernel drops with the process, so that a crash
// never leaves an ADD that seems in flight. Taken before the attachment's
// record is written (a node agent's allocator writes that only once it has
// chosen an address), it tells a DEL of an earlier sandbox of the pod, on
// this node, which ADD will take that sandbox's entry over (or release it)
// and has not yet done so (InFlight). The mark appears under its name
// whole and locked: it is written and locked under a name of its own, then
// linked into place. done is idempotent.
func (d Dir) Adding(rec Record) (done func(), err error) {
	p, err := d.path(rec.ContainerID, rec.IfName)
	if err != nil {
		return nil, err
	}
	if err := rec.validate(); err != nil {
		return nil, err
	}
	rec.Version = Version
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("mark ADD of %s/%s in flight: %w", rec.ContainerID, rec.IfName, err)
	}
	p = strings.TrimSuffix(p, ".json") + addingSuffix
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return nil, fmt.Errorf("create checkpoint dir %s: %w", d, err)
	}
	f, err := os.CreateTemp(string(d), ".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("mark ADD of %s/%s in flight: %w", rec.ContainerID, rec.IfName, err)
	}
	defer os.Remove(f.Name()) // the name it was written under; p stays
	fail := func(err error) (func(), error) {
		f.Close()
		return nil, fmt.Errorf("mark ADD of %s/%s in flight: %w", rec.ContainerID, rec.IfName, err)
	}
	// A file of its own, that no one else opens: the lock is taken at once.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fail(fmt.Errorf("lock %s: %w", f.Name(), err))
	}
	if _, err := f.Write(data); err != nil {
		return fail(err) // not synced: the mark dies with the process anyway
	}
	for {
		err := os.Link(f.Name(), p)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return fail(err)
		}
		// The runtime runs one verb of an attachment at a time; a mark
		// still held is an earlier ADD of it that its client gave up on
		// (the node agent's, the plugin falling back) and that still runs.
		// This ADD goes on unmarked rather than wait on it: a DEL then does
		// what it did before marks were kept. One not held is a dead ADD's.
		if held(p) {
			f.Close()
			return func() {}, nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(err)
		}
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

// InFlight returns the ADDs whose mark (Adding) is held at this instant, as
// their marks tell them: the ADD may finish the next instant, never the
// other way round. A mark without its ADD in it (an earlier release marked
// with an empty file) is told by the attachment's record, and is not
// returned until that is written; marks and records that do not read are
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
		id, ifName, ok := strings.Cut(name, ":")
		if !ok {
			continue
		}
		r, ok, err := d.inFlight(filepath.Join(string(d), e.Name()), id, ifName)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			recs = append(recs, r)
		}
	}
	return recs, errs
}

// inFlight reads the mark at path, of attachment id/ifName, when it is held.
func (d Dir) inFlight(path, id, ifName string) (Record, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, false, nil // done meanwhile
	}
	defer f.Close()
	// Read through the descriptor the lock is probed on: the mark read is
	// the one held, not one linked in its place since.
	data, err := io.ReadAll(io.LimitReader(f, maxMark))
	if err != nil {
		return Record{}, false, fmt.Errorf("read mark %s: %w", path, err)
	}
	if !lockedBySomeone(f) {
		return Record{}, false, nil
	}
	if len(data) == 0 {
		return d.Read(id, ifName)
	}
	r, err := Decode(data)
	if err != nil {
		return Record{}, false, fmt.Errorf("mark %s: %w", path, err)
	}
	if r.ContainerID != id || r.IfName != ifName {
		return Record{}, false, fmt.Errorf("mark %s records %s/%s, not %s/%s", path, r.ContainerID, r.IfName, id, ifName)
	}
	return r, true, nil
}

// maxMark bounds what a mark is read for: a record is a few hundred bytes.
const maxMark = 1 << 20

// held says whether a process holds the flock of path. A file gone, or one
// that does not open, is not held.
func held(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return lockedBySomeone(f)
}

// lockedBySomeone says whether another open file holds f's flock.
func lockedBySomeone(f *os.File) bool {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true
	}
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	}
	return false
}
