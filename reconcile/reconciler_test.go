package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// cluster is an in-memory Cluster.
type cluster struct {
	pods   map[string]*corev1.Pod
	nodes  map[string]bool
	events []*corev1.Event
	// beforePod runs before a fresh GET of a pod: the world changing between
	// the pass's list and its fresh look.
	beforePod func(ref string)
	down      bool
	// nads are the NADs; nadErr, when set, fails their list.
	nads   []NAD
	nadErr error
	// nadLists counts the NAD lists.
	nadLists int
}

// storageNAD is Harvester's storage-network NAD, naming the fixture's pool.
var storageNAD = NAD{Namespace: "harvester-system", Name: "storagenetwork-sg8d8",
	Config: `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":50,` +
		`"ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2/32"]}}`}

func newCluster(pods ...*corev1.Pod) *cluster {
	c := &cluster{pods: map[string]*corev1.Pod{}, nodes: map[string]bool{"node-a": true}, nads: []NAD{storageNAD}}
	for _, p := range pods {
		c.pods[p.Namespace+"/"+p.Name] = p
	}
	return c
}

func (c *cluster) Pods(_ context.Context, ns string, want func(string) bool) ([]corev1.Pod, error) {
	if c.down {
		return nil, errors.New("list pods: connection refused")
	}
	var out []corev1.Pod
	for _, p := range c.pods {
		if p.Namespace == ns && (want == nil || want(p.Name)) {
			out = append(out, *p.DeepCopy())
		}
	}
	return out, nil
}

func (c *cluster) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if c.beforePod != nil {
		c.beforePod(ns + "/" + name)
	}
	if p, ok := c.pods[ns+"/"+name]; ok {
		return p.DeepCopy(), nil
	}
	return nil, nil
}

func (c *cluster) Nodes(context.Context) ([]string, error) {
	var out []string
	for n := range c.nodes {
		out = append(out, n)
	}
	return out, nil
}

func (c *cluster) Node(_ context.Context, name string) (bool, error) { return c.nodes[name], nil }

func (c *cluster) NADs(context.Context) ([]NAD, error) {
	c.nadLists++
	if c.nadErr != nil {
		return nil, c.nadErr
	}
	return append([]NAD(nil), c.nads...), nil
}

func (c *cluster) Event(_ context.Context, ev *corev1.Event) error {
	c.events = append(c.events, ev)
	return nil
}

type fixture struct {
	r   *Reconciler
	api *fake.API
	c   *cluster
	now time.Time
}

const poolName = "192.168.50.0-24"

func newFixture(t *testing.T, pods ...*corev1.Pod) *fixture {
	api := fake.New()
	api.Put(
		fake.NewPool(poolName, "192.168.50.0/24", map[string]alloc{
			"4": {ContainerID: "dead", PodRef: lh + "/gone", IfName: "lhnet1"},
			"5": {ContainerID: "live", PodRef: lh + "/running", IfName: "lhnet1"},
		}),
		fake.NewReservation("192.168.50.4", lh+"/gone"),
		fake.NewReservation("192.168.50.5", lh+"/running"),
		fake.NewReservation("192.168.50.9", lh+"/leftover"),
	)
	f := &fixture{api: api, c: newCluster(pods...), now: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
	store := shim.New(api, "kube-system", shim.Options{Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2}})
	f.r = &Reconciler{Store: store, Cluster: f.c, Grace: 10 * time.Minute, Now: func() time.Time { return f.now }}
	return f
}

func (f *fixture) pool() *shim.Pool { return f.api.Pool("kube-system", poolName) }

func (f *fixture) orips() []string {
	var names []string
	for _, o := range f.api.AllReservations("kube-system") {
		names = append(names, o.Name)
	}
	return names
}

func running() *corev1.Pod {
	return pod(lh, "running", corev1.PodRunning, "node-a", status("192.168.50.5"))
}

