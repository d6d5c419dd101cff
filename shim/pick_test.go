package shim_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func TestFindAttachment(t *testing.T) {
	twice := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{
		"1": {ContainerID: "c", PodRef: "ns/p", IfName: "lhnet1"},
		"2": {ContainerID: "c", PodRef: "ns/p", IfName: "lhnet2"},
		"3": {ContainerID: "d", PodRef: "ns/q", IfName: "lhnet1"},
	})
	legacyTwice := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{ // whereabouts v0.7.0: no ifnames
		"1": {ContainerID: "c", PodRef: "ns/p"},
		"2": {ContainerID: "c", PodRef: "ns/p"},
	})
	legacyOnce := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{
		"1": {ContainerID: "c", PodRef: "ns/p"},
		"5": {ContainerID: "x", PodRef: "ns/x"},
	})
	legacyBeside := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{
		"1": {ContainerID: "c", PodRef: "ns/p"},
		"2": {ContainerID: "c", PodRef: "ns/p", IfName: "lhnet2"},
	})
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, x := range s {
			out = append(out, net.ParseIP(x))
		}
		return out
	}
	for _, tt := range []struct {
		name     string
		p        *shim.Pool
		id, if_  string
		ips      []net.IP
		want     shim.Found
		siblings []net.IP
	}{
		{"by ifname, beside a sibling", twice, "c", "lhnet2", nil, shim.Found{Offsets: []string{"2"}, Others: 1}, nil},
		{"a recorded address held under another ifname is not ours", twice, "c", "lhnet2", ips("10.0.0.1"), shim.Found{Offsets: []string{"2"}, Others: 1}, nil},
		{"recorded address no longer held: by ifname", twice, "c", "lhnet1", ips("10.0.0.9"), shim.Found{Offsets: []string{"1"}, Others: 1}, nil},
		{"recorded addresses, none held: the unnamed entries are other interfaces'", legacyTwice, "c", "lhnet1", ips("10.0.0.9"), shim.Found{Others: 2}, nil},
		{"no entry of that ifname", twice, "c", "lhnet3", nil, shim.Found{Others: 2}, nil},
		{"another container", twice, "z", "lhnet1", nil, shim.Found{}, nil},
		{"no container id", twice, "", "lhnet1", nil, shim.Found{}, nil},
		{"two entries without ifname: cannot tell", legacyTwice, "c", "lhnet2", nil, shim.Found{Others: 2, Ambiguous: true}, nil},
		{"two entries without ifname, by recorded address", legacyTwice, "c", "lhnet2", ips("10.0.0.2"), shim.Found{Offsets: []string{"2"}, Others: 1}, nil},
		// A DEL may come again after the first released its own entry: the
		// one left may be another interface's.
		{"the container's only entry, without ifname and unrecorded: not picked", legacyOnce, "c", "lhnet1", nil, shim.Found{Others: 1, Ambiguous: true}, nil},
		{"the container's only entry, without ifname, recorded", legacyOnce, "c", "lhnet1", ips("10.0.0.1"), shim.Found{Offsets: []string{"1"}}, nil},
		{"an entry without ifname beside a named sibling", legacyBeside, "c", "lhnet1", nil, shim.Found{Others: 2, Ambiguous: true}, nil},
		{"a bad range: by ifname still, and the unnamed entry cannot be told", fake.NewPool("p", "bad", map[string]alloc{"1": {ContainerID: "c", IfName: "e"}, "2": {ContainerID: "c"}}), "c", "e", ips("10.0.0.2"), shim.Found{Offsets: []string{"1"}, Others: 1, Ambiguous: true}, nil},
		// Recorded by both (one chose it on a stale copy and never wrote
		// it): the entry is one of theirs, nothing tells whose.
		{"the container's only entry, without ifname, recorded by a sibling too", legacyOnce, "c", "lhnet2", ips("10.0.0.1"), shim.Found{Others: 1, Ambiguous: true}, ips("10.0.0.1")},
		{"an unnamed entry at a recorded address only this one recorded", legacyTwice, "c", "lhnet2", ips("10.0.0.2"), shim.Found{Offsets: []string{"2"}, Others: 1}, ips("10.0.0.1")},
		{"an entry named for the attachment, whatever the siblings recorded", twice, "c", "lhnet2", ips("10.0.0.2"), shim.Found{Offsets: []string{"2"}, Others: 1}, ips("10.0.0.2")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := shim.FindAttachment(tt.p, tt.id, tt.if_, tt.ips, tt.siblings)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.want.Offsets, shim.Attachment(tt.id, tt.if_, tt.ips, tt.siblings)(tt.p))
		})
	}
}

