package checkpoint

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
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

// A directory named with a trailing slash or a "." in it is the same
// directory: records are written and read there.
func TestADirectoryNamedAnotherWay(t *testing.T) {
	base := t.TempDir()
	for _, name := range []string{base + "/cp/", base + "/./cp", base + "/x/../cp"} {
		d := Dir(name)
		r := record("a", "lhnet1")
		require.NoError(t, d.Write(r), name)
		got, ok, err := d.Read("a", "lhnet1")
		require.NoError(t, err, name)
		require.True(t, ok, name)
		assert.Equal(t, r.PodRef, got.PodRef)
		_, err = os.Stat(filepath.Join(base, "cp", "a:lhnet1.json"))
		assert.NoError(t, err, "%s is %s/cp", name, base)
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
		// Every other text of the record too: none comes back changed.
		{"a network_name that is not UTF-8", func(r *Record) { r.NetworkName = "blue\xff" }, `"blue\xff" is not valid UTF-8`},
		{"a kubeconfig path that is not UTF-8", func(r *Record) { r.Kubeconfig = "/etc/\xfe" }, `"/etc/\xfe" is not valid UTF-8`},
		{"a namespace that is not UTF-8", func(r *Record) { r.Namespace = "kube-\x80" }, `"kube-\x80" is not valid UTF-8`},
		{"an address that is not UTF-8", func(r *Record) { r.IPs = []string{"10.0.0.2/24", "\xf0"} }, `"\xf0" is not valid UTF-8`},
		{"a pool name that is not UTF-8", func(r *Record) { r.Pools[0].Name = "10.0.0.0-24\xfa" }, `"10.0.0.0-24\xfa" is not valid UTF-8`},
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

// A record of a network of several ranges (range and ipRanges, dual
// stack) names a pool each: the pod's next sandbox releases the earlier
// one's entries pool by pool, and a pool released is forgotten alone. The
// record stays for the pools not released yet, with their addresses, for
// the earlier sandbox's DEL: an entry without an ifname (whereabouts
// v0.7.0's CRD prunes it) is the attachment's only by the address its
// record names. The last pool forgotten, the record goes.
func TestForgetPoolKeepsTheRecordOfTheOtherPools(t *testing.T) {
	for _, tt := range []struct {
		name   string
		forget []string
		// want are the pools and addresses left, nil: no record.
		wantPools []Pool
		wantIPs   []string
	}{
		{name: "the first pool released", forget: []string{"192.168.50.0-24"},
			wantPools: []Pool{{Name: "fd00-5---120", Range: "fd00:5::/120"}}, wantIPs: []string{"fd00:5::2/120"}},
		{name: "the second pool released", forget: []string{"fd00-5---120"},
			wantPools: []Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}}, wantIPs: []string{"192.168.50.3/24"}},
		{name: "another pool", forget: []string{"10.9.0.0-24"},
			wantPools: []Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}, {Name: "fd00-5---120", Range: "fd00:5::/120"}},
			wantIPs:   []string{"192.168.50.3/24", "fd00:5::2/120"}},
		{name: "both released", forget: []string{"fd00-5---120", "192.168.50.0-24"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := Dir(t.TempDir())
			dual := record("a", "net1")
			dual.Pools = append(dual.Pools, Pool{Name: "fd00-5---120", Range: "fd00:5::/120"})
			dual.IPs = append(dual.IPs, "fd00:5::2/120")
			require.NoError(t, d.Write(dual))
			for _, pool := range tt.forget {
				_, err := d.ForgetPool("a", "kube-system", pool)
				require.NoError(t, err)
			}
			got, ok, err := d.Read("a", "net1")
			require.NoError(t, err)
			if tt.wantPools == nil {
				assert.False(t, ok, "every pool released: no record left")
				return
			}
			require.True(t, ok, "a pool not released yet: the record stays")
			assert.Equal(t, tt.wantPools, got.Pools)
			assert.Equal(t, tt.wantIPs, got.IPs)
			assert.Equal(t, dual.PodRef, got.PodRef)
		})
	}
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

// The IDs a runtime may pass, at the edges the CNI spec and Linux draw: what
// is refused says why, and what is allowed is the longest allowed.
func TestValidateContainerID(t *testing.T) {
	for _, tt := range []struct {
		id, wantErr string
	}{
		{"a", ""},
		{"0123abc_.-x", ""},
		{strings.Repeat("a", 200), ""},
		{"", "CNI_CONTAINERID is empty"},
		{strings.Repeat("a", 201), "CNI_CONTAINERID is 201 bytes long; at most 200 are allowed"},
		{"-a", `may contain only letters, digits, '_', '.' and '-', and must start with a letter or digit`},
		{"a/b", `CNI_CONTAINERID "a/b" may contain only`},
		{"..", `CNI_CONTAINERID ".." may contain only`},
	} {
		err := ValidateContainerID(tt.id)
		if tt.wantErr == "" {
			assert.NoError(t, err, "%q", tt.id)
			continue
		}
		if assert.Error(t, err, "%q", tt.id) {
			assert.Contains(t, err.Error(), tt.wantErr)
		}
	}
}

