package shim

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPickers(t *testing.T) {
	allocs := map[string]alloc{
		"1": {ContainerID: "new", PodRef: "ns/a", IfName: "lhnet1"},
		"2": {ContainerID: "old", PodRef: "ns/a", IfName: "lhnet1"},
		"3": {ContainerID: "old", PodRef: "ns/a"},
		"4": {ContainerID: "older", PodRef: "ns/a", IfName: "eth7"},
		"5": {ContainerID: "x", PodRef: "ns/b", IfName: "lhnet1"},
		"6": {ContainerID: "legacy", PodRef: "ns/c"},
	}
	tests := []struct {
		name string
		pick Picker
		want []string
	}{
		{"earlier sandboxes of a", EarlierSandboxes("ns/a", "new"), []string{"2", "3", "4"}},
		{"no pod ref picks nothing", EarlierSandboxes("", "new"), nil},
		{"no container ID picks nothing", EarlierSandboxes("ns/a", ""), nil},
		{"pod of another namespace", EarlierSandboxes("other/a", "new"), nil},
		{"exact ifname wins over legacy", Attachment("old", "lhnet1"), []string{"2"}},
		{"legacy entry when no exact one", Attachment("old", "lhnet2"), []string{"3"}},
		{"legacy-only container", Attachment("legacy", "lhnet1"), []string{"6"}},
		{"another ifname is another attachment", Attachment("older", "lhnet1"), nil},
		{"unknown container", Attachment("nope", "lhnet1"), nil},
		{"empty container ID", Attachment("", "lhnet1"), nil},
		{"exactly what was seen", Exactly(map[string]alloc{"2": allocs["2"], "5": allocs["5"]}), []string{"2", "5"}},
		{"not what changed since", Exactly(map[string]alloc{"2": {ContainerID: "old", PodRef: "ns/a", IfName: "eth0"}, "9": {}}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.pick(allocs))
		})
	}
}