func TestLostAttachment(t *testing.T) {
	legacy := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{ // whereabouts v0.7.0: no ifnames
		"1": {ContainerID: "c", PodRef: "ns/p"},
		"2": {ContainerID: "c", PodRef: "ns/p"},
		"3": {ContainerID: "d", PodRef: "ns/q"},
	})
	named := fake.NewPool("p", "10.0.0.0/24", map[string]alloc{
		"1": {ContainerID: "c", PodRef: "ns/p", IfName: "lhnet1"},
		"2": {ContainerID: "c", PodRef: "ns/p", IfName: "lhnet2"},
	})
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, x := range s {
			out = append(out, net.ParseIP(x))
		}
		return out
	}
	for _, tt := range []struct {
		name        string
		p           *shim.Pool
		ips, others []net.IP
		unsure      bool
		want        []string
	}{
		{"by ifname, as FindAttachment", named, nil, nil, false, []string{"1"}},
		{"unnamed, nothing else recorded: every unnamed entry of the container", legacy, nil, nil, false, []string{"1", "2"}},
		{"unnamed, the sibling's address recorded: the rest", legacy, nil, ips("10.0.0.2"), false, []string{"1"}},
		{"unnamed, at its own recorded address: that one, as FindAttachment", legacy, ips("10.0.0.1"), nil, false, []string{"1"}},
		{"unnamed, a sibling that recorded nothing: none", legacy, nil, nil, true, nil},
		// An address chosen and recorded, never written (the agent killed
		// before its patch), that the pool gave the sibling since: the
		// sibling's entry, or this one's, nothing tells.
		{"unnamed, at its own recorded address that the sibling recorded too: none", fake.NewPool("p", "10.0.0.0/24", map[string]alloc{"1": {ContainerID: "c", PodRef: "ns/p"}}), ips("10.0.0.1"), ips("10.0.0.1"), false, nil},
		{"a bad range: by ifname only", fake.NewPool("p", "bad", map[string]alloc{"1": {ContainerID: "c", IfName: "lhnet1"}, "2": {ContainerID: "c"}}), nil, nil, false, []string{"1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, shim.LostAttachment("c", "lhnet1", tt.ips, tt.others, tt.unsure)(tt.p))
		})
	}
}

func TestEarlierSandboxes(t *testing.T) {
	p := storageNetwork()[0].(*shim.Pool)
	for _, tt := range []struct {
		name      string
		pod, keep string
		ifName    string
		want      []string
	}{
		{"every earlier sandbox's", "longhorn-system/im-a", "current", "", []string{"4", "5", "6"}},
		{"but the one on lhnet1, whereabouts' to hand over", "longhorn-system/im-a", "current", "lhnet1", []string{"5", "6"}},
		{"on lhnet9, the same way", "longhorn-system/im-a", "current", "lhnet9", []string{"4", "5"}},
		{"no pod", "", "current", "lhnet1", nil},
		{"no sandbox to keep", "longhorn-system/im-a", "", "lhnet1", nil},
		{"another pod's never", "longhorn-system/im-b", "other", "", []string{"8"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, shim.EarlierSandboxes(tt.pod, tt.keep, tt.ifName)(p))
		})
	}
}

func TestEarlierOnInterface(t *testing.T) {
	p := storageNetwork()[0].(*shim.Pool)
	for _, tt := range []struct {
		name, ifName string
		want         []string
	}{
		{"lhnet1", "lhnet1", []string{"4"}},
		{"lhnet9", "lhnet9", []string{"6"}},
		{"no interface: none (v0.7.0's entries are released before)", "", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, shim.EarlierOnInterface("longhorn-system/im-a", "current", tt.ifName)(p))
		})
	}
}

func TestExactly(t *testing.T) {
	p := storageNetwork()[0].(*shim.Pool)
	want := map[string]alloc{
		"4": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"5": {ContainerID: "changed", PodRef: "longhorn-system/im-a"},
		"9": {ContainerID: "gone", PodRef: "longhorn-system/im-a"},
	}
	assert.Equal(t, []string{"4"}, shim.Exactly(want)(p))
}