func TestPassWaitsForTheGracePeriod(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()

	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "first sighting: nothing released")
	assert.Len(t, rep.Rows, 2, "the dead pod's allocation and the leftover reservation")
	seen := decodeSightings(f.pool().Annotations[StaleSinceAnnotation])
	assert.Equal(t, sightings{"4": {holder: holderOf("dead"), since: f.now}}, seen)
	// The holder is kept short, whatever the container ID's length, so that
	// the annotation's budget holds thousands of sightings.
	assert.Regexp(t, `^v2;\d+:4\.[0-9a-f]{8}$`, f.pool().Annotations[StaleSinceAnnotation])
	assert.Len(t, f.pool().Spec.Allocations, 2)

	f.now = f.now.Add(9 * time.Minute)
	rep, err = f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "within the grace period")
	assert.Equal(t, "wait 1m0s", row(t, rep, "allocation").Action)

	f.now = f.now.Add(2 * time.Minute)
	rep, err = f.r.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Released, 1)
	assert.Equal(t, "192.168.50.4", rep.Released[0].IP.String())
	assert.Equal(t, []string{"192.168.50.4"}, rep.ReleasedORIPs)
	assert.Equal(t, []string{"192.168.50.9"}, rep.DeletedORIPs, "the leftover reservation's grace is over too")
	assert.Equal(t, map[string]alloc{"5": {ContainerID: "live", PodRef: lh + "/running", IfName: "lhnet1"}}, f.pool().Spec.Allocations)
	assert.Equal(t, []string{"192.168.50.5"}, f.orips())
	assert.NotContains(t, f.pool().Annotations, StaleSinceAnnotation, "nothing left to remember")
	require.Len(t, f.c.events, 2)
	assert.Equal(t, "StaleAllocationReleased", f.c.events[0].Reason)
	assert.Contains(t, f.c.events[0].Message, "released 192.168.50.4 of pod longhorn-system/gone (container dead, ifname \"lhnet1\"), reservation 192.168.50.4 deleted")
	assert.Equal(t, "OrphanedReservationDeleted", f.c.events[1].Reason)
	require.Len(t, rep.Stats, 1)
	assert.Equal(t, PoolStats{Pool: poolName, Range: "192.168.50.0/24", Allocated: 1, Stale: 0,
		Usage: Usage{Size: big.NewInt(252), InUse: 1, Free: big.NewInt(251), NAD: "harvester-system/storagenetwork-sg8d8"}}, rep.Stats[0],
		"the figures after the release, the NAD's excludes not counted")
}

// The world changed between the pass's list and its release: the pod came
// back to Running (issue 15: the fresh look).
func TestPassKeepsWhatCameBackToLife(t *testing.T) {
	f := newFixture(t, running())
	f.r.Grace = 0
	f.c.beforePod = func(ref string) {
		if ref == lh+"/gone" {
			f.c.pods[ref] = pod(lh, "gone", corev1.PodRunning, "node-a", status("192.168.50.4"))
		}
	}
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Released)
	assert.Equal(t, "kept: live on a fresh look", row(t, rep, "allocation").Action)
	assert.Len(t, f.pool().Spec.Allocations, 2)
	assert.Contains(t, f.orips(), "192.168.50.4")
}

// An entry that changed hands (another container of the gone pod took the
// offset) starts its grace again (issue 15).
func TestSightingRestartsWhenTheEntryChangesHands(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()
	_, err := f.r.Pass(ctx)
	require.NoError(t, err)
	f.now = f.now.Add(9 * time.Minute)
	p := f.pool()
	p.Spec.Allocations["4"] = alloc{ContainerID: "dead-too", PodRef: lh + "/gone", IfName: "lhnet1"}
	_, err = f.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	f.now = f.now.Add(2 * time.Minute)
	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "another holder: its grace starts now")
	assert.Equal(t, f.now, decodeSightings(f.pool().Annotations[StaleSinceAnnotation])["4"].since)
}

// The sightings are written as every pool write is: a guarded patch, and
// computed again when the pool changed under it (issue 15).
func TestSightingsAreAGuardedWrite(t *testing.T) {
	f := newFixture(t, running())
	var patches []shim.Patch
	raced := false
	f.api.Hook = func(c *fake.Call) error {
		if c.Verb == "patch" && c.Resource == fake.Pools {
			patches = append(patches, c.Patch)
			if !raced {
				raced = true
				p := f.pool()
				p.Spec.Allocations["6"] = alloc{ContainerID: "dead2", PodRef: lh + "/gone2"}
				_, err := f.api.UpdatePool("kube-system", p)
				require.NoError(t, err)
			}
		}
		return nil
	}
	_, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, patches, 2, "the first failed its test and was made again")
	for _, p := range patches {
		assert.Equal(t, "test", p.Ops()[0].Op)
		assert.Equal(t, "/metadata/resourceVersion", p.Ops()[0].Path)
	}
	assert.NotEqual(t, patches[0].ResourceVersion(), patches[1].ResourceVersion())
	assert.Contains(t, decodeSightings(f.pool().Annotations[StaleSinceAnnotation]), "4")
}

