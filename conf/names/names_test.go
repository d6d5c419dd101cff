package names

import (
	"net"
	"testing"

	wbkube "github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
	"github.com/stretchr/testify/assert"
)

// The names are whereabouts' own: the test links whereabouts' storage
// package, which the plugin does not.
func TestNamesAreWhereabouts(t *testing.T) {
	for _, tt := range []struct{ rng, network string }{
		{"192.168.50.0/24", ""},
		{"192.168.50.0/24", "storage"},
		{"fd00:10::/64", ""},
		{"fd00:10::/64", "blue"},
		{"10.0.0.0/8", "a.b-c"},
	} {
		want := wbkube.IPPoolName(wbkube.PoolIdentifier{IpRange: tt.rng, NetworkName: tt.network})
		assert.Equal(t, want, Pool(tt.rng, tt.network), "pool of %s %q", tt.rng, tt.network)
		prefix, ok := PoolPrefix(want, tt.rng)
		assert.True(t, ok)
		assert.Equal(t, tt.network, prefix, "prefix of %s", want)
	}
	for _, tt := range []struct{ ip, network string }{
		{"192.168.50.4", ""},
		{"192.168.50.4", "storage"},
		{"fd00:10::5", ""},
		{"fd00:10::", "blue"},
		{"2001:db8::1:0", ""},
	} {
		ip := net.ParseIP(tt.ip)
		assert.Equal(t, wbkube.NormalizeIP(ip, tt.network), Reservation(ip, tt.network), "%s %q", tt.ip, tt.network)
	}
}

func TestNodeSlicesAndOddNames(t *testing.T) {
	// whereabouts v0.9's node slices, as its IPPoolName names them (the
	// module here is v0.8.0, which has no node slices):
	// <network_name>-<node>-<slice range>.
	slice := "blue-node-1-10.0.0.64-26"
	for _, tt := range []struct {
		pool, rng, network string
		may                bool
	}{
		{"192.168.50.0-24", "192.168.50.0/24", "", true},
		{"blue-192.168.50.0-24", "192.168.50.0/24", "blue", true},
		{"blue-192.168.50.0-24", "192.168.50.0/24", "green", false},
		{"blue-192.168.50.0-24", "192.168.50.0/24", "", true},
		{"192.168.50.0-24", "192.168.50.0/24", "blue", false},
		{slice, "10.0.0.64/26", "blue", true},
		{slice, "10.0.0.64/26", "blue-node", true},
		{slice, "10.0.0.64/26", "bluer", false},
		{"hand-made", "10.0.0.0/24", "blue", true}, // not whereabouts' name: in doubt
	} {
		assert.Equal(t, tt.may, MayHoldReservationsOf(tt.pool, tt.rng, tt.network), "%s under %q", tt.pool, tt.network)
	}
	assert.Equal(t, []string{"", "blue", "blue-node", "blue-node-1"}, ReservationNetworks(slice, "10.0.0.64/26"))
	assert.Equal(t, []string{""}, ReservationNetworks("192.168.50.0-24", "192.168.50.0/24"))
	// A network of one letter: its node slice reserves under it too. A
	// leading dash is no separator (no network is named "").
	assert.Equal(t, []string{"", "b", "b-node", "b-node-1"}, ReservationNetworks("b-node-1-10.0.0.64-26", "10.0.0.64/26"))
	assert.Equal(t, []string{"", "-b"}, ReservationNetworks("-b-192.168.50.0-24", "192.168.50.0/24"))
	_, ok := PoolPrefix("hand-made", "10.0.0.0/24")
	assert.False(t, ok)
}

func TestIsReservationOf(t *testing.T) {
	for _, tt := range []struct {
		name, network string
		want          bool
	}{
		{"192.168.50.4", "", true},
		{"blue-192.168.50.4", "blue", true},
		{"blue-192.168.50.4", "", false},
		{"192.168.50.4", "blue", false},
		{"red-192.168.50.4", "blue", false},
		{"fd00-10--5", "", true},
		{"fd00-10--0", "", true}, // fd00:10::, its trailing colon made 0
		{"blue-fd00-10--5", "blue", true},
		{"192.168.50.0-24", "", false}, // a pool's name
		{"192.168.050.4", "", false},
		{"", "", false},
	} {
		assert.Equal(t, tt.want, IsReservationOf(tt.name, tt.network), "%q under %q", tt.name, tt.network)
	}
}
