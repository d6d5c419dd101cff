package main

import (
	"context"
	"fmt"
	"testing"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	wbfake "github.com/k8snetworkplumbingwg/whereabouts/pkg/generated/clientset/versioned/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// The large pool's earlier sandbox is planted beside the live entries, never
// over one: an overwritten entry leaves its ORIP behind, and whereabouts then
// fails on that address at every later ADD of the pool (the 2.3x of an
// earlier run of the bench).
func TestPlantNeverOverwritesAnEntry(t *testing.T) {
	live := whereaboutsv1alpha1.IPAllocation{ContainerID: "live", PodRef: "longhorn-system/big-quiet-08", IfName: "lhnet1"}
	wb := wbfake.NewSimpleClientset(&whereaboutsv1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: testcni.PoolNamespace},
		Spec:       whereaboutsv1alpha1.IPPoolSpec{Range: "10.64.0.0/16", Allocations: map[string]whereaboutsv1alpha1.IPAllocation{"5": live}},
	})
	b := &bencher{rig: &testcni.Rig{WB: wb}}
	planted := whereaboutsv1alpha1.IPAllocation{ContainerID: "dead", PodRef: "longhorn-system/crashy-00", IfName: "lhnet0"}
	ctx := context.Background()

	if _, err := b.plant(ctx, "p", "5", planted); err == nil {
		t.Errorf("planting over the live entry at offset 5: no error")
	}
	if _, err := b.plant(ctx, "p", "6", planted); err != nil {
		t.Fatalf("planting at the free offset 6: %v", err)
	}
	p, err := wb.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Spec.Allocations["5"]; got != live {
		t.Errorf("offset 5 = %+v, want the live entry %+v", got, live)
	}
	if got := p.Spec.Allocations["6"]; got != planted {
		t.Errorf("offset 6 = %+v, want the planted entry %+v", got, planted)
	}
}

// Over n! sandboxes every side runs at every place, and right after every
// other side, equally often: no side's ratio carries another side's
// aftermath more than the rest do.
func TestOrderBalancesPlaceAndPredecessor(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		sides := []int{0, 1, 2, 3}[:n]
		runs := 1
		for k := 2; k <= n; k++ {
			runs *= k
		}
		place := map[[2]int]int{} // {side, place}
		after := map[[2]int]int{} // {side, the side just before it in its sandbox}
		seen := map[string]bool{}
		for i := 0; i < runs; i++ {
			o := order(i, sides...)
			if len(o) != n {
				t.Fatalf("n=%d: order(%d) = %v, want every side once", n, i, o)
			}
			seen[fmt.Sprint(o)] = true
			for p, s := range o {
				place[[2]int{s, p}]++
				if p > 0 {
					after[[2]int{s, o[p-1]}]++
				}
			}
		}
		if len(seen) != runs {
			t.Errorf("n=%d: %d sandboxes saw %d orders, want all %d", n, runs, len(seen), runs)
		}
		for _, s := range sides {
			for _, x := range sides {
				if got, want := place[[2]int{s, x}], runs/n; got != want {
					t.Errorf("n=%d: side %d ran at place %d %d times, want %d", n, s, x, got, want)
				}
				if s == x {
					continue
				}
				if got, want := after[[2]int{s, x}], runs/n; got != want {
					t.Errorf("n=%d: side %d ran right after side %d %d times, want %d", n, s, x, got, want)
				}
			}
		}
	}
}