func TestDryRunChangesNothing(t *testing.T) {
	f := newFixture(t, running())
	f.r.DryRun = true
	f.r.Grace = 0
	var writes []string
	f.api.Hook = func(c *fake.Call) error {
		if c.Verb != "get" && c.Verb != "list" {
			writes = append(writes, c.Verb+" "+c.Resource)
		}
		return nil
	}
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, writes)
	assert.Empty(t, f.c.events)
	require.Len(t, rep.Rows, 2)
	assert.Equal(t, "would release", row(t, rep, "allocation").Action)
	assert.Equal(t, "would delete", row(t, rep, "reservation").Action)
}

func row(t *testing.T, rep *Report, kind string) Row {
	t.Helper()
	for _, r := range rep.Rows {
		if r.Kind == kind {
			return r
		}
	}
	t.Fatalf("no %s row in %+v", kind, rep.Rows)
	return Row{}
}

// A leftover reservation that an allocation backs again before its grace is
// over is kept; one backed again between the pass's look and the delete is
// kept too: the judgement is made again under whereabouts' Lease.
func TestOrphanedReservations(t *testing.T) {
	f := newFixture(t, running())
	f.r.Grace = 0
	f.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Leases && c.Verb == "create" {
			// whereabouts allocated .9 to the leftover's pod meanwhile.
			p := f.pool()
			p.Spec.Allocations["9"] = alloc{ContainerID: "back", PodRef: lh + "/leftover", IfName: "lhnet1"}
			_, err := f.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
		}
		return nil
	}
	f.c.pods[lh+"/leftover"] = pod(lh, "leftover", corev1.PodRunning, "node-a", status("192.168.50.9"))
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.DeletedORIPs)
	assert.Contains(t, f.orips(), "192.168.50.9")
}

func TestOrphanSightingsComeAndGo(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()
	_, err := f.r.Pass(ctx)
	require.NoError(t, err)
	o := f.api.AllReservations("kube-system")[2]
	require.Equal(t, "192.168.50.9", o.Name)
	assert.Equal(t, f.now.Format(time.RFC3339), o.Annotations[OrphanSinceAnnotation])
	p := f.pool()
	p.Spec.Allocations["9"] = alloc{ContainerID: "back", PodRef: lh + "/leftover"}
	_, err = f.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	f.c.pods[lh+"/leftover"] = pod(lh, "leftover", corev1.PodRunning, "node-a", status("192.168.50.9"))
	_, err = f.r.Pass(ctx)
	require.NoError(t, err)
	o = f.api.AllReservations("kube-system")[2]
	assert.NotContains(t, o.Annotations, OrphanSinceAnnotation, "backed again: forgotten")
}

// Hole 6: thousands of stale entries. Their sightings fit the API server's
// limit on annotations; past the budget, entries are sighted once earlier
// ones are released; every one is released in the end.
func TestThousandsOfStaleEntries(t *testing.T) {
	for _, n := range []int{5000, 12000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			api := fake.New()
			allocs := map[string]alloc{}
			for i := 0; i < n; i++ {
				allocs[strconv.Itoa(10+i)] = alloc{ContainerID: fmt.Sprintf("dead%060d", i), PodRef: fmt.Sprintf("%s/gone-%05d", lh, i), IfName: "lhnet1"}
			}
			api.Put(fake.NewPool("10.0.0.0-16", "10.0.0.0/16", allocs))
			now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
			c := newCluster()
			r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: c, Grace: time.Minute, Now: func() time.Time { return now }}
			passes := 0
			for len(api.Pool("kube-system", "10.0.0.0-16").Spec.Allocations) > 0 {
				passes++
				require.Less(t, passes, 20, "every entry is released in the end")
				rep, err := r.Pass(context.Background())
				require.NoError(t, err)
				require.Empty(t, rep.Errors)
				assert.LessOrEqual(t, len(api.Pool("kube-system", "10.0.0.0-16").Annotations[StaleSinceAnnotation]), maxSightingBytes)
				now = now.Add(time.Minute)
			}
			t.Logf("%d stale entries: released in %d passes", n, passes)
			assert.LessOrEqual(t, len(c.events), maxEvents*passes, "Events are bounded")
		})
	}
}

