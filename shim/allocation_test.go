package shim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

func TestAllocationsAreSortedByAddress(t *testing.T) {
	as, err := shim.Allocations(fake.NewPool("p", "10.0.0.0/16", map[string]alloc{
		"300": {ContainerID: "c"}, "9": {ContainerID: "a"}, "10": {ContainerID: "b"}, "256": {ContainerID: "d"}, "2": {ContainerID: "e"},
	}))
	require.NoError(t, err)
	var got []string
	for _, a := range as {
		got = append(got, a.IP.String())
	}
	assert.Equal(t, []string{"10.0.0.2", "10.0.0.9", "10.0.0.10", "10.0.1.0", "10.0.1.44"}, got)
	assert.Len(t, as[0].IP, 4, "an IPv4 address in its 4-byte form")
}

func TestAllocationsAddresses(t *testing.T) {
	for _, tt := range []struct {
		rng, off, want string
		wantErr        bool
	}{
		{"192.168.50.0/24", "4", "192.168.50.4", false},
		{"192.168.50.0/24", "255", "192.168.50.255", false},
		{"10.0.0.0/8", "65537", "10.1.0.1", false},
		{"fd00:10::/64", "17", "fd00:10::11", false},
		{"192.168.50.0/24", "x", "", true},
		{"192.168.50.0/24", "-1", "", true},
		{"bad", "1", "", true},
	} {
		as, err := shim.Allocations(fake.NewPool("p", tt.rng, map[string]alloc{tt.off: {ContainerID: "c", PodRef: "ns/p"}}))
		if tt.wantErr {
			assert.Error(t, err, "%s + %s", tt.rng, tt.off)
			continue
		}
		require.NoError(t, err)
		require.Len(t, as, 1)
		assert.Equal(t, tt.want, as[0].IP.String())
		assert.Contains(t, as[0].String(), tt.want+" (pool p, container c, pod ns/p")
	}
}
