package checkpoint

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func record(id, ifname string) Record {
	return Record{
		ContainerID: id, IfName: ifname, PodRef: "longhorn-system/instance-manager-a",
		Network: "storagenetwork-sg8d8", Kubeconfig: "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig",
		Namespace: "kube-system", Pools: []Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}},
		IPs: []string{"192.168.50.3/24"},
	}
}

func TestWriteReadRemove(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "cp"))
	r := record("517151fa292bdcf9522e24fb05f1a99bb96db0a37fb647edb5a146c72b1a5017", "lhnet1")
	require.NoError(t, d.Write(r))

	got, ok, err := d.Read(r.ContainerID, r.IfName)
	require.NoError(t, err)
	require.True(t, ok)
	r.Version = Version
	assert.Equal(t, r, got)

	st, err := os.Stat(string(d))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the directory is root's only")
	fst, err := os.Stat(filepath.Join(string(d), r.ContainerID+":lhnet1.json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fst.Mode().Perm(), "the file is root's only")

	// A rewrite replaces, leaving no temp file behind.
	r.IPs = nil
	require.NoError(t, d.Write(r))
	entries, _ := os.ReadDir(string(d))
	assert.Len(t, entries, 1)

	require.NoError(t, d.Remove(r.ContainerID, r.IfName))
	_, ok, err = d.Read(r.ContainerID, r.IfName)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, d.Remove(r.ContainerID, r.IfName), "removing twice is no error")
}

func TestHostileNamesAreRefused(t *testing.T) {
	d := Dir(t.TempDir())
	tests := []struct{ id, ifname, want string }{
		{"../../etc/passwd", "eth0", "may contain only letters"},
		{"/abs", "eth0", "may contain only letters"},
		{"a/b", "eth0", "may contain only letters"},
		{"a\x00b", "eth0", "may contain only letters"},
		{".hidden", "eth0", "must start with a letter or digit"},
		{strings.Repeat("a", 201), "eth0", "at most 200"},
		{"", "eth0", "CNI_CONTAINERID is empty"},
		{"abc", "..", "is not an interface name"},
		{"abc", "a/b", "may not contain '/'"},
		{"abc", "a:b", "may not contain '/', ':'"},
		{"abc", "a b", "whitespace"},
		{"abc", "a\x00", "control characters"},
		{"abc", "sixteen-chars-xx", "longer than 15 bytes"},
		{"abc", "", "CNI_IFNAME is empty"},
		{"0", "\x93", "is not valid UTF-8"}, // found by FuzzPaths: written, then not found by Read
	}
	for _, tt := range tests {
		err := d.Write(record(tt.id, tt.ifname))
		require.Error(t, err, "%q %q", tt.id, tt.ifname)
		assert.Contains(t, err.Error(), tt.want)
		_, _, err = d.Read(tt.id, tt.ifname)
		assert.Error(t, err)
		assert.Error(t, d.Remove(tt.id, tt.ifname))
	}
	entries, _ := os.ReadDir(string(d))
	assert.Empty(t, entries, "nothing was written anywhere")
}

