package audit

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// bigSnapshot is 1,000 Longhorn pods, each on 10 networks (a /18 pool of
// each): 10,000 entries, 10,000 reservations, all in agreement.
func bigSnapshot(tb testing.TB) Snapshot {
	const pods, nets = 1000, 10
	s := Snapshot{PoolNamespace: "kube-system", Nodes: 100}
	type att struct {
		nad string
		ip  string
	}
	status := make([][]att, pods)
	for n := 0; n < nets; n++ {
		rng := fmt.Sprintf("10.%d.0.0/18", n)
		netName := fmt.Sprintf("net%d", n)
		s.NADs = append(s.NADs, nad("harvester-system/"+netName, rng, map[string]any{"network_name": netName}))
		p := pool(names.Pool(rng, netName), rng)
		first, _, _ := net.ParseCIDR(rng)
		for i := 0; i < pods; i++ {
			off := strconv.Itoa(i + 1)
			ref := fmt.Sprintf("longhorn-system/instance-manager-%d", i)
			p.Spec.Allocations[off] = shim.IPAllocation{PodRef: ref, ContainerID: fmt.Sprintf("c%d", i), IfName: "lhnet1"}
			ip, err := shim.OffsetIP(first, off)
			require.NoError(tb, err)
			s.Reservations = append(s.Reservations, orip(names.Reservation(ip, netName), ref))
			status[i] = append(status[i], att{nad: "harvester-system/" + netName, ip: ip.String()})
		}
		s.Pools = append(s.Pools, p)
	}
	for i := 0; i < pods; i++ {
		var asks, st []map[string]any
		for _, a := range status[i] {
			asks = append(asks, map[string]any{"namespace": "harvester-system", "name": a.nad[len("harvester-system/"):], "interface": "lhnet1"})
			st = append(st, map[string]any{"name": a.nad, "interface": "lhnet1", "ips": []string{a.ip}})
		}
		ab, _ := json.Marshal(asks)
		sb, _ := json.Marshal(st)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: fmt.Sprintf("instance-manager-%d", i),
			Labels:      map[string]string{componentLabel: instanceManager},
			Annotations: map[string]string{NetworksAnnotation: string(ab), reconcile.NetworkStatusAnnotation: string(sb)}}}
		p.Status.Phase = corev1.PodRunning
		s.Pods = append(s.Pods, p)
	}
	return s
}

// TestBigSnapshotIsHealthy: the benchmark judges a world in agreement.
func TestBigSnapshotIsHealthy(t *testing.T) {
	r := Judge(bigSnapshot(t), Options{})
	require.Empty(t, r.Findings)
	require.Len(t, r.Figures, 10)
	require.Equal(t, Figures{Network: "harvester-system/net0", Free: 16382 - 1000, Need: 1000}, r.Figures[0])
}

// BenchmarkJudge is a look at 10,000 entries and 1,000 pods.
func BenchmarkJudge(b *testing.B) {
	s := bigSnapshot(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if r := Judge(s, Options{}); len(r.Findings) != 0 {
			b.Fatal(r.Findings[0].Message)
		}
	}
}
