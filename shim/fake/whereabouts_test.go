package fake_test

import (
	"context"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// quick is a clock whose waits return at once: the Lease is never held by
// another here.
type quick struct{}

func (quick) Now() time.Time                                   { return time.Now() }
func (quick) Sleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// held lists each pool's entries as "pool offset container/ifname" and
// each reservation as "reservation podref", sorted.
func held(api *fake.API) []string {
	var out []string
	for _, p := range api.AllPools("kube-system") {
		for off, a := range p.Spec.Allocations {
			out = append(out, p.Name+" "+off+" "+a.ContainerID+"/"+a.IfName)
		}
	}
	for _, o := range api.AllReservations("kube-system") {
		out = append(out, o.Name+" "+o.Spec.PodRef)
	}
	sort.Strings(out)
	return out
}

// A config of several ranges (range, then ipRanges, as whereabouts'
// loader orders them) is whereabouts' IPManagement over each in turn, in
// one turn under its Lease: an address and a reservation in each on ADD;
// on DEL, each range's entry and reservation until the first range
// without the container's entry, where whereabouts stops.
func TestWhereaboutsAllocatesInEveryRange(t *testing.T) {
	dual := fake.Request{ContainerID: "c1", IfName: "net1", PodRef: "ns/a", Range: "10.0.3.0/28", Exclude: []string{"10.0.3.1/32"},
		IPRanges: []fake.Range{{Range: "fd00:5::/120"}}}
	for _, tt := range []struct {
		name    string
		version string
		before  []any
		req     fake.Request
		// unheld is an entry removed by hand between ADD and DEL: pool and offset.
		unheld  [2]string
		wantIPs []string
		// unreserved are what Unreserved is told.
		unreserved []string
		afterAdd   []string
		afterDel   []string
	}{
		{name: "range and ipRanges: an address and a reservation in each", version: fake.V093, req: dual,
			wantIPs:  []string{"10.0.3.2", "fd00:5::1"},
			afterAdd: []string{"10.0.3.0-28 2 c1/net1", "10.0.3.2 ns/a", "fd00-5---120 1 c1/net1", "fd00-5--1 ns/a"}},
		{name: "ipRanges alone, reservations off: none made or deleted", version: fake.V080,
			req: fake.Request{ContainerID: "c1", IfName: "net1", PodRef: "ns/a", NetworkName: "dual", NoOverlapping: true,
				IPRanges: []fake.Range{{Range: "10.0.5.0/28"}, {Range: "fd00:5::/120"}}},
			before:   []any{fake.NewReservation("dual-10.0.5.1", "ns/other")},
			wantIPs:  []string{"10.0.5.1", "fd00:5::1"},
			afterAdd: []string{"dual-10.0.5.0-28 1 c1/net1", "dual-10.0.5.1 ns/other", "dual-fd00-5---120 1 c1/net1"},
			afterDel: []string{"dual-10.0.5.1 ns/other"}},
		{name: "DEL stops at the first range without the container's entry", version: fake.V093, req: dual,
			unheld:   [2]string{"10.0.3.0-28", "2"},
			wantIPs:  []string{"10.0.3.2", "fd00:5::1"},
			afterAdd: []string{"10.0.3.0-28 2 c1/net1", "10.0.3.2 ns/a", "fd00-5---120 1 c1/net1", "fd00-5--1 ns/a"},
			afterDel: []string{"10.0.3.2 ns/a", "fd00-5---120 1 c1/net1", "fd00-5--1 ns/a"}},
		// skipOverlappingRangeUpdate is one variable for every range: the
		// first range hands the pod its entry back, its reservation the
		// pod's, and the second range's new address gets none.
		{name: "the pod's own reservation in the first range skips the second's", version: fake.V093, req: dual,
			before: []any{fake.NewPool("10.0.3.0-28", "10.0.3.0/28", map[string]shim.IPAllocation{"5": {ContainerID: "c0", PodRef: "ns/a", IfName: "net1"}}),
				fake.NewReservation("10.0.3.5", "ns/a")},
			wantIPs: []string{"10.0.3.5", "fd00:5::1"}, unreserved: []string{"fd00:5::1"},
			afterAdd: []string{"10.0.3.0-28 5 c1/net1", "10.0.3.5 ns/a", "fd00-5---120 1 c1/net1"}},
		// v0.7.0 hands nothing back, and skips an address reserved for
		// anyone: each range reserves its own.
		{name: "v0.7.0: every range reserves", version: fake.V070, req: dual,
			before: []any{fake.NewPool("10.0.3.0-28", "10.0.3.0/28", map[string]shim.IPAllocation{"5": {ContainerID: "c0", PodRef: "ns/a"}}),
				fake.NewReservation("10.0.3.5", "ns/a")},
			wantIPs:  []string{"10.0.3.2", "fd00:5::1"},
			afterAdd: []string{"10.0.3.0-28 2 c1/", "10.0.3.0-28 5 c0/", "10.0.3.2 ns/a", "10.0.3.5 ns/a", "fd00-5---120 1 c1/", "fd00-5--1 ns/a"},
			afterDel: []string{"10.0.3.0-28 5 c0/", "10.0.3.5 ns/a"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			api := fake.New()
			api.Put(tt.before...)
			var unreserved []string
			wb := &fake.Whereabouts{API: api, Version: tt.version, Namespace: "kube-system", Options: shim.Options{Clock: quick{}, LeaseRetry: time.Millisecond},
				Unreserved: func(ip net.IP) { unreserved = append(unreserved, ip.String()) }}
			ips, err := wb.AddAll(ctx, tt.req)
			require.NoError(t, err)
			var got []string
			for _, ip := range ips {
				got = append(got, ip.String())
			}
			assert.Equal(t, tt.wantIPs, got)
			assert.Equal(t, tt.unreserved, unreserved, "the addresses whereabouts' ADD left without their reservation")
			assert.Equal(t, tt.afterAdd, held(api), "after ADD")
			if tt.unheld[0] != "" {
				p := api.Pool("kube-system", tt.unheld[0])
				delete(p.Spec.Allocations, tt.unheld[1])
				_, err := api.UpdatePool("kube-system", p)
				require.NoError(t, err)
			}
			wb.Del(ctx, tt.req)
			assert.Equal(t, tt.afterDel, held(api), "after DEL")
		})
	}
}