// Found by FuzzPaths: Write stored records that Read then refused (a bad
// pool name), or returned changed (a string that is not UTF-8).
func TestWriteRefusesWhatReadWouldNotReturn(t *testing.T) {
	tests := []struct {
		name   string
		change func(r *Record)
		want   string
	}{
		{"an empty pool name", func(r *Record) { r.Pools[0].Name = "" }, `checkpoint names pool ""`},
		{"a pool name that climbs", func(r *Record) { r.Pools[0].Name = "../x" }, `checkpoint names pool "../x"`},
		{"a pool name with a slash", func(r *Record) { r.Pools[0].Name = "a/b" }, `checkpoint names pool "a/b"`},
		{"a pool name with NUL", func(r *Record) { r.Pools[0].Name = "a\x00b" }, `checkpoint names pool "a\x00b"`},
		{"a podref that is not UTF-8", func(r *Record) { r.PodRef = "ns/\x93" }, `"ns/\x93" is not valid UTF-8`},
		{"a network that is not UTF-8", func(r *Record) { r.Network = "\xff" }, `"\xff" is not valid UTF-8`},
		{"a range that is not UTF-8", func(r *Record) { r.Pools[0].Range = "\xc0" }, `"\xc0" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Dir(filepath.Join(t.TempDir(), "cp"))
			r := record("a", "lhnet1")
			tt.change(&r)
			err := d.Write(r)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			_, err = os.Stat(string(d))
			assert.True(t, os.IsNotExist(err), "nothing written")
		})
	}
}

func TestDecodeRefusesBadFiles(t *testing.T) {
	tests := []struct{ name, data, want string }{
		{"not JSON", "{", "not a checkpoint"},
		{"no version", `{"containerID":"a","ifName":"eth0"}`, "no version"},
		{"a hostile container ID", `{"version":1,"containerID":"../x","ifName":"eth0"}`, "may contain only letters"},
		{"a hostile pool", `{"version":1,"containerID":"a","ifName":"eth0","pools":[{"name":"../x"}]}`, `names pool "../x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.data))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestListSkipsBadFilesButReportsThem(t *testing.T) {
	d := Dir(t.TempDir())
	require.NoError(t, d.Write(record("a", "lhnet1")))
	require.NoError(t, d.Write(record("b", "lhnet1")))
	require.NoError(t, os.WriteFile(filepath.Join(string(d), "junk.json"), []byte("{"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(string(d), ".tmp-123"), []byte("{"), 0o600))

	recs, errs := d.List()
	require.Len(t, recs, 2)
	assert.ElementsMatch(t, []string{"a", "b"}, []string{recs[0].ContainerID, recs[1].ContainerID})
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Error(), "junk.json")

	recs, errs = Dir(filepath.Join(string(d), "missing")).List()
	assert.Empty(t, recs)
	assert.Empty(t, errs)
}

func TestReadRefusesARecordOfAnotherAttachment(t *testing.T) {
	d := Dir(t.TempDir())
	require.NoError(t, d.Write(record("a", "lhnet1")))
	require.NoError(t, os.Rename(filepath.Join(string(d), "a:lhnet1.json"), filepath.Join(string(d), "b:lhnet1.json")))
	_, _, err := d.Read("b", "lhnet1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "records a/lhnet1, not b/lhnet1")
}

// A record of a newer release (after a downgrade) is read for what this one
// knows; an older one too.
func TestRecordsOfOtherReleasesAreRead(t *testing.T) {
	for _, data := range []string{
		`{"version":3,"containerID":"a","ifName":"eth0","namespace":"kube-system","pools":[{"name":"p","range":"10.0.0.0/24","nodeSlice":"x"}],"nodeName":"n1"}`,
		`{"version":1,"containerID":"a","ifName":"eth0","namespace":"kube-system","pools":[{"name":"p","range":"10.0.0.0/24"}]}`,
	} {
		r, err := Decode([]byte(data))
		require.NoError(t, err, data)
		assert.Equal(t, []Pool{{Name: "p", Range: "10.0.0.0/24"}}, r.Pools)
		assert.Equal(t, "kube-system", r.Namespace)
	}
}

// steps records what write does, in order.
type steps struct {
	osFiles
	log []string
}

type stepFile struct {
	*os.File
	s *steps
}

func (f stepFile) Sync() error  { f.s.log = append(f.s.log, "sync file"); return f.File.Sync() }
func (f stepFile) Close() error { f.s.log = append(f.s.log, "close"); return f.File.Close() }

func (s *steps) CreateTemp(dir, pattern string) (file, error) {
	f, err := os.CreateTemp(dir, pattern)
	s.log = append(s.log, "create temp")
	return stepFile{f, s}, err
}
func (s *steps) Rename(a, b string) error { s.log = append(s.log, "rename"); return os.Rename(a, b) }
func (s *steps) SyncDir(d string) error {
	s.log = append(s.log, "sync dir")
	return s.osFiles.SyncDir(d)
}

// Both Write and Update fsync the file before renaming it into place: after a
// power cut, the record is the old one or the new one, never empty.
func TestEveryRecordIsOnDiskBeforeItIsRenamedIntoPlace(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "cp"))
	for _, tt := range []struct {
		durable bool
		want    []string
	}{
		{true, []string{"create temp", "sync file", "close", "rename", "sync dir"}},
		{false, []string{"create temp", "sync file", "close", "rename"}},
	} {
		s := &steps{}
		require.NoError(t, d.write(s, record("a", "lhnet1"), tt.durable))
		assert.Equal(t, tt.want, s.log, "durable=%v", tt.durable)
	}
}

func TestForgetPool(t *testing.T) {
	d := Dir(t.TempDir())
	a := record("a", "lhnet1")
	b := record("a", "lhnet2")
	b.Pools = []Pool{{Name: "10.9.0.0-24", Range: "10.9.0.0/24"}}
	c := record("c", "lhnet1")
	other := record("a", "lhnet3")
	other.Namespace = "harvester-system"
	for _, r := range []Record{a, b, c, other} {
		require.NoError(t, d.Write(r))
	}
	require.NoError(t, os.WriteFile(filepath.Join(string(d), "a:junk.json"), []byte("{"), 0o600))
	n, err := d.ForgetPool("a", "kube-system", "192.168.50.0-24")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	recs, _ := d.List()
	var left []string
	for _, r := range recs {
		left = append(left, r.ContainerID+":"+r.IfName+"@"+r.Namespace)
	}
	assert.ElementsMatch(t, []string{"a:lhnet2@kube-system", "c:lhnet1@kube-system", "a:lhnet3@harvester-system"}, left,
		"only a's record of that pool in that namespace; a record that does not read stays")
	_, err = os.Stat(filepath.Join(string(d), "a:junk.json"))
	assert.NoError(t, err)
	n, err = d.ForgetPool("../x", "kube-system", "192.168.50.0-24")
	assert.NoError(t, err)
	assert.Zero(t, n)
}

// The directory sync opens the directory: one that is not there is an error
// that names it, not a silent success.
func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, dir string
		wantErr   bool
	}{
		{"the directory", dir, false},
		{"no such directory", filepath.Join(dir, "gone"), true},
	} {
		err := osFiles{}.SyncDir(tt.dir)
		if !tt.wantErr {
			assert.NoError(t, err, tt.name)
			continue
		}
		assert.ErrorIs(t, err, fs.ErrNotExist, tt.name)
		assert.ErrorContains(t, err, tt.dir, tt.name)
	}
}
