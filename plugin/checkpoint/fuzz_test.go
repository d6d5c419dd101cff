package checkpoint

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

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