func TestValidateIfName(t *testing.T) {
	for _, tt := range []struct {
		name, wantErr string
	}{
		{"lhnet1", ""},
		{"e", ""},
		{"...", ""},
		{strings.Repeat("i", 15), ""},
		{"", "CNI_IFNAME is empty"},
		{strings.Repeat("i", 16), `CNI_IFNAME "iiiiiiiiiiiiiiii" is longer than 15 bytes`},
		{".", `CNI_IFNAME "." is not an interface name`},
		{"..", `CNI_IFNAME ".." is not an interface name`},
		{"a\xffb", "is not valid UTF-8"},
		{"a/b", `CNI_IFNAME "a/b"`},
		{"a:b", `CNI_IFNAME "a:b"`},
		{"a b", `CNI_IFNAME "a b"`},
		{"a\x00b", `CNI_IFNAME "a\x00b"`},
		{"a\u200bb", `CNI_IFNAME`},
	} {
		err := ValidateIfName(tt.name)
		if tt.wantErr == "" {
			assert.NoError(t, err, "%q", tt.name)
			continue
		}
		if assert.Error(t, err, "%q", tt.name) {
			assert.Contains(t, err.Error(), tt.wantErr)
		}
	}
}

// FuzzDecode: Decode never panics, and what it accepts is a record that names
// a valid attachment and pools, and that reads back the same once re-encoded.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"containerID":"517151fa292bdcf9522e24fb05f1a99bb96db0a37fb647edb5a146c72b1a5017","ifName":"lhnet1","podRef":"longhorn-system/instance-manager-6b77","network":"storagenetwork-sg8d8","kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig","namespace":"kube-system","pools":[{"name":"192.168.50.0-24","range":"192.168.50.0/24"}],"ips":["192.168.50.3/24"]}`,
		`{"version":1,"containerID":"a","ifName":"eth0","networkName":"blue","pools":[{"name":"blue-fd00-10---64","range":"fd00:10::/64"},{"name":"blue-10.1.0.0-24","range":"10.1.0.0/24"}]}`,
		`{"version":1,"containerID":"a","ifName":"eth0","pools":[]}`,
		`{"version":1,"containerID":"../x","ifName":"eth0"}`,
		`{"version":1,"containerID":"a","ifName":"a/b"}`,
		`{"version":1,"containerID":"a","ifName":"eth0","pools":[{"name":"../x"}]}`,
		`{"version":1,"containerID":"a","ifName":"eth0","pools":[{"name":""}]}`,
		`{"version":2,"containerID":"a","ifName":"eth0"}`,
		`{"VERSION":1,"ContainerId":"a","IFNAME":"eth0","containerID":"b"}`,
		`{"version":1,"containerID":"a","ifName":"\u00e9th0"}`,
		`{"version":1,"containerID":"a","ifName":"eth\ud800"}`,
		`null`,
		`{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			if !reflect.DeepEqual(r, Record{}) {
				t.Fatalf("a record %+v beside the error %v", r, err)
			}
			return
		}
		if r.Version < 1 {
			t.Fatalf("version %d accepted", r.Version)
		}
		if err := ValidateContainerID(r.ContainerID); err != nil {
			t.Fatalf("accepted: %v", err)
		}
		if err := ValidateIfName(r.IfName); err != nil {
			t.Fatalf("accepted: %v", err)
		}
		for _, p := range r.Pools {
			if p.Name == "" || strings.ContainsAny(p.Name, "/\x00") {
				t.Fatalf("accepted pool %q", p.Name)
			}
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Decode(again)
		if err != nil {
			t.Fatalf("%s decodes from %q, but not re-encoded: %v", again, data, err)
		}
		if !sameRecord(r, r2) {
			t.Fatalf("re-encoded, %+v reads back as %+v", r, r2)
		}
	})
}

// FuzzPaths: Write, Read and Remove never panic and never create anything
// outside the Dir they are given; hostile container IDs and ifnames are
// refused with an error that names CNI_CONTAINERID or CNI_IFNAME; what Write
// accepts, Read returns as it was written, and Remove removes.
func FuzzPaths(f *testing.F) {
	for _, s := range []struct{ id, ifname, podRef, pool string }{
		{"517151fa292bdcf9522e24fb05f1a99bb96db0a37fb647edb5a146c72b1a5017", "lhnet1", "longhorn-system/instance-manager-6b77", "192.168.50.0-24"},
		{"cnitool-2c6a1e7b8f9d0e1a2b3c", "eth0", "default/vm-a", "blue-fd00-10---64"},
		{"../../etc/passwd", "lhnet1", "ns/p", "192.168.50.0-24"},
		{"..", "lhnet1", "ns/p", "p"},
		{"a/b", "lhnet1", "ns/p", "p"},
		{"/abs", "lhnet1", "ns/p", "p"},
		{"a\x00b", "lhnet1", "ns/p", "p"},
		{strings.Repeat("a", 201), "lhnet1", "ns/p", "p"},
		{strings.Repeat("a", 200), "fifteen-bytes-x", "ns/p", "p"},
		{"a", "../../x", "ns/p", "p"},
		{"a", "..", "ns/p", "p"},
		{"a", ".", "ns/p", "p"},
		{"a", "x/y", "ns/p", "p"},
		{"a", "x\x00", "ns/p", "p"},
		{"a", "x:y", "ns/p", "p"},
		{"a", "sixteen-bytes-xx", "ns/p", "p"},
		{"a", "lhnet1", "ns/p", "../x"},
		{"a", "lhnet1", "", ""},
		{"", "", "", ""},
	} {
		f.Add(s.id, s.ifname, s.podRef, s.pool)
	}
	f.Fuzz(func(t *testing.T, id, ifname, podRef, pool string) {
		parent := t.TempDir()
		d := Dir(filepath.Join(parent, "cp"))
		rec := Record{
			ContainerID: id, IfName: ifname, PodRef: podRef, Network: "storagenetwork-sg8d8",
			Kubeconfig: "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig", Namespace: "kube-system",
			Pools: []Pool{{Name: pool, Range: "192.168.50.0/24"}}, IPs: []string{"192.168.50.3/24"},
		}
		idErr, ifErr := ValidateContainerID(id), ValidateIfName(ifname)
		hostileID := id == "" || len(id) > maxContainerID || strings.ContainsAny(id, "/\x00") || strings.HasPrefix(id, ".")
		hostileIf := ifname == "" || len(ifname) > 15 || strings.ContainsAny(ifname, "/\x00") || ifname == "." || ifname == ".."
		if hostileID && idErr == nil {
			t.Fatalf("container ID %q accepted", id)
		}
		if hostileIf && ifErr == nil {
			t.Fatalf("ifname %q accepted", ifname)
		}

		werr := d.Write(rec)
		got, ok, rerr := d.Read(id, ifname)
		if idErr != nil || ifErr != nil {
			want := "CNI_CONTAINERID"
			if idErr == nil {
				want = "CNI_IFNAME"
			}
			for verb, err := range map[string]error{"Write": werr, "Read": rerr, "Remove": d.Remove(id, ifname)} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("%s of %q/%q: want an error about %s, got %v", verb, id, ifname, want, err)
				}
			}
		} else if werr == nil {
			if rerr != nil || !ok {
				t.Fatalf("Write of %q/%q succeeded, Read: ok=%v %v", id, ifname, ok, rerr)
			}
			want := rec
			want.Version = Version
			if !sameRecord(want, got) {
				t.Fatalf("wrote %+v, read %+v", want, got)
			}
			entries, err := os.ReadDir(string(d))
			if err != nil || len(entries) != 1 || entries[0].Name() != id+":"+ifname+".json" {
				t.Fatalf("after Write, the dir holds %v (%v)", entries, err)
			}
			if err := d.Remove(id, ifname); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if _, ok, err := d.Read(id, ifname); ok || err != nil {
				t.Fatalf("after Remove, Read: ok=%v %v", ok, err)
			}
		} else if werr.Error() == "" {
			t.Fatal("an error without a message")
		}

		// Nothing anywhere but the Dir and, within it, nothing left behind.
		err := filepath.WalkDir(parent, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != parent && p != string(d) {
				t.Errorf("%s exists after Write/Read/Remove of %q/%q (Write: %v)", p, id, ifname, werr)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// sameRecord compares records as the file format can keep them: an empty list
// is no list.
func sameRecord(a, b Record) bool {
	norm := func(r Record) Record {
		if len(r.Pools) == 0 {
			r.Pools = nil
		}
		if len(r.IPs) == 0 {
			r.IPs = nil
		}
		return r
	}
	return reflect.DeepEqual(norm(a), norm(b))
}
