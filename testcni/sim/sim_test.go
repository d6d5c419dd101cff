package sim

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/shim/fake"
)

// budget is how many seeds the test runs per whereabouts version, with node
// agents and without (HARVESTER_IPAM_SIM_SEEDS): a fixed budget, so that
// `make test` stays within its time; `make sim` runs for as long as it is
// given. A schedule with agents costs about 2.6 times one without.
func budget(t *testing.T) int {
	if v, err := strconv.Atoi(os.Getenv("HARVESTER_IPAM_SIM_SEEDS")); err == nil && v > 0 {
		return v
	}
	return 100
}

// The invariants hold in every schedule of the budget, on every version,
// with node agents (DefaultOptions) and without (the exec path alone, the
// stories of the seeds found before agents).
func TestSchedules(t *testing.T) {
	n := budget(t)
	for _, v := range []string{fake.V093, fake.V080, fake.V070} {
		for _, agents := range []bool{true, false} {
			name := "whereabouts " + v
			if !agents {
				name += " without agents"
			}
			t.Run(name, func(t *testing.T) {
				start := time.Now()
				stats := map[string]int{}
				for seed := uint64(1); seed <= uint64(n); seed++ {
					o := DefaultOptions(v)
					o.Agents = agents
					res, err := Run(seed, o)
					if err != nil {
						t.Fatal(err)
					}
					for k, c := range res.Stats {
						stats[k] += c
					}
					if len(res.Violations) > 0 {
						t.Fatalf("seed %d: %v\nreplay: go run ./tools/sim -seed %d -whereabouts %s -agents=%v -agent-groups=%v -trace\n%s\n%s",
							seed, res.Violations, seed, v, agents, agents, res.Trace, res.State)
					}
				}
				t.Logf("%d schedules in %s: %v", n, time.Since(start).Round(time.Millisecond), stats)
			})
		}
	}
}

// A seed replays exactly: the same trace, the same end.
func TestASeedReplays(t *testing.T) {
	a, err := Run(4242, DefaultOptions(fake.V070))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(4242, DefaultOptions(fake.V070))
	if err != nil {
		t.Fatal(err)
	}
	if a.Trace != b.Trace || a.State != b.State {
		t.Fatalf("seed 4242 played twice differently:\n%s\n---\n%s", a.Trace, b.Trace)
	}
	if len(a.Trace) < 200 {
		t.Fatalf("a trace of nothing: %q", a.Trace)
	}
}

// The checker is not blind: a world that frees a live attachment's entry
// behind everyone's back is caught, with the seed and the trace.
func TestTheCheckerCatchesAFreedLiveEntry(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.sabotage = true
	caught := 0
	for seed := uint64(1); seed <= 50; seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Violations) > 0 {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("50 schedules of a sabotaged world, no violation seen")
	}
}

// The Lease's checker is not blind: two holders planted inside one turn
// (whereabouts' binary in its turn while an agent's Group is in its own)
// are reported, each named.
func TestTheCheckerCatchesTwoHoldersInOneTurn(t *testing.T) {
	tr := &trace{}
	s := newSched(1, tr)
	tr.s = s
	w, err := newWorld(s, tr, DefaultOptions(fake.V093), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.check = w.checkLive
	var ends []func()
	never := func() bool { return false }
	s.spawn("whereabouts ADD", func(a *actor) {
		ends = append(ends, w.turn("longhorn-system/instance-manager-a"))
		a.waitFor(never)
	})
	s.spawn("agent 1 lease", func(a *actor) {
		a.sleep(time.Millisecond)
		ends = append(ends, w.turn("harvester-ipam-agent/node-1/pod-1/0123abcd"))
		a.waitFor(never)
	})
	if s.run(time.Time{}) {
		t.Fatal("two holders inside a turn at once, and the schedule ran on")
	}
	defer s.abandon()
	if len(s.violations) != 1 || !strings.Contains(s.violations[0], "two holders inside a turn") ||
		!strings.Contains(s.violations[0], "instance-manager-a") || !strings.Contains(s.violations[0], "agent 1 lease") {
		t.Fatalf("violations: %q", s.violations)
	}
	// One holder after the other is no violation.
	ends[0]()
	if bad := w.checkTurns(); len(bad) > 0 {
		t.Fatalf("one turn left, reported: %v", bad)
	}
}

// The Lease's checker sees the world's own holders: an operator who deletes
// whereabouts' Lease while a holder is inside its turn lets the next holder
// in, and the schedule is caught.
func TestTheCheckerCatchesTheLeaseDeletedUnderATurn(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.leaseDeletedByHand = true
	caught := 0
	for seed := uint64(1); seed <= 50; seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range res.Violations {
			if strings.Contains(v, "two holders inside a turn") {
				caught++
				break
			}
		}
	}
	if caught == 0 {
		t.Fatal("50 schedules with the Lease deleted under holders' turns, never two holders seen in one")
	}
	t.Logf("%d of 50 schedules caught", caught)
}