func TestAPassThatCannotReadFails(t *testing.T) {
	f := newFixture(t, running())
	f.c.down = true
	_, err := f.r.Pass(context.Background())
	assert.ErrorContains(t, err, "connection refused")
	f.c.down = false
	f.api.Hook = func(c *fake.Call) error {
		if c.Verb == "list" && c.Resource == fake.Pools {
			return errors.New("dial tcp: connection refused")
		}
		return nil
	}
	_, err = f.r.Pass(context.Background())
	assert.ErrorContains(t, err, "list pools in kube-system")
}

// The report's rows are in pool order, then address order (as strings), the
// reservations' rows (pool "-") first, whatever order the pass made them in.
func TestPassRowsAreInPoolThenAddressOrder(t *testing.T) {
	f := newFixture(t, running())
	f.api.Put(fake.NewPool("10.9.0.0-24", "10.9.0.0/24", map[string]alloc{
		"8": {ContainerID: "d8", PodRef: lh + "/gone8", IfName: "lhnet1"},
		"3": {ContainerID: "d3", PodRef: lh + "/gone3", IfName: "lhnet1"},
	}))
	f.c.nads = append(f.c.nads, nadOf("h", "old", `{"type":"whereabouts","range":"10.9.0.0/24"}`))
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	var got []string
	for _, r := range rep.Rows {
		got = append(got, r.Pool+" "+r.IP)
	}
	assert.Equal(t, []string{"- 192.168.50.9", "10.9.0.0-24 10.9.0.3", "10.9.0.0-24 10.9.0.8", poolName + " 192.168.50.4"}, got)
}

// A dry run shows when each stale entry was first seen as the pass before
// recorded it, and no time for an entry seen for the first time (a dry run
// records nothing).
func TestDryRunShowsOnlyRecordedSightings(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()
	_, err := f.r.Pass(ctx)
	require.NoError(t, err)
	first := f.now
	p := f.pool()
	p.Spec.Allocations["6"] = alloc{ContainerID: "dead6", PodRef: lh + "/gone6", IfName: "lhnet1"}
	_, err = f.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
	f.now = f.now.Add(3 * time.Minute)
	f.r.DryRun = true
	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	since := map[string]time.Time{}
	for _, r := range rep.Rows {
		if r.Kind == "allocation" {
			since[r.IP] = r.Since
		}
	}
	assert.Equal(t, map[string]time.Time{"192.168.50.4": first, "192.168.50.6": {}}, since)
}

// A pass with nothing to release or to record again reads each pool in the
// list it starts from (and the reservations' judgement lists them again), and
// writes nothing: the requests a quiet cluster costs each minute.
func TestAQuietPassOnlyLists(t *testing.T) {
	f := newFixture(t, running())
	ctx := context.Background()
	_, err := f.r.Pass(ctx)
	require.NoError(t, err)
	var calls []string
	f.api.Hook = func(c *fake.Call) error {
		calls = append(calls, c.Verb+" "+c.Resource)
		return nil
	}
	f.now = f.now.Add(time.Minute)
	rep, err := f.r.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Released)
	assert.Equal(t, []string{"list " + fake.Pools, "list " + fake.Reservations, "list " + fake.Pools}, calls)
}

