package reconcile

import (
	"context"
	"fmt"
	"io"
	"math/big"
	"net"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// PoolSummary is one line of the inspect view.
type PoolSummary struct {
	Name, Range string
	// Capacity counts the range's usable addresses; excludes live in NADs,
	// which inspect does not need, so they are not subtracted.
	Capacity  *big.Int
	Allocated int
	Stale     int
	Stales    []Verdict
}

// Left is what the range still offers (before excludes).
func (s PoolSummary) Left() *big.Int {
	return new(big.Int).Sub(s.Capacity, big.NewInt(int64(s.Allocated)))
}

// Inspect judges every pool as a pass would, and writes nothing.
func (r *Reconciler) Inspect(ctx context.Context) ([]PoolSummary, error) {
	pools, err := r.Store.Pools(ctx)
	if err != nil {
		return nil, err
	}
	world, err := r.readWorld(ctx, pools)
	if err != nil {
		return nil, err
	}
	sb := SandboxesOf(pools)
	out := make([]PoolSummary, 0, len(pools))
	for i := range pools {
		p := &pools[i]
		vs, err := Classify(p, world, sb)
		if err != nil {
			return nil, err
		}
		s := PoolSummary{Name: p.Name, Range: p.Spec.Range, Capacity: capacity(p.Spec.Range), Allocated: len(vs)}
		for _, v := range vs {
			if v.Stale() {
				s.Stale++
				s.Stales = append(s.Stales, v)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// capacity is the number of usable addresses of a CIDR, as whereabouts
// allocates them: without the network and broadcast addresses.
func capacity(cidr string) *big.Int {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return big.NewInt(0)
	}
	ones, bits := n.Mask.Size()
	size := new(big.Int).Lsh(big.NewInt(1), uint(bits-ones))
	if bits-ones >= 2 {
		size.Sub(size, big.NewInt(2))
	}
	return size
}

// WriteInspect renders the inspect view for people.
func WriteInspect(w io.Writer, pools []PoolSummary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tRANGE\tCAPACITY\tALLOCATED\tSTALE\tLEFT")
	for _, p := range pools {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.Range, p.Capacity, p.Allocated, p.Stale, p.Left())
	}
	tw.Flush()
	var stale []string
	for _, p := range pools {
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
	defer func() {
		if len(rows) <= MaxRows {
			return
		}
		byReason := map[string]int{}
		for _, r := range rows[MaxRows:] {
			byReason[string(r.Reason)+", "+r.Action]++
		}
		var parts []string
		for k, n := range byReason {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "... and %d more: %s\n", len(rows)-MaxRows, strings.Join(parts, "; "))
	}()
	if len(rows) > MaxRows {
		rows = rows[:MaxRows]
	}
	for _, r := range rows {
		age := "first seen now"
		if !r.Since.IsZero() && now.Sub(r.Since) > 0 {
			age = now.Sub(r.Since).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Kind, r.Pool, r.IP, r.PodRef, dash(shortID(r.Container)), dash(r.IfName), r.Reason, age, r.Action)
	}
	tw.Flush()
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