// The liveness after ADD is no property every IPAM has: whereabouts v0.7.0
// alone, checked by it (the pod on the plain network), leaves a crash-looping
// pod's earlier addresses, and is caught; v0.9.3 alone hands a new sandbox
// its pod's entry on the interface, and passes where it does.
func TestTheLivenessCheckCatchesWhereaboutsAlone(t *testing.T) {
	caught := map[string]int{}
	seeds := map[string]uint64{fake.V070: 30, fake.V093: 20}
	for _, v := range []string{fake.V070, fake.V093} {
		o := DefaultOptions(v)
		o.livenessOfPlain = true
		o.Leftovers = false
		o.Agents = false // whereabouts alone is what it checks: the stories found before agents
		for seed := uint64(1); seed <= seeds[v]; seed++ {
			res, err := Run(seed, o)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res.Violations {
				if !strings.Contains(x, "plain-d") {
					t.Fatalf("seed %d on %s: a violation not of whereabouts alone: %v\n%s", seed, v, res.Violations, res.Trace)
				}
				if strings.Contains(x, "an earlier sandbox of the pod") {
					caught[v]++
				}
			}
		}
	}
	if caught[fake.V070] == 0 {
		t.Fatal("30 schedules of whereabouts v0.7.0 alone checked, no earlier sandbox's entry seen left")
	}
	t.Logf("earlier sandboxes' entries left after ADD: %v (of 30 schedules of v0.7.0, 20 of v0.9.3)", caught)
}

// whereabouts' pod controller is in the model and the checker sees what it
// does: made to release every entry of a deleted pod's pool (live pods'
// too), it is caught.
func TestTheCheckerCatchesThePodControllerFreeingALivePod(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.podControllerFreesAll = true
	caught, releases := 0, 0
	for seed := uint64(1); seed <= 50; seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		releases += res.Stats["pod controller releases"]
		if len(res.Violations) > 0 {
			caught++
		}
	}
	if caught == 0 {
		t.Fatalf("50 schedules of a pod controller freeing live pods (%d releases), no violation seen", releases)
	}
	t.Logf("%d of 50 schedules caught, %d releases by the pod controller", caught, releases)
}

// Without the mutation, the pod controller releases what deleted pods held
// (it runs in the schedules the other tests play), and nothing live.
func TestThePodControllerReleasesGonePods(t *testing.T) {
	o := DefaultOptions(fake.V093)
	releases := 0
	for seed := uint64(1); seed <= 50; seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Violations) > 0 {
			t.Fatalf("seed %d: %v\n%s\n%s", seed, res.Violations, res.Trace, res.State)
		}
		releases += res.Stats["pod controller releases"]
	}
	if releases == 0 {
		t.Fatal("in 50 schedules the pod controller released nothing: it is not in the model")
	}
	t.Logf("%d releases by the pod controller in 50 schedules", releases)
}

