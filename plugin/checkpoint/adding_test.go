package checkpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ids(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ContainerID+"/"+r.IfName)
	}
	return out
}

// An ADD's mark says "in flight" from before its record is written until it
// is done, and nothing else does: not a mark without a record, not a mark
// done, not one left by an ADD that died, not a second ADD of the same
// attachment while the first holds it.
func TestAnADDInFlightIsSeenUntilItIsDone(t *testing.T) {
	d := Dir(t.TempDir())
	done, err := d.Adding("new", "lhnet1")
	require.NoError(t, err)
	recs, errs := d.InFlight()
	require.Empty(t, errs)
	assert.Empty(t, recs, "marked, no record yet: nothing a DEL could go by")

	require.NoError(t, d.Write(record("new", "lhnet1")))
	require.NoError(t, d.Write(record("old", "lhnet1")))
	recs, errs = d.InFlight()
	require.Empty(t, errs)
	assert.Equal(t, []string{"new/lhnet1"}, ids(recs), "only the ADD holding its mark")

	again, err := d.Adding("new", "lhnet1")
	require.NoError(t, err, "an ADD of the attachment while an earlier one still runs goes on")
	again()
	recs, _ = d.InFlight()
	assert.Equal(t, []string{"new/lhnet1"}, ids(recs), "the second ADD's done leaves the first's mark")

	done()
	done()
	recs, errs = d.InFlight()
	require.Empty(t, errs)
	assert.Empty(t, recs, "done")
	_, err = os.Stat(filepath.Join(string(d), "new:lhnet1.adding"))
	assert.ErrorIs(t, err, os.ErrNotExist, "done removes its mark")

	_, err = d.Adding("../x", "lhnet1")
	assert.Error(t, err, "a container ID that would leave the directory")
}

// A process that marked an ADD and died (a kill at any instant) leaves a file
// no one holds: no DEL waits on it, and the attachment's DEL removes it.
func TestAnADDThatDiedIsNotInFlight(t *testing.T) {
	if dir := os.Getenv("CHECKPOINT_TEST_MARK_AND_DIE"); dir != "" {
		if _, err := Dir(dir).Adding("new", "lhnet1"); err != nil {
			os.Exit(3)
		}
		os.Exit(0) // without done: the kernel drops the lock
	}
	d := Dir(t.TempDir())
	require.NoError(t, d.Write(record("new", "lhnet1")))
	cmd := exec.Command(os.Args[0], "-test.run=^TestAnADDThatDiedIsNotInFlight$")
	cmd.Env = append(os.Environ(), "CHECKPOINT_TEST_MARK_AND_DIE="+string(d))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	mark := filepath.Join(string(d), "new:lhnet1.adding")
	require.FileExists(t, mark, "the dead ADD's mark")

	recs, errs := d.InFlight()
	require.Empty(t, errs)
	assert.Empty(t, recs, "a dead ADD is not in flight")

	require.NoError(t, d.Remove("new", "lhnet1"))
	assert.NoFileExists(t, mark, "the attachment's DEL removes what the dead ADD left")
}

// The attachment's DEL leaves the mark of an ADD of it still running (an
// ADD its client gave up on).
func TestRemoveLeavesAMarkHeld(t *testing.T) {
	d := Dir(t.TempDir())
	done, err := d.Adding("new", "lhnet1")
	require.NoError(t, err)
	defer done()
	require.NoError(t, d.Remove("new", "lhnet1"))
	assert.FileExists(t, filepath.Join(string(d), "new:lhnet1.adding"))
}
