package sim

import (
	"strings"
	"testing"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/reconcile/audit"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// auditRuns plays seeds 1..n with o and counts the schedules whose
// violations name what, and the stats summed.
func auditRuns(t *testing.T, o Options, n int, what string) (caught int, stats map[string]int) {
	t.Helper()
	stats = map[string]int{}
	for seed := uint64(1); seed <= uint64(n); seed++ {
		res, err := Run(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		for k, c := range res.Stats {
			stats[k] += c
		}
		for _, v := range res.Violations {
			if what == "" {
				t.Fatalf("seed %d: %v\n%s\n%s", seed, res.Violations, res.Trace, res.State)
			}
			if strings.Contains(v, what) {
				caught++
				break
			}
		}
	}
	return caught, stats
}

// The audit's checker is not blind: an audit that finds nothing misses the
// inconsistencies the world has on purpose (Multus' partial
// network-status, whereabouts' own hazards), and is caught.
func TestTheAuditCheckerCatchesABlindAudit(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.auditJudge = func(audit.Snapshot, audit.Options) audit.Result { return audit.Result{} }
	caught, _ := auditRuns(t, o, 30, "the audit missed")
	if caught == 0 {
		t.Fatal("30 schedules judged by an audit that finds nothing, no miss seen")
	}
	t.Logf("%d of 30 schedules caught", caught)
}

// Nor does it take every finding on trust: an audit that reports every
// entry as missing its reservation is caught.
func TestTheAuditCheckerCatchesAnAlarmist(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.auditJudge = func(s audit.Snapshot, opts audit.Options) audit.Result {
		r := audit.Judge(s, opts)
		for i := range s.Pools {
			as, _ := shim.Allocations(&s.Pools[i])
			for _, e := range as {
				r.Findings = append(r.Findings, audit.Finding{Kind: audit.EntryReservationMismatch, Network: "x", Pool: e.Pool, Address: e.IP.String(), Pods: []string{e.PodRef}})
			}
		}
		return r
	}
	caught, _ := auditRuns(t, o, 30, "does not bear out")
	if caught == 0 {
		t.Fatal("30 schedules judged by an audit that reports every entry, no false alarm seen")
	}
	t.Logf("%d of 30 schedules caught", caught)
}

// What the product must never do, the audit reports: live entries freed
// behind everyone's back (the sabotage), left running rather than stopping
// the schedule, are each reported within the grace (PodPoolMismatch where
// the network-status names the address), and nothing else is.
func TestTheAuditReportsAFreedLiveEntry(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.sabotage, o.auditTolerates = true, true
	_, stats := auditRuns(t, o, 50, "")
	if stats["audit: inconsistencies reported within the grace: "+string(audit.PodPoolMismatch)] == 0 {
		t.Fatalf("50 sabotaged schedules, no freed live entry reported: %v", stats)
	}
	t.Logf("reported: %d PodPoolMismatch, %d EntryReservationMismatch, %d SharedAddress",
		stats["audit: inconsistencies reported within the grace: "+string(audit.PodPoolMismatch)],
		stats["audit: inconsistencies reported within the grace: "+string(audit.EntryReservationMismatch)],
		stats["audit: inconsistencies reported within the grace: "+string(audit.SharedAddress)])
}

// The audit's false alarms the checker found, each failing on the audit
// before its fix (audit's TestJudge has a row of each): an entry no Running
// pod holds (a Pending pod's earlier sandbox's, its reservation deleted by
// a reclaim cut short), and entries the reconciler judges leaks (earlier
// sandboxes' of a pod running on a replaced network, v0.7.0's leftovers)
// reported as missing their reservations.
func TestAuditRegressionSeeds(t *testing.T) {
	for _, tt := range []struct {
		what string
		seed uint64
		wb   string
	}{
		{"a Pending pod's earlier sandbox's entry without its reservation", 57, fake.V070},
		{"a Running pod's earlier sandbox's entry, a network replaced since", 174, fake.V070},
		{"leftovers of v0.7.0 beside a pod on the replaced network", 304, fake.V080},
	} {
		t.Run(tt.what, func(t *testing.T) {
			o := DefaultOptions(tt.wb)
			o.NADKinds = false // found before the NAD kinds joined the model
			res, err := Run(tt.seed, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Violations) > 0 {
				t.Fatalf("seed %d: %v\n%s\n%s", tt.seed, res.Violations, res.Trace, res.State)
			}
			if res.Stats["audit: looks"] == 0 {
				t.Fatal("the audit never looked")
			}
		})
	}
}

// The NAD kinds are in the schedules, and the checker knows what
// enable_overlapping_ranges: false means: an audit that reads every NAD as
// reserving calls the two pods whereabouts gives one address from two
// pools, by design, two pods on one address, and is caught.
func TestTheAuditCheckerCatchesAnAuditBlindToReservationsOff(t *testing.T) {
	o := DefaultOptions(fake.V093)
	o.auditJudge = func(s audit.Snapshot, opts audit.Options) audit.Result {
		nads := make([]reconcile.NAD, len(s.NADs))
		for i, n := range s.NADs {
			n.Config = strings.ReplaceAll(n.Config, `"enable_overlapping_ranges":false`, `"enable_overlapping_ranges":true`)
			nads[i] = n
		}
		s.NADs = nads
		return audit.Judge(s, opts)
	}
	caught, stats := auditRuns(t, o, 30, "SharedAddress")
	if stats["audit: looks at one address in two pools with reservations off"] == 0 {
		t.Fatalf("30 schedules, no look at an address two pools with reservations off hold: %v", stats)
	}
	if caught == 0 {
		t.Fatal("30 schedules judged by an audit blind to enable_overlapping_ranges: false, no false SharedAddress seen")
	}
	t.Logf("%d of 30 schedules caught", caught)
}

// The API server restarts in the audit's looks (issue 44): its informers
// follow again one by one, each on its own backoff. The audit judges only
// once every one follows, and then opens nothing the world does not bear
// out; an audit that judged the mix (fresh pods against the pools an
// informer still held, or the reverse) is caught.
func TestTheAuditCheckerCatchesAnAuditThatJudgesBehind(t *testing.T) {
	o := DefaultOptions(fake.V093)
	_, stats := auditRuns(t, o, 30, "")
	if stats["audit: API server restarts"] == 0 || stats["audit: looks while an informer is behind, not judged"] == 0 {
		t.Fatalf("30 schedules, no look during an API server restart: %v", stats)
	}
	o.auditJudgesBehind = true
	caught, stats := auditRuns(t, o, 200, "the world does not bear out")
	if stats["audit: looks while an informer is behind, judged"] == 0 {
		t.Fatalf("200 schedules, no look judged behind: %v", stats)
	}
	if caught == 0 {
		t.Fatalf("200 schedules judged by an audit that judges while an informer is behind, no false finding seen: %v", stats)
	}
	t.Logf("%d of 200 schedules caught", caught)
}
