// Package checkpoint keeps a node-local record of each attachment harvester-ipam
// served: which pools, in which store, under which container and interface.
// DEL reads it when the network config no longer names a range (the NAD was
// deleted), and GC reads all of them to find what the runtime no longer knows.
//
// One small file per (container ID, ifname), written atomically (temp file,
// fsync, rename, fsync of the directory), readable by root only.
//
// Compatibility: a record's fields are only ever added, never renamed nor
// given another meaning, so a binary reads the records of every release,
// older or newer (a downgrade): it takes the fields it knows and ignores the
// rest. Version says which release wrote a record; a change that older
// binaries could not read safely must use another file name.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Version is the format of the files this package writes.
const Version = 1

// Pool is one IPPool an attachment allocates from.
type Pool struct {
	Name  string `json:"name"`
	Range string `json:"range"`
}

// Record is what one attachment holds.
type Record struct {
	Version     int    `json:"version"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	PodRef      string `json:"podRef,omitempty"`
	// Network is the CNI network's name; NetworkName is whereabouts' network_name.
	Network     string `json:"network"`
	NetworkName string `json:"networkName,omitempty"`
	Kubeconfig  string `json:"kubeconfig"`
	Namespace   string `json:"namespace"`
	Pools       []Pool `json:"pools"`
	// IPs are the addresses the delegate returned, empty until ADD completed.
	IPs []string `json:"ips,omitempty"`
}

// maxContainerID bounds a container ID (runtimes use 64 hex digits).
const maxContainerID = 200

var containerIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)

// ValidateContainerID refuses a container ID that is not what the CNI spec
// allows (alphanumerics, '_', '.', '-', starting alphanumeric): such an ID
// could name a path outside the checkpoint directory.
func ValidateContainerID(id string) error {
	// An if-chain, not a switch: gremlins v0.5.0 never counts a case
	// expression as covered (docs/testing.md, "Mutation testing").
	if id == "" {
		return errors.New("CNI_CONTAINERID is empty")
	}
	if len(id) > maxContainerID {
		return fmt.Errorf("CNI_CONTAINERID is %d bytes long; at most %d are allowed", len(id), maxContainerID)
	}
	if !containerIDRE.MatchString(id) {
		return fmt.Errorf("CNI_CONTAINERID %q may contain only letters, digits, '_', '.' and '-', and must start with a letter or digit", id)
	}
	return nil
}

// ValidateIfName refuses an interface name Linux would refuse: empty, longer
// than 15 bytes, "." or "..", or containing '/', ':', whitespace or NUL; and
// one that is not UTF-8, which a checkpoint (JSON) cannot record.
func ValidateIfName(name string) error {
	// An if-chain, not a switch: see ValidateContainerID.
	if name == "" {
		return errors.New("CNI_IFNAME is empty")
	}
	if len(name) > 15 {
		return fmt.Errorf("CNI_IFNAME %q is longer than 15 bytes", name)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("CNI_IFNAME %q is not an interface name", name)
	}
	if !utf8.ValidString(name) {
		// JSON would store it as another name, which Read would not find.
		return fmt.Errorf("CNI_IFNAME %q is not valid UTF-8", name)
	}
	for _, r := range name {
		if r == '/' || r == ':' || r == 0 || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("CNI_IFNAME %q contains %q; interface names may not contain '/', ':', whitespace or control characters", name, r)
		}
	}
	return nil
}

// Dir is a checkpoint directory.
type Dir string

// path is the file of one attachment. ':' can appear in neither part, so the
// name is unique, and the validated parts cannot leave the directory.
func (d Dir) path(containerID, ifName string) (string, error) {
	if err := ValidateContainerID(containerID); err != nil {
		return "", err
	}
	if err := ValidateIfName(ifName); err != nil {
		return "", err
	}
	p := filepath.Join(string(d), containerID+":"+ifName+".json")
	if filepath.Dir(p) != filepath.Clean(string(d)) {
		return "", fmt.Errorf("checkpoint of %s/%s would leave %s", containerID, ifName, d)
	}
	return p, nil
}

// Write stores r atomically and durably (file and directory fsynced),
// replacing any earlier record of the attachment.
func (d Dir) Write(r Record) error { return d.write(osFiles{}, r, true) }

// Update replaces a record atomically, without waiting for the directory:
// for details added to a record that Write already made durable. The file is
// fsynced before it is renamed into place, so a power cut leaves the old
// record or the new one, never an empty one.
func (d Dir) Update(r Record) error { return d.write(osFiles{}, r, false) }

func (d Dir) write(fs files, r Record, durable bool) error {
	p, err := d.path(r.ContainerID, r.IfName)
	if err != nil {
		return err
	}
	if err := r.validate(); err != nil {
		return err
	}
	r.Version = Version
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode checkpoint %s: %w", p, err)
	}
	if err := fs.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("create checkpoint dir %s: %w", d, err)
	}
	tmp, err := fs.CreateTemp(string(d), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", p, err)
	}
	defer fs.Remove(tmp.Name()) // no-op once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write checkpoint %s: %w", p, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync checkpoint %s: %w", p, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", p, err)
	}
	if err := fs.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("commit checkpoint %s: %w", p, err)
	}
	if !durable {
		return nil
	}
	if err := fs.SyncDir(string(d)); err != nil {
		return fmt.Errorf("sync checkpoint dir %s: %w", d, err)
	}
	return nil
}

// files is what write does to the file system: the real one, or a test's
// record of the order of its steps.
type files interface {
	MkdirAll(dir string, perm os.FileMode) error
	CreateTemp(dir, pattern string) (file, error)
	Rename(from, to string) error
	Remove(name string) error
	SyncDir(dir string) error
}

type file interface {
	Name() string
	Write([]byte) (int, error)
	Sync() error
	Close() error
}

type osFiles struct{}

func (osFiles) MkdirAll(dir string, perm os.FileMode) error  { return os.MkdirAll(dir, perm) }
func (osFiles) CreateTemp(dir, pattern string) (file, error) { return os.CreateTemp(dir, pattern) }
func (osFiles) Rename(from, to string) error                 { return os.Rename(from, to) }
func (osFiles) Remove(name string) error                     { return os.Remove(name) }

func (osFiles) SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Read returns the record of an attachment; ok is false when there is none.
func (d Dir) Read(containerID, ifName string) (Record, bool, error) {
	p, err := d.path(containerID, ifName)
	if err != nil {
		return Record{}, false, err
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read checkpoint %s: %w", p, err)
	}
	r, err := Decode(data)
	if err != nil {
		return Record{}, false, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	if r.ContainerID != containerID || r.IfName != ifName {
		return Record{}, false, fmt.Errorf("checkpoint %s records %s/%s, not %s/%s", p, r.ContainerID, r.IfName, containerID, ifName)
	}
	return r, true, nil
}

// Decode parses and validates a checkpoint file's contents, of any release
// (see the package's compatibility rule).
func Decode(data []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("not a checkpoint: %w", err)
	}
	if r.Version < 1 {
		return Record{}, fmt.Errorf("not a checkpoint: no version")
	}
	if err := r.validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// validate is what Decode demands of a record, so Write demands it too:
// what is written can be read.
func (r Record) validate() error {
	if err := ValidateContainerID(r.ContainerID); err != nil {
		return err
	}
	if err := ValidateIfName(r.IfName); err != nil {
		return err
	}
	texts := append([]string{r.PodRef, r.Network, r.NetworkName, r.Kubeconfig, r.Namespace}, r.IPs...)
	for _, p := range r.Pools {
		if p.Name == "" || strings.ContainsAny(p.Name, "/\x00") {
			return fmt.Errorf("checkpoint names pool %q", p.Name)
		}
		texts = append(texts, p.Name, p.Range)
	}
	for _, s := range texts {
		// JSON would record another string than the one written.
		if !utf8.ValidString(s) {
			return fmt.Errorf("checkpoint of %s/%s: %q is not valid UTF-8", r.ContainerID, r.IfName, s)
		}
	}
	return nil
}

// Remove deletes the record of an attachment; a missing one is no error.
func (d Dir) Remove(containerID, ifName string) error {
	p, err := d.path(containerID, ifName)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove checkpoint %s: %w", p, err)
	}
	// The mark an ADD that died left (Adding); one held is an ADD's still
	// running, and stays.
	if mark := strings.TrimSuffix(p, ".json") + addingSuffix; !held(mark) {
		_ = os.Remove(mark)
	}
	return nil
}

// ForgetPool forgets what the records of a container say of a pool (in a
// namespace): its entries there were released by someone else (the pod's
// next sandbox), and no DEL may ever come for it. A record that names
// other pools too (a network of several ranges) keeps them and their
// addresses: the pod's next sandbox releases pool by pool, and may stop
// (a crash, an error) before the next one, whose entries are then still
// the DEL's to release, and an entry without an ifname (whereabouts
// v0.7.0's CRDs) is the attachment's only by the address its record
// names. A record of that pool alone is removed. It returns how many
// records it changed or removed; a record that does not read is left alone.
func (d Dir) ForgetPool(containerID, namespace, pool string) (int, error) {
	if ValidateContainerID(containerID) != nil {
		return 0, nil // no file can be named after it: nothing recorded
	}
	paths, err := filepath.Glob(filepath.Join(string(d), containerID+":*.json"))
	if err != nil {
		return 0, err
	}
	forgotten := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		r, err := Decode(data)
		if err != nil || r.ContainerID != containerID || r.Namespace != namespace || !r.Names(pool) {
			continue
		}
		if rest := r.without(pool); len(rest.Pools) > 0 {
			if err := d.Update(rest); err != nil {
				return forgotten, fmt.Errorf("forget pool %s in checkpoint %s: %w", pool, p, err)
			}
		} else if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return forgotten, fmt.Errorf("remove checkpoint %s: %w", p, err)
		}
		forgotten++
	}
	return forgotten, nil
}

// Addresses are the addresses of the record's IPs ("ip/prefix"); one that
// does not parse is left out.
func (r Record) Addresses() []net.IP {
	var out []net.IP
	for _, s := range r.IPs {
		if ip, _, err := net.ParseCIDR(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// Names says whether the record names pool.
func (r Record) Names(pool string) bool {
	for _, pl := range r.Pools {
		if pl.Name == pool {
			return true
		}
	}
	return false
}

// without is the record without pool, nor the addresses in its range (an
// address that does not parse stays).
func (r Record) without(pool string) Record {
	var gone []*net.IPNet
	pools := make([]Pool, 0, len(r.Pools))
	for _, pl := range r.Pools {
		if pl.Name != pool {
			pools = append(pools, pl)
			continue
		}
		if _, n, err := net.ParseCIDR(pl.Range); err == nil {
			gone = append(gone, n)
		}
	}
	var ips []string
	for _, s := range r.IPs {
		if !inAny(s, gone) {
			ips = append(ips, s)
		}
	}
	r.Pools, r.IPs = pools, ips
	return r
}

// inAny says whether the address of s ("ip/prefix" or "ip") is in one of ns.
func inAny(s string, ns []*net.IPNet) bool {
	ip, _, err := net.ParseCIDR(s)
	if err != nil {
		ip = net.ParseIP(s)
	}
	for _, n := range ns {
		if ip != nil && n.Contains(ip) {
			return true
		}
	}
	return false
}

// OfContainer returns the records of a container's attachments; those that
// do not read are returned as errors beside them.
func (d Dir) OfContainer(containerID string) ([]Record, []error) {
	if ValidateContainerID(containerID) != nil {
		return nil, nil // no file can be named after it: nothing recorded
	}
	paths, err := filepath.Glob(filepath.Join(string(d), containerID+":*.json"))
	if err != nil {
		return nil, []error{err}
	}
	var recs []Record
	var errs []error
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("read checkpoint %s: %w", p, err))
			}
			continue
		}
		r, err := Decode(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("checkpoint %s: %w", p, err))
			continue
		}
		if r.ContainerID == containerID {
			recs = append(recs, r)
		}
	}
	return recs, errs
}

// files are the directory's entries; a directory not yet made has none.
func (d Dir) files() ([]os.DirEntry, error) {
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list checkpoints in %s: %w", d, err)
	}
	return entries, nil
}

// List returns every record in the directory. Files that do not parse are
// returned as errors beside the records, so that one bad file hides nothing.
func (d Dir) List() ([]Record, []error) {
	entries, err := d.files()
	if err != nil {
		return nil, []error{err}
	}
	var recs []Record
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(string(d), e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read checkpoint %s: %w", p, err))
			continue
		}
		r, err := Decode(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("checkpoint %s: %w", p, err))
			continue
		}
		recs = append(recs, r)
	}
	return recs, errs
}
