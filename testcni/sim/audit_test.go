package sim

import (
	"strings"
	"testing"

	"github.com/harvester/harvester-ipam/audit"
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
