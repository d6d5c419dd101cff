package shim_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// Assign writes on the pool as its base was read, or not at all: a handed-
// over entry (whose patch replaces only its container ID) that changed hands
// since the base was read is another pod's now, and stays so; an added
// offset someone filled meanwhile is theirs.
func TestAssignWritesNothingOnAStaleBase(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		as   shim.Assignment
	}{
		{"a hand-over of an entry that changed hands", shim.Assignment{Offset: "2", Rewrite: true,
			Entry: alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}},
		{"an added offset filled meanwhile", shim.Assignment{Offset: "3",
			Entry: alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.New()
			api.Put(fake.NewPool("10.0.0.0-24", "10.0.0.0/24", map[string]alloc{
				"2": {ContainerID: "old", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}))
			s := shim.New(api, ns, shim.Options{})
			base, err := s.Pool(ctx, "10.0.0.0-24")
			require.NoError(t, err)

			// Meanwhile the pod's old entry is released and the address
			// given to another pod, and the next one too.
			p := api.Pool(ns, "10.0.0.0-24")
			p.Spec.Allocations = map[string]alloc{
				"2": {ContainerID: "other", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
				"3": {ContainerID: "third", PodRef: "longhorn-system/im-c", IfName: "lhnet1"},
			}
			_, err = api.UpdatePool(ns, p)
			require.NoError(t, err)

			_, err = s.Assign(ctx, base, []shim.Assignment{tc.as})
			require.Error(t, err)
			assert.True(t, shim.IsConflict(err), "a conflict the caller reads fresh after: %v", err)
			assert.Equal(t, p.Spec.Allocations, api.Pool(ns, "10.0.0.0-24").Spec.Allocations, "nothing written")
		})
	}
}

// Reserve's create finds the reservation there (AlreadyExists), and before
// its read the holder deletes it (an earlier sandbox's release, whereabouts'
// DEL, its pod controller): the address is free, and lowest-free allocation
// makes a just-freed address the next one chosen. Reserve creates it again
// instead of failing the ADD; one that comes back for another pod is
// returned as that pod's.
func TestReserveCreatesAgainAReservationDeletedUnderIt(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		comesTo string // "" stays deleted; else recreated for that pod before the next create
		want    string // the pod holding it after Reserve
		existed bool
	}{
		{"deleted for good", "", "longhorn-system/im-a", false},
		{"taken again by another pod", "longhorn-system/other", "longhorn-system/other", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.New()
			api.Put(fake.NewReservation("10.0.0.2", "longhorn-system/old"))
			creates := 0
			api.Hook = func(c *fake.Call) error {
				if c.Resource != fake.Reservations {
					return nil
				}
				switch {
				case c.Verb == "create":
					creates++
				case c.Verb == "get" && creates == 1:
					api.Remove(fake.Reservations, "kube-system", "10.0.0.2")
					if tc.comesTo != "" {
						api.Put(fake.NewReservation("10.0.0.2", tc.comesTo))
					}
				}
				return nil
			}
			s := shim.New(api, "kube-system", shim.Options{})
			existing, err := s.Reserve(ctx, "10.0.0.2", shim.ReservationSpec{ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"})
			require.NoError(t, err)
			assert.Equal(t, tc.existed, existing != nil)
			got, err := api.GetReservation(ctx, "kube-system", "10.0.0.2")
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Spec.PodRef)
		})
	}
}