// A write that fails is in the pass's errors, never dropped: the sighting of
// a leftover reservation, its forgetting, and its delete.
func TestPassReportsAFailedReservationWrite(t *testing.T) {
	// Only the leftover reservation's writes fail: not the release of the
	// dead pod's entry, which deletes its own reservation.
	fail := func(f *fixture, verb string) {
		f.api.Hook = func(c *fake.Call) error {
			if c.Verb == verb && c.Resource == fake.Reservations && c.Name == "192.168.50.9" {
				return errors.New("etcdserver: request timed out")
			}
			return nil
		}
	}
	// failedPass runs a pass whose one error is the failed write.
	failedPass := func(t *testing.T, f *fixture) {
		t.Helper()
		rep, err := f.r.Pass(context.Background())
		require.NoError(t, err)
		require.Len(t, rep.Errors, 1)
		assert.ErrorContains(t, rep.Errors[0], "etcdserver: request timed out")
	}
	t.Run("recording the sighting", func(t *testing.T) {
		f := newFixture(t, running())
		fail(f, "patch")
		failedPass(t, f)
	})
	t.Run("forgetting it once backed again", func(t *testing.T) {
		f := newFixture(t, running())
		_, err := f.r.Pass(context.Background())
		require.NoError(t, err)
		p := f.pool()
		p.Spec.Allocations["9"] = alloc{ContainerID: "back", PodRef: lh + "/leftover", IfName: "lhnet1"}
		_, err = f.api.UpdatePool("kube-system", p)
		require.NoError(t, err)
		f.c.pods[lh+"/leftover"] = pod(lh, "leftover", corev1.PodRunning, "node-a", status("192.168.50.9"))
		fail(f, "patch")
		failedPass(t, f)
	})
	t.Run("the delete", func(t *testing.T) {
		f := newFixture(t, running())
		f.r.Grace = 0
		fail(f, "delete")
		failedPass(t, f)
		assert.Equal(t, []string{"192.168.50.5", "192.168.50.9"}, f.orips(), "the dead pod's released, the leftover not deleted")
	})
}

// Sightings that fill the budget to the byte are all written: only one that
// does not fit waits.
func TestSightingsFillTheBudgetExactly(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	group := len(";" + strconv.FormatInt(t0.Unix(), 10) + ":")
	// "v2", the group, then items "OFFSET.HOLDER" joined by commas: a five-digit
	// offset is 14 bytes and its comma, a six-digit one 15 and its comma.
	rest := maxSightingBytes - len("v2") - group + 1 // the first item has no comma
	six := 0
	for (rest-16*six)%15 != 0 {
		six++
	}
	five := (rest - 16*six) / 15
	s := sightings{}
	for i := 0; i < five; i++ {
		s[strconv.Itoa(10000+i)] = sighting{holder: "0123abcd", since: t0}
	}
	for i := 0; i < six; i++ {
		s[strconv.Itoa(100000+i)] = sighting{holder: "0123abcd", since: t0}
	}
	enc, left := s.encode()
	assert.Equal(t, maxSightingBytes, len(enc), "to the byte")
	assert.Empty(t, left)
	s["999999"] = sighting{holder: "0123abcd", since: t0}
	_, left = s.encode()
	assert.Equal(t, []string{"999999"}, left, "one more does not fit")
}

// What a pass says it does with each stale entry and reservation, through
// the grace period, with and without a dry run.
func TestThePassSaysWhatItDoes(t *testing.T) {
	type want struct{ alloc, orip string }
	for _, tt := range []struct {
		name   string
		grace  time.Duration
		dryRun bool
		passes []time.Duration // the clock before each pass, from the start
		want   []want          // the rows' actions, pass by pass
	}{
		{"grace 0: at once", 0, false, []time.Duration{0}, []want{{"release", "delete"}}},
		{"grace 0, dry run", 0, true, []time.Duration{0}, []want{{"would release", "would delete"}}},
		{"a grace: sighted, waited, released", 10 * time.Minute, false, []time.Duration{0, 4 * time.Minute, 10 * time.Minute},
			[]want{{"wait 10m0s", "wait 10m0s"}, {"wait 6m0s", "wait 6m0s"}, {"release", "delete"}}},
		{"a grace, dry run: nothing sighted", 10 * time.Minute, true, []time.Duration{0, 11 * time.Minute},
			[]want{{"wait 10m0s", "wait 10m0s"}, {"wait 10m0s", "wait 10m0s"}}},
		// The shortest grace is a grace: sighted first, released after.
		{"a grace of a nanosecond", time.Nanosecond, false, []time.Duration{0, time.Second},
			[]want{{"wait 0s", "wait 1ns"}, {"release", "delete"}}},
		{"a grace of a nanosecond, dry run", time.Nanosecond, true, []time.Duration{0},
			[]want{{"wait 0s", "wait 1ns"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, running())
			start := f.now
			f.r.Grace, f.r.DryRun = tt.grace, tt.dryRun
			for i, at := range tt.passes {
				f.now = start.Add(at)
				rep, err := f.r.Pass(context.Background())
				require.NoError(t, err)
				require.Empty(t, rep.Errors)
				a, o := row(t, rep, "allocation"), row(t, rep, "reservation")
				assert.Equal(t, tt.want[i], want{a.Action, o.Action}, "pass %d", i+1)
				if tt.dryRun {
					assert.True(t, a.Since.IsZero(), "a dry run records no sighting")
				} else if tt.grace > 0 {
					assert.Equal(t, start, a.Since)
					assert.Equal(t, start, o.Since)
				}
				assert.Equal(t, Row{Kind: "allocation", Pool: poolName, IP: "192.168.50.4", PodRef: lh + "/gone", Container: "dead", IfName: "lhnet1", Reason: PodGone, Since: a.Since, Action: a.Action}, a)
				assert.Equal(t, Row{Kind: "reservation", Pool: "-", IP: "192.168.50.9", PodRef: lh + "/leftover", Reason: OrphanedORIP, Since: o.Since, Action: o.Action}, o)
				assert.Equal(t, 3, rep.ORIPs)
				assert.Equal(t, 1, rep.Pools)
				assert.Equal(t, 2, rep.Allocations)
				assert.Equal(t, 2, rep.Candidates())
			}
			if tt.dryRun {
				assert.Len(t, f.pool().Spec.Allocations, 2)
				assert.Len(t, f.orips(), 3)
				assert.NotContains(t, f.pool().Annotations, StaleSinceAnnotation)
			}
			if last := tt.want[len(tt.want)-1]; last == (want{"release", "delete"}) {
				// Done as said: the one stale entry and the one leftover
				// reservation are gone, the live ones stay.
				assert.Equal(t, map[string]alloc{"5": {ContainerID: "live", PodRef: lh + "/running", IfName: "lhnet1"}}, f.pool().Spec.Allocations)
				assert.ElementsMatch(t, []string{"192.168.50.5"}, f.orips())
			}
		})
	}
}

