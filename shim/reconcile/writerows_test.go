package reconcile

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Past MaxRows the rest are counted by reason and action. (Found by the
// mutation tests: the count read the rows after they were cut to MaxRows,
// and never printed.)
func TestWriteRowsCountsTheRowsPastMaxRows(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	var many []Row
	for i := 0; i < MaxRows+3; i++ {
		r := Row{Kind: "allocation", Pool: "p", IP: "10.0.0." + strconv.Itoa(i), PodRef: "ns/x", Reason: PodGone, Action: "release"}
		if i == MaxRows+2 {
			r.Reason, r.Action = NodeGone, "wait 1m0s"
		}
		many = append(many, r)
	}
	var out bytes.Buffer
	WriteRows(&out, many, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 1+MaxRows+1, "the header, MaxRows rows, and the count of the rest")
	assert.Equal(t, "... and 3 more: 1 node gone, wait 1m0s; 2 pod gone, release", lines[len(lines)-1])
}