// Regression seeds: each broke an invariant on the code before one fix (a
// scratch branch that reverted it, patches in the note), and must
// hold now. A change of the simulation's model may make a seed play another
// story: then find it again (go run ./tools/sim on the
// reverted code) rather than drop it.
func TestRegressionSeeds(t *testing.T) {
	for _, tt := range []struct {
		what  string
		seed  uint64
		wb    string
		steps int
		// podController: the seeds found before whereabouts' pod controller
		// joined the model play their stories without it (an actor more
		// changes every interleaving after it).
		podController bool
		// leftovers: the seeds found once v0.7.0's leftovers joined the model.
		leftovers bool
		// agents: the seeds found once node agents joined the model.
		agents bool
		// groups: the seeds found once the agents ran shim.Group and were
		// rolled out (Options.AgentGroups).
		groups bool
	}{
		// Hole 1: a crash after lhnet2's delegate; the runtime's DEL of lhnet2
		// released every entry of the container without an ifname, lhnet1's too.
		{"hole 1: a DEL of one of two interfaces, v0.7.0", 56, fake.V070, 6, false, false, false, false},
		{"hole 1: whereabouts v0.8.0 deallocating the container's first entry", 82, fake.V080, 6, false, false, false, false},
		{"hole 1, longer", 16, fake.V080, 24, false, false, false, false},
		// Hole 2: Multus' status names lhnet1 only; lhnet2 was judged
		// superseded by its own sibling and released.
		{"hole 2: a sibling judged superseded", 17, fake.V093, 6, false, false, false, false},
		{"hole 2, on v0.8.0", 17, fake.V080, 24, false, false, false, false},
		// Hole 3: the kubelet's GC DELs the old sandbox while the new one is
		// made; the reservation re-read after the conflict was deleted.
		{"hole 3: a reservation re-read after a conflict", 1985, fake.V093, 6, false, false, false, false},
		{"hole 3, on v0.8.0", 31, fake.V080, 24, false, false, false, false},
		// Found by the simulation: a DEL handed to whereabouts takes its Lease
		// under the pod's name, as the next sandbox's ADD does. (Seeds found
		// again after the model changed: 1130 at 6 steps and 590 at 24 play
		// other stories now, and 5,144 schedules of 6 steps found none.)
		{"DEL handed to whereabouts beside the next ADD", 1768, fake.V093, 24, false, false, false, false},
		// Found by the big run: the simulated kubelet began a second sandbox
		// of a pod while the first was being made, and the first's ADD
		// released the second's entry. The kubelet never does that (one pod
		// worker per pod); the model was wrong, and now checks itself.
		{"the model: two sandboxes of one pod made at once", 10125, fake.V093, 16, false, false, false, false},
		{"the model: two sandboxes of one pod made at once, v0.8.0", 10125, fake.V080, 16, false, false, false, false},
		// Found by the big run after it became 4x faster: (a) the kubelet
		// did not come back to a failed DEL for the 11 minutes the director
		// let pass, and the reconciler released the entry of the force-deleted
		// pod whose network namespace was still there; the kubelet retries
		// within a minute or so (a node cut off for longer than the grace is
		// an assumption in the README). (b) On whereabouts alone, the
		// kubelet's cleanup DEL of a pod's old sandbox ran beside its next
		// ADD: whereabouts' own race (both hold its Lease under the pod's
		// name), which the model already kept out of the GC path.
		{"the model: no kubelet retry for the grace", 268830, fake.V093, 16, false, false, false, false},
		{"the model: no kubelet retry for the grace, v0.8.0", 268830, fake.V080, 16, false, false, false, false},
		{"the model: whereabouts alone, a DEL beside the same pod's ADD", 73326, fake.V093, 16, false, false, false, false},
		{"the model: whereabouts alone, a DEL beside the same pod's ADD, v0.8.0", 217734, fake.V080, 16, false, false, false, false},
		// Found once whereabouts' pod controller joined the model: a pod
		// force-deleted, the kubelet's DEL of lhnet2 crashed, and the pod
		// controller released lhnet1 while its sandbox was still being
		// stopped. whereabouts does that alone too; the model now counts it
		// (stats "pod controller frees a stopping sandbox") and stops holding
		// that attachment live.
		{"the model: the pod controller frees a stopping sandbox's entry", 1758, fake.V093, 16, true, false, false, false},
		// A reclaim that released earlier sandboxes only when the cache
		// showed two or more (a count shifted by one): the pod's one earlier
		// sandbox, the commonest case, stayed. Found by the liveness check
		// after ADD; on v0.9.3 and v0.8.0 only with entries without ifname
		// (v0.7.0's leftovers), since those versions hand a sandbox the entry
		// its pod held on that interface.
		{"one earlier sandbox left by ADD", 14, fake.V093, 16, true, true, false, false},
		{"one earlier sandbox left by ADD, v0.8.0", 14, fake.V080, 16, true, true, false, false},
		{"one earlier sandbox left by ADD, v0.7.0", 14, fake.V070, 16, true, true, false, false},
		{"one earlier sandbox left by ADD, v0.7.0 without leftovers", 12, fake.V070, 16, true, false, false, false},
		// Found once node agents joined the model (and found again on the
		// model as it is now, on a scratch revert of each fix): on
		// whereabouts v0.7.0's CRDs, which prune an entry's ifname, the
		// agent's allocator gave up an address another pool's pod had
		// reserved (overlapping ranges) without removing its entry: the
		// give-up looked for the entry with the ifname it wrote. The sandbox
		// held two addresses.
		{"the agent gives up an address whose entry's ifname was pruned", 3, fake.V070, 16, true, true, true, false},
		{"the agent gives up an address whose entry's ifname was pruned, in the storage pool", 65, fake.V070, 16, true, true, true, false},
		// whereabouts' ADD alone (a plain network) looked up the
		// reservation of an address under its Lease, the agent created it
		// (in an overlapping pool, without the Lease), whereabouts' create
		// failed after its entry was written, and the DEL of that entry
		// deleted the reservation by name: the agent's live pod's.
		{"whereabouts' ADD loses the reservation to the agent, its DEL deletes it", 161, fake.V093, 16, true, true, true, false},
		// Bugs planted in the agent's allocator and the plugin's lost ADD
		// (tools/mutate/behaviours.sh, rows A1 to A3), each found by the
		// simulation on its own: an address another pod reserved kept (two
		// live attachments on one address); the chosen address not recorded
		// before the patch (on v0.7.0's CRDs, a DEL after the agent and the
		// plugin died together left the entry); a lost ADD not releasing
		// first (whereabouts v0.7.0 gave the sandbox a second address).
		{"the agent keeps an address another pod reserved", 18, fake.V093, 16, true, true, true, false},
		{"the agent writes before it records the address", 36, fake.V070, 16, true, true, true, false},
		{"a lost ADD allocates again without releasing", 7, fake.V070, 16, true, true, true, false},
		// A rebooted node's new agent, its pools informer behind (a first
		// list at an older version, a watch broken before it delivered),
		// served the next sandbox's ADD: its reclaim decided "no earlier
		// sandbox" from the copy, and the earlier sandbox kept its entry
		// (ifname pruned by v0.7.0's CRD, so not handed over either).
		{"the agent's copy hides the earlier sandbox from the reclaim", 973, fake.V070, 16, true, true, true, false},
		{"the agent's copy hides the earlier sandbox from the reclaim, again", 1227, fake.V070, 16, true, true, true, false},
		// The agent created a reservation without the Lease, its copy not
		// showing an overlapping pool created long before (a first list
		// behind); whereabouts' own ADD of that pool later handed back an
		// entry a crashed ADD left there, found the reservation another
		// pod's, created it all the same and failed; its DEL deleted it by
		// name. The checker blamed the agent for a create its ADD had read
		// before (whereabouts' own hazard), and the agent decided from its
		// copy: both fixed.
		{"a reservation created on a copy that had not shown an overlapping pool", 1120, fake.V080, 16, true, true, true, false},
		// The agent's group chose .2 on a stale copy, recorded it, lost the
		// patch to a conflict and wrote .3: the record kept both. On v0.7.0's
		// CRD (no ifname) the release of that lost ADD took .2, another
		// interface's of the sandbox, and whereabouts gave .2 to both.
		{"a choice given up on a conflict stays in the checkpoint", 3147, fake.V070, 0, true, true, true, false},
		// Found once the agents ran shim.Group under the scheduler and were
		// rolled out (AgentGroups), on a scratch revert of shim's rule that
		// a record under the holder's own name is its own only as it wrote
		// it: during a rollout in a storm, both agents of the node named as
		// before each start had a name of its own (pid 1), the new agent
		// found the Lease under "its" name and walked into the turn the old
		// one was in (the Lease's invariant: two holders in one turn).
		{"a new agent of the node takes the old one's Lease as its own", 291, fake.V093, 16, true, true, true, true},
		{"a new agent of the node takes the old one's Lease as its own, v0.7.0", 291, fake.V070, 16, true, true, true, true},
		// Found by a 10-minute run (two interfaces of one sandbox on one
		// pool, v0.7.0's CRD pruning the ifname): the group chose .3 for
		// lhnet2 on a stale copy and recorded it, its patch conflicted (the
		// exec path had given .3 to lhnet1), and the client went away: the
		// member left the group with .3 still in its record, and the DEL of
		// lhnet2 released lhnet1's entry. 17479 and 25624 tell it again.
		// Each fix holds them alone: the choice leaves the record, and the
		// DEL leaves an entry at an address lhnet1 recorded too (below).
		{"a member that leaves after a conflict keeps its choice in its record", 5803, fake.V070, 16, true, true, true, true},
		{"a member that leaves after a conflict keeps its choice in its record, again", 17479, fake.V070, 16, true, true, true, true},
		{"a member that leaves after a conflict keeps its choice in its record, a third time", 25624, fake.V070, 16, true, true, true, true},
		// The agent recorded .8 for lhnet2, chosen on a stale copy, and was
		// killed before its patch; the exec path had given .8 to lhnet1,
		// which recorded it too. The lost ADD's release took .8 by lhnet2's
		// record, and whereabouts gave .8 to lhnet2: one address, two
		// interfaces. An address two attachments recorded is neither's to
		// release.
		{"an address two interfaces recorded, released for one", 12712, fake.V070, 16, true, true, true, true},
	} {
		t.Run(tt.what, func(t *testing.T) {
			o := DefaultOptions(tt.wb)
			if tt.steps > 0 {
				o.Steps = tt.steps
			}
			o.PodController = tt.podController
			o.Leftovers = tt.leftovers
			o.Agents = tt.agents
			o.AgentGroups = tt.groups
			// Every seed here was found before the NAD kinds joined the
			// model: they play their stories without them.
			o.NADKinds = false
			res, err := Run(tt.seed, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Violations) > 0 {
				t.Fatalf("seed %d: %v\n%s\n%s", tt.seed, res.Violations, res.Trace, res.State)
			}
		})
	}
}

