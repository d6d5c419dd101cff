package steps_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/harvester/harvester-ipam/plugin/steps"
)

// The log times each step, to 10 µs.
func TestStepsAreRoundedTo10Microseconds(t *testing.T) {
	at := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	ph := steps.WithClock(func() time.Time { return at })
	for _, tt := range []struct {
		step string
		took time.Duration
		want string
	}{
		{"config", 1234567 * time.Nanosecond, "config 1.23ms"},
		{"client", 4 * time.Microsecond, "config 1.23ms, client 0s"},
		{"checkpoint", 15 * time.Microsecond, "config 1.23ms, client 0s, checkpoint 20µs"},
		{"whereabouts", 88235 * time.Microsecond, "config 1.23ms, client 0s, checkpoint 20µs, whereabouts 88.24ms"},
	} {
		at = at.Add(tt.took)
		ph.Mark(tt.step)
		assert.Equal(t, tt.want, ph.String())
	}
}

func TestANilTimerMarksNothing(t *testing.T) {
	var ph *steps.Timer
	ph.Mark("config")
	assert.Equal(t, "", ph.String())
}
