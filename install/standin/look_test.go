package standin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A whole binary that crashes once (the node out of memory, a passing
// failure) is run again before it is taken for a fragment: whereabouts'
// new binary at the name is kept aside, not removed.
func TestABinaryThatCrashedOnceIsNotAFragment(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	for _, standing := range []bool{false, true} {
		t.Run(fmt.Sprintf("standing in %v", standing), func(t *testing.T) {
			d := newDir(t, v093)
			want := v093
			if standing {
				_, err := d.Take(ctx, true)
				require.NoError(t, err)
				cpF(t, d.name(), v094, time.Now())
				want = v094
			}
			crashed := 0
			d.Probe = func(ctx context.Context, path string) error {
				if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, want) && crashed == 0 {
					crashed++
					return fmt.Errorf("signal: killed: %w", ErrBroken)
				}
				return probeVersion(ctx, path)
			}
			_, err := d.Take(ctx, false)
			require.NoError(t, err)
			assert.Equal(t, 1, crashed)
			holds(t, "harvester-ipam", d.name(), "standing in")
			holds(t, whatIs(t, want), d.aside(), "the real binary aside, not removed for a fragment")
		})
	}
}

// A look says what the file it stat'ed is: a file replaced while it was
// probed is reported as not answering (looked at again later), never as
// what the probe of the other file said.
func TestALookIsOfTheFileItStats(t *testing.T) {
	ctx := bounded(t)
	v093, v094 := realBinary("v0.9.3"), realBinary("v0.9.4")
	for _, tt := range []struct {
		name    string
		before  []byte
		replace func(t *testing.T, path string)
	}{
		{"a fragment replaced by a whole binary (busybox cp -f)", v094[:len(v094)/3], func(t *testing.T, path string) { busyboxCP(t, path, v094, time.Now()) }},
		{"a whole binary rewritten in place (GNU cp -f)", v093, func(t *testing.T, path string) { cpF(t, path, v094, time.Now().Add(-time.Hour)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := newDir(t, tt.before)
			d.Probe = func(ctx context.Context, path string) error {
				err := probeVersion(ctx, path)
				tt.replace(t, path) // after the probe answered, before the look ends
				return err
			}
			l, err := d.look(ctx, d.name())
			require.NoError(t, err)
			assert.Equal(t, unknown, l.kind, "changed while it was looked at: %v", l.why)
			assert.ErrorContains(t, l.why, "changed while it was looked at")
		})
	}
}
