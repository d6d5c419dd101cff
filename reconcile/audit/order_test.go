package audit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// v6Range is the storage network's second range in dualStack.
const v6Range = "fd00:50::/64"

// dualStack is healthy() on a NAD of two ranges (range and ipRanges, as
// every dual-stack network has): each instance manager holds an address of
// each, with its reservations and its network-status.
func dualStack() (Snapshot, []podSpec) {
	s, pods := healthy()
	s.NADs[0] = nad(storage, "10.0.50.0/24", map[string]any{"ipRanges": []map[string]string{{"range": v6Range}}})
	v6 := pool(names.Pool(v6Range, ""), v6Range, "1="+lh+"/instance-manager-a#ca", "2="+lh+"/instance-manager-b#cb")
	s.Pools = append(s.Pools, v6)
	s.Reservations = append(s.Reservations, orip(names.Reservation(net.ParseIP("fd00:50::1"), ""), lh+"/instance-manager-a"),
		orip(names.Reservation(net.ParseIP("fd00:50::2"), ""), lh+"/instance-manager-b"))
	pods[0].status[storage] = []string{"10.0.50.1", "fd00:50::1"}
	pods[1].status[storage] = []string{"10.0.50.2", "fd00:50::2"}
	return s, pods
}

// shuffled is s with every list in another order (the order an informer
// store's List returns changes from look to look): the world is the same.
func shuffled(s Snapshot, r *rand.Rand) Snapshot {
	s.NADs = append([]reconcile.NAD(nil), s.NADs...)
	s.Pools = append([]shim.Pool(nil), s.Pools...)
	s.Reservations = append([]shim.Reservation(nil), s.Reservations...)
	s.Pods = append([]*corev1.Pod(nil), s.Pods...)
	r.Shuffle(len(s.NADs), func(i, j int) { s.NADs[i], s.NADs[j] = s.NADs[j], s.NADs[i] })
	r.Shuffle(len(s.Pools), func(i, j int) { s.Pools[i], s.Pools[j] = s.Pools[j], s.Pools[i] })
	r.Shuffle(len(s.Reservations), func(i, j int) { s.Reservations[i], s.Reservations[j] = s.Reservations[j], s.Reservations[i] })
	r.Shuffle(len(s.Pods), func(i, j int) { s.Pods[i], s.Pods[j] = s.Pods[j], s.Pods[i] })
	return s
}

// TestFindingKeyIgnoresListOrder is issue 44's first reproduction: a
// Running pod whose network-status names an address that is not its entry,
// on a NAD of two ranges, looked at with the pools listed in one order and
// then the other (as an informer's List returns them). The finding's key
// must not change with the order, or the Tracker forgets it at every look
// and it never opens.
func TestFindingKeyIgnoresListOrder(t *testing.T) {
	s, pods := dualStack()
	pods[1].status[storage] = []string{"10.0.50.9", "fd00:50::2"}
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	reversed := s
	reversed.Pools = []shim.Pool{s.Pools[1], s.Pools[0]}
	a, b := Judge(s, Options{}).Findings, Judge(reversed, Options{}).Findings
	require.Len(t, a, 1)
	require.Len(t, b, 1)
	assert.Equal(t, PodPoolMismatch, a[0].Kind)
	assert.Equal(t, a[0].Key(), b[0].Key(), "one finding, whatever the pools' order")

	tr := NewTracker(nil)
	var c Change
	for i := 0; i <= 4; i++ {
		look := s
		if i%2 == 1 {
			look = reversed
		}
		c = tr.Observe(t0.Add(time.Duration(i)*10*time.Second), Judge(look, Options{}).Findings)
	}
	require.Len(t, c.Open, 1, "open past its grace, the pools listed in either order at each look")
	assert.Equal(t, "10.0.50.9", c.Open[0].Address)
}

// TestJudgeIgnoresListOrder: every rule's inputs (NADs, pools,
// reservations, pods) shuffled between looks give the same findings, whole
// (key, message, command), and the same figures: a finding is a function of
// the world, not of the order a list returns it in.
func TestJudgeIgnoresListOrder(t *testing.T) {
	cases := judgeCases()
	// The dual-stack world, and what goes wrong on it.
	for _, c := range judgeCases() {
		c := c
		cases = append(cases, judgeCase{name: c.name + " (dual-stack)", change: func(s *Snapshot, pods []podSpec) []podSpec {
			d, dp := dualStack()
			if c.change != nil {
				dp = c.change(&d, dp)
			}
			*s = d
			return dp
		}})
	}
	cases = append(cases, judgeCase{name: "dual-stack: one address of two not the pod's entry", change: func(s *Snapshot, pods []podSpec) []podSpec {
		d, dp := dualStack()
		dp[1].status[storage] = []string{"10.0.50.9", "fd00:50::2"}
		*s = d
		return dp
	}})
	r := rand.New(rand.NewPCG(44, 1))
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.snapshot()
			want := Judge(s, Options{})
			for i := 0; i < 20; i++ {
				got := Judge(shuffled(s, r), Options{})
				require.Equal(t, describe(want.Findings), describe(got.Findings), "shuffle %d", i)
				require.Equal(t, want.Figures, got.Figures, "shuffle %d", i)
				require.Equal(t, want.Networks, got.Networks, "shuffle %d", i)
			}
		})
	}
}

// describe is every field of each finding, its key too.
func describe(fs []Finding) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s\n%s\n%s\n%+v", f.Key(), f.Message, f.Command, f))
	}
	return out
}