// The pool's figures after a pass, for the metrics: the oldest stale entry's
// age counts only sightings recorded before.
func TestPoolStats(t *testing.T) {
	f := newFixture(t, running())
	start := f.now
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Stats, 1)
	st := rep.Stats[0]
	assert.Equal(t, poolName, st.Pool)
	assert.Equal(t, "192.168.50.0/24", st.Range)
	assert.Equal(t, "252", st.Size.String(), "the range without the NAD's two excludes")
	assert.Equal(t, 2, st.Allocated)
	assert.Equal(t, 1, st.Stale)
	assert.Equal(t, "250", st.Free.String())
	assert.Equal(t, storageNAD.Namespace+"/"+storageNAD.Name, st.NAD)
	assert.Zero(t, st.OldestStale, "first seen now")
	f.now = start.Add(3 * time.Minute)
	rep, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3*time.Minute, rep.Stats[0].OldestStale)
}

// A failed release is the pool's error in the report; the pass goes on.
func TestAFailedReleaseIsReported(t *testing.T) {
	f := newFixture(t, running())
	f.r.Grace = 0
	f.c.beforePod = func(string) {}
	fc := &failingPods{cluster: f.c}
	f.r.Cluster = fc
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Errors, 1)
	assert.ErrorContains(t, rep.Errors[0], "release stale entries of pool "+poolName+": get pod: refused")
	assert.Len(t, f.pool().Spec.Allocations, 2, "nothing released without the fresh look")
	assert.Equal(t, []string{"192.168.50.9"}, rep.DeletedORIPs, "the reservations are judged on")
}

// failingPods fails every fresh GET of a pod.
type failingPods struct{ *cluster }

func (failingPods) Pod(context.Context, string, string) (*corev1.Pod, error) {
	return nil, errors.New("get pod: refused")
}

// A dry run does not forget the sighting of a reservation backed again.
func TestADryRunKeepsOrphanSightings(t *testing.T) {
	f := newFixture(t, running())
	o := f.api.AllReservations("kube-system")[1]
	require.Equal(t, "192.168.50.5", o.Name)
	o.Annotations = map[string]string{OrphanSinceAnnotation: f.now.Format(time.RFC3339)}
	f.api.Put(&o)
	f.r.DryRun = true
	writes := 0
	f.api.Hook = func(c *fake.Call) error {
		if c.Verb != "get" && c.Verb != "list" {
			writes++
		}
		return nil
	}
	_, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, writes)
	assert.Contains(t, f.api.AllReservations("kube-system")[1].Annotations, OrphanSinceAnnotation)

	f.r.DryRun = false
	_, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.NotContains(t, f.api.AllReservations("kube-system")[1].Annotations, OrphanSinceAnnotation, "backed: forgotten")
}

