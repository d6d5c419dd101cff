package conf

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// IPAMRanges reads ranges as whereabouts' own loader does: the pools it
// names are the pools Load (which runs that loader) names, for every shape
// of range; it adds the bounds and excludes, and opens no file.
func TestIPAMRangesAgreeWithWhereaboutsLoader(t *testing.T) {
	flat := flatFile(t, `{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"}}`)
	tests := []struct {
		name string
		ipam string
		want []Range
	}{{
		name: "storage network",
		ipam: `{"type":"whereabouts","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2"]}`,
		want: []Range{{Pool: "192.168.50.0-24", Range: "192.168.50.0/24", Exclude: []string{"192.168.50.1/32", "192.168.50.2"}}},
	}, {
		name: "host bits set, range_start and range_end",
		ipam: `{"type":"harvester-ipam","range":"10.1.0.7/27","range_start":"10.1.0.5","range_end":"10.1.0.20"}`,
		want: []Range{{Pool: "10.1.0.0-27", Range: "10.1.0.0/27", Start: net.ParseIP("10.1.0.5"), End: net.ParseIP("10.1.0.20")}},
	}, {
		name: "first-last/prefix, network_name, ipRanges with their own excludes, IPv6",
		ipam: `{"type":"whereabouts","network_name":"blue","range":"10.1.0.10-10.1.0.20/24","exclude":["10.1.0.12/31"],` +
			`"ipRanges":[{"range":"fd00:10::/64","exclude":["fd00:10::/120"]}]}`,
		want: []Range{
			{Pool: "blue-10.1.0.0-24", Range: "10.1.0.0/24", Start: net.ParseIP("10.1.0.10"), End: net.ParseIP("10.1.0.20"), Exclude: []string{"10.1.0.12/31"}},
			{Pool: "blue-fd00-10---64", Range: "fd00:10::/64", Exclude: []string{"fd00:10::/120"}},
		},
	}, {
		name: "ipRanges alone",
		ipam: `{"type":"whereabouts","ipRanges":[{"range":"10.2.0.0/28"},{"range":"10.3.0.0/28"}]}`,
		want: []Range{{Pool: "10.2.0.0-28", Range: "10.2.0.0/28"}, {Pool: "10.3.0.0-28", Range: "10.3.0.0/28"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IPAMRanges([]byte(tt.ipam))
			require.NoError(t, err)
			require.Len(t, got.Ranges, len(tt.want))
			for i, w := range tt.want {
				g := got.Ranges[i]
				assert.Equal(t, w.Pool, g.Pool)
				assert.Equal(t, w.Range, g.Range)
				assert.True(t, w.Start.Equal(g.Start), "start %s, want %s", g.Start, w.Start)
				assert.True(t, w.End.Equal(g.End), "end %s, want %s", g.End, w.End)
				assert.Equal(t, w.Exclude, g.Exclude)
			}
			// whereabouts' loader, through Load, names the same pools.
			ipam := tt.ipam[:len(tt.ipam)-1] + `,"configuration_path":"` + flat + `"}`
			cfg, err := Load(nad(ipam))
			require.NoError(t, err)
			var pools []string
			for _, p := range cfg.Pools {
				pools = append(pools, p.Name)
			}
			var want []string
			for _, r := range got.Ranges {
				want = append(want, r.Pool)
			}
			assert.Equal(t, pools, want)
		})
	}
}

func TestNetworkIPAMs(t *testing.T) {
	tests := []struct {
		name      string
		config    string
		wantPools []string
		wantErr   string
	}{
		{name: "a plugin", config: `{"type":"bridge","ipam":{"type":"whereabouts","range":"10.0.0.0/24"}}`, wantPools: []string{"10.0.0.0-24"}},
		{name: "a conflist", config: `{"plugins":[{"type":"bridge","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24"}},{"type":"tuning"}]}`, wantPools: []string{"10.0.0.0-24"}},
		{name: "another IPAM, unread", config: `{"type":"bridge","ipam":{"type":"host-local","range":"not a range"}}`},
		{name: "no IPAM", config: `{"type":"macvlan"}`},
		{name: "not JSON", config: `{"type":`, wantErr: "network config"},
		{name: "a broken whereabouts range", config: `{"ipam":{"type":"whereabouts","range":"10.0.0.0/33"}}`, wantErr: `range "10.0.0.0/33"`},
		{name: "a bad range_start", config: `{"ipam":{"type":"whereabouts","range":"10.0.0.0/24","range_start":"x"}}`, wantErr: `range_start "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ipams, err := NetworkIPAMs([]byte(tt.config))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var pools []string
			for _, i := range ipams {
				for _, r := range i.Ranges {
					pools = append(pools, r.Pool)
				}
			}
			assert.Equal(t, tt.wantPools, pools)
		})
	}
}