// Regression seeds of the NAD kinds (Options.NADKinds, on as `make sim`
// plays them): each broke an invariant on the code before a fix, or with
// a bug planted again (tools/mutate/behaviours.sh), and must hold now.
func TestNADKindRegressionSeeds(t *testing.T) {
	for _, tt := range []struct {
		what string
		seed uint64
		wb   string
	}{
		// A network of two pools on v0.7.0's CRDs: the next sandbox's ADD
		// released the earlier one's entry in the first pool and was killed
		// in the second's release; it had forgotten the earlier sandbox's
		// whole record at the first, and the agent's DEL of that sandbox
		// left the second pool's entry (its ifname pruned).
		{"an ADD released one of two pools and forgot the record of both", 97, fake.V070},
		// Two NADs with reservations off hand one address each from its own
		// pool: an audit that calls that two pods on one address is caught.
		{"one address from two pools with reservations off, by design", 8, fake.V093},
		// The model: a dual-stack ADD on the exec path found the pod's own
		// reservation at its IPv4 address (the agent's, made after its
		// client left), and whereabouts created none for the IPv6 one (its
		// skipOverlappingRangeUpdate, one for every range): whereabouts' own
		// bug, which the checker blamed on the product. The audit reports
		// it (EntryReservationMismatch).
		{"the model: whereabouts reserves no later range once an earlier had the pod's own", 2910, fake.V093},
		{"the model: whereabouts reserves no later range once an earlier had the pod's own, v0.8.0", 2910, fake.V080},
		// A dual-stack ADD through the agent on v0.7.0's CRDs: the IPv6
		// range found an earlier sandbox its copy had not shown, and the
		// plugin asked the agent again; the second ask did not know the
		// IPv4 entry the first wrote (its ifname pruned), allocated a
		// second address and rewrote the record without the first.
		{"an ADD asked again allocated beside the entry the first ask wrote", 13527, fake.V070},
		{"an ADD asked again allocated beside the entry the first ask wrote, again", 6018, fake.V070},
	} {
		t.Run(tt.what, func(t *testing.T) {
			res, err := Run(tt.seed, DefaultOptions(tt.wb))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Violations) > 0 {
				t.Fatalf("seed %d: %v\n%s\n%s", tt.seed, res.Violations, res.Trace, res.State)
			}
		})
	}
}