// Past the sightings' budget, the entries left out say they wait for the
// ones recorded before; the ones the pass recorded say how long their grace
// has to run, on the pass that recorded them and on the next, which writes
// nothing. (Found by the mutation tests: every entry not recorded by an
// earlier pass said it waited, the 9,438 just recorded included.)
func TestOnlyEntriesPastTheBudgetSayTheyWait(t *testing.T) {
	api := fake.New()
	allocs := map[string]alloc{}
	for i := 0; i < 12000; i++ {
		allocs[strconv.Itoa(10+i)] = alloc{ContainerID: fmt.Sprintf("dead%060d", i), PodRef: fmt.Sprintf("%s/gone-%05d", lh, i), IfName: "lhnet1"}
	}
	api.Put(fake.NewPool("10.0.0.0-16", "10.0.0.0/16", allocs))
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Store: shim.New(api, "kube-system", shim.Options{}), Cluster: newCluster(), Grace: time.Minute, Now: func() time.Time { return now }}
	rep, err := r.Pass(context.Background())
	require.NoError(t, err)
	actions := map[string]int{}
	for _, row := range rep.Rows {
		actions[row.Action]++
	}
	recorded := len(decodeSightings(api.Pool("kube-system", "10.0.0.0-16").Annotations[StaleSinceAnnotation]))
	assert.Positive(t, recorded)
	assert.Less(t, recorded, 12000)
	assert.Equal(t, map[string]int{"wait 1m0s": recorded, "wait: sighted once the stale entries recorded before are released": 12000 - recorded}, actions)

	now = now.Add(20 * time.Second)
	rep, err = r.Pass(context.Background())
	require.NoError(t, err)
	actions = map[string]int{}
	for _, row := range rep.Rows {
		actions[row.Action]++
	}
	assert.Equal(t, map[string]int{"wait 40s": recorded, "wait: sighted once the stale entries recorded before are released": 12000 - recorded}, actions, "the next pass")
}

// A sighting is written on the pool as read fresh for the write: an entry
// that changed hands between the pass's list and that read (another
// container of the gone pod took the offset) is not recorded under the old
// holder, so its grace cannot have started before the new holder had it
// (issue 15).
func TestSightingIsForgottenWhenTheEntryChangesHandsUnderTheWrite(t *testing.T) {
	f := newFixture(t, running())
	moved := false
	f.api.Hook = func(c *fake.Call) error {
		if !moved && c.Verb == "get" && c.Resource == fake.Pools && c.From == shim.Fresh {
			moved = true
			p := f.pool()
			p.Spec.Allocations["4"] = alloc{ContainerID: "dead-too", PodRef: lh + "/gone", IfName: "lhnet1"}
			_, err := f.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
		}
		return nil
	}
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	require.True(t, moved, "the pass read the pool fresh to write its sightings")
	assert.Empty(t, rep.Released)
	seen := decodeSightings(f.pool().Annotations[StaleSinceAnnotation])
	assert.NotContains(t, seen, "4", "the sighting was of container dead, which no longer holds the entry")

	// The next pass sees the new holder and starts its grace then.
	f.api.Hook = nil
	_, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, sightings{"4": {holder: holderOf("dead-too"), since: f.now}}, decodeSightings(f.pool().Annotations[StaleSinceAnnotation]))
}

// A first sighting is recorded to the second, rounded up: a grace is never
// cut short by the rounding.
func TestSightingsAreRoundedUp(t *testing.T) {
	f := newFixture(t, running())
	f.now = f.now.Add(300 * time.Millisecond)
	_, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	since := decodeSightings(f.pool().Annotations[StaleSinceAnnotation])["4"].since
	assert.Equal(t, f.now.Truncate(time.Second).Add(time.Second), since)

	f.now = since.Add(f.r.Grace - time.Millisecond)
	rep, err := f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Released, "a millisecond short of the grace")
	f.now = since.Add(f.r.Grace)
	rep, err = f.r.Pass(context.Background())
	require.NoError(t, err)
	assert.Len(t, rep.Released, 1, "the grace is over")

	assert.Equal(t, f.now, ceilSecond(f.now), "a whole second stays")
}
