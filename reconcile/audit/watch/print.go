package watch

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// WriteOpen prints the open findings for people: each with what to do and
// the command to run next.
func WriteOpen(w io.Writer, open []audit.Open, now time.Time) {
	if len(open) == 0 {
		fmt.Fprintln(w, "audit: no finding open")
		return
	}
	fmt.Fprintf(w, "audit: %d finding(s) open:\n", len(open))
	for _, o := range open {
		fmt.Fprintf(w, "  %s on %s%s, for %s\n    %s\n    next: %s\n", o.Kind, o.Network, where(o.Finding),
			now.Sub(o.Since).Round(time.Second), o.Message, o.Command)
	}
}

// WriteSeen prints what one look found, none of it confirmed: a moment in
// flight looks the same once.
func WriteSeen(w io.Writer, r audit.Result, confirm string) {
	if len(r.Findings) == 0 {
		fmt.Fprintln(w, "\naudit: nothing found at one look")
	} else {
		fmt.Fprintf(w, "\naudit: seen at one look, not yet confirmed (a moment in flight looks the same; %s looks twice):\n", confirm)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tNETWORK\tPOOL\tADDRESS\tPODS\tNEXT")
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Kind, f.Network, dash(f.Pool), dash(f.Address), dash(strings.Join(f.Pods, ",")), f.Command)
		}
		tw.Flush()
	}
	for _, f := range r.Figures {
		fmt.Fprintf(w, "headroom: network %s: %d free, its Longhorn pods need %d\n", f.Network, f.Free, f.Need)
	}
	for _, err := range r.Errors {
		fmt.Fprintf(w, "audit: not judged: %v\n", err)
	}
}

func where(f audit.Finding) string {
	var parts []string
	if f.Pool != "" {
		parts = append(parts, "pool "+f.Pool)
	}
	if f.Address != "" {
		parts = append(parts, "address "+f.Address)
	}
	if len(f.Pods) > 0 {
		parts = append(parts, "pods "+strings.Join(f.Pods, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
