package reconcile

import (
	"context"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// PoolSummary is one pool as inspect shows it.
type PoolSummary struct {
	Name, Range string
	// Usage is how full it is, with the excludes and bounds of the NAD that
	// names it, when one was read.
	Usage
	Allocated int
	Stale     int
	Stales    []Verdict
	// NADs are the NADs that name the pool (namespace/name).
	NADs []string
	// Orphaned: the NADs were read and none names the pool; OrphanedSince is
	// the reconciler's first sighting of that, when it recorded one.
	Orphaned      bool
	OrphanedSince time.Time
}

// Live counts the entries that are not stale.
func (s PoolSummary) Live() int { return s.Allocated - s.Stale }

// Inspection is what inspect shows: every pool of the namespace, and what
// the NADs said.
type Inspection struct {
	Namespace string
	Pools     []PoolSummary
	NADs      *NADs
}

// Inspect judges every pool as a pass would, and writes nothing.
func (r *Reconciler) Inspect(ctx context.Context) (*Inspection, error) {
	pools, err := r.Store.Pools(ctx)
	if err != nil {
		return nil, err
	}
	world, err := r.readWorld(ctx, pools)
	if err != nil {
		return nil, err
	}
	nads := IndexNADs(r.Cluster.NADs(ctx))
	sb := SandboxesOf(pools)
	out := &Inspection{Namespace: r.Store.Namespace(), NADs: nads, Pools: make([]PoolSummary, 0, len(pools))}
	for i := range pools {
		p := &pools[i]
		vs, err := Classify(p, world, sb)
		if err != nil {
			return nil, err
		}
		s := PoolSummary{Name: p.Name, Range: p.Spec.Range, Usage: nads.Usage(p, vs), Allocated: len(vs),
			NADs: nads.Naming(p), Orphaned: nads.Orphaned(p)}
		s.OrphanedSince, _ = parseTime(p.Annotations[OrphanedSinceAnnotation])
		for _, v := range vs {
			if v.Stale() {
				s.Stale++
				s.Stales = append(s.Stales, v)
			}
		}
		out.Pools = append(out.Pools, s)
	}
	return out, nil
}

// CannotFit are the pools that cannot give n more addresses now (Free < n):
// every pool a NAD names, or every pool when the NADs are unknown; a pool no
// NAD names allocates nothing more.
func (in *Inspection) CannotFit(n int64) []PoolSummary {
	var out []PoolSummary
	for _, p := range in.Pools {
		if p.Orphaned {
			continue
		}
		if p.Free.Cmp(big.NewInt(n)) < 0 {
			out = append(out, p)
		}
	}
	return out
}

// WriteInspect renders the inspect view for people.
func WriteInspect(w io.Writer, in *Inspection) {
	if !in.NADs.Known {
		fmt.Fprintf(w, "NADs not read (%v): sizes are the ranges' without excludes, and no pool is judged orphaned\n\n", in.NADs.Err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tRANGE\tSIZE\tALLOCATED\tSTALE\tFREE\tNAD")
	for _, p := range in.Pools {
		nad := p.NAD
		switch {
		case p.Orphaned:
			nad = "none"
		case nad == "":
			nad = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", p.Name, p.Range, p.Size, p.Allocated, p.Stale, p.Free, nad)
	}
	tw.Flush()
	var stale []string
	for _, p := range in.Pools {
		for _, v := range p.Stales {
			stale = append(stale, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", p.Name, v.IP, v.PodRef, v.ContainerID, dash(v.IfName), v.Reason))
		}
	}
	if len(stale) > 0 {
		fmt.Fprintln(w, "\nstale allocations (released by a pass once stale for the grace period):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tIP\tPOD\tCONTAINER\tIFNAME\tREASON")
		fmt.Fprintln(tw, strings.Join(stale, "\n"))
		tw.Flush()
	}
	var orphans []PoolSummary
	for _, p := range in.Pools {
		if p.Orphaned {
			orphans = append(orphans, p)
		}
	}
	if len(orphans) > 0 {
		fmt.Fprintln(w, "\npools no NAD names (an old range; the reconciler deletes one with --delete-orphaned-pools once it holds no live entry):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tRANGE\tENTRIES\tLIVE\tORPHANED SINCE")
		for _, p := range orphans {
			since := "not recorded"
			if !p.OrphanedSince.IsZero() {
				since = p.OrphanedSince.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", p.Name, p.Range, p.Allocated, p.Live(), since)
		}
		tw.Flush()
	}
}

// WriteNeed says, for people, which pools cannot fit n more addresses, and
// what a pass of the reconciler would give back in each.
func WriteNeed(w io.Writer, n int64, short []PoolSummary) {
	if len(short) == 0 {
		fmt.Fprintf(w, "\nevery pool fits %d more addresses\n", n)
		return
	}
	fmt.Fprintf(w, "\n%d pool(s) cannot fit %d more addresses now:\n", len(short), n)
	for _, p := range short {
		where := ""
		if p.NAD != "" {
			where = ", NAD " + p.NAD
		}
		fmt.Fprintf(w, "  pool %s (%s%s): %s free now, %d more once the reconciler releases its stale entries", p.Name, p.Range, where, p.Free, p.Reclaimable)
		after := new(big.Int).Add(p.Free, big.NewInt(int64(p.Reclaimable)))
		switch {
		case p.Reclaimable > 0 && after.Cmp(big.NewInt(n)) >= 0:
			fmt.Fprintf(w, ": then it fits (harvester-ipam-reconciler --grace 0 --dry-run shows them, the same without --dry-run releases them)\n")
		default:
			fmt.Fprintf(w, ": widen the range or remove excludes before adding %d\n", n)
		}
	}
}

// MaxRows bounds the rows WriteRows prints; the rest are counted by reason.
const MaxRows = 200

// WriteRows renders a pass's plan: what is stale, since when, and what was done.
func WriteRows(w io.Writer, rows []Row, now time.Time) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "nothing stale")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tPOOL\tIP\tPOD\tCONTAINER\tIFNAME\tREASON\tSTALE FOR\tACTION")
	shown, rest := rows, []Row(nil)
	if len(rows) > MaxRows {
		shown, rest = rows[:MaxRows], rows[MaxRows:]
	}
	for _, r := range shown {
		age := "first seen now"
		if !r.Since.IsZero() && now.Sub(r.Since) > 0 {
			age = now.Sub(r.Since).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Kind, r.Pool, r.IP, r.PodRef, dash(shortID(r.Container)), dash(r.IfName), r.Reason, age, r.Action)
	}
	tw.Flush()
	if len(rest) == 0 {
		return
	}
	byReason := map[string]int{}
	for _, r := range rest {
		byReason[string(r.Reason)+", "+r.Action]++
	}
	parts := make([]string, 0, len(byReason))
	for k, n := range byReason {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	fmt.Fprintf(w, "... and %d more: %s\n", len(rest), strings.Join(parts, "; "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 16 {
		return id[:16] + "…"
	}
	return id
}
