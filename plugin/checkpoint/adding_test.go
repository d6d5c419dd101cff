package checkpoint

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
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

// An ADD's mark says "in flight", and whose ADD it is, from before its
// record is written (a node agent's allocator writes it only once it chose
// an address) until it is done, and nothing else does: not a mark done, not
// one left by an ADD that died, not a second ADD of the same attachment
// while the first holds it.
func TestAnADDInFlightIsSeenUntilItIsDone(t *testing.T) {
	d := Dir(t.TempDir())
	marked := record("new", "lhnet1")
	marked.IPs = nil
	done, err := d.Adding(marked)
	require.NoError(t, err)
	recs, errs := d.InFlight()
	require.Empty(t, errs)
	marked.Version = Version
	assert.Equal(t, []Record{marked}, recs, "marked, no record yet: the mark tells the ADD")

	require.NoError(t, d.Write(record("new", "lhnet1")))
	require.NoError(t, d.Write(record("old", "lhnet1")))
	recs, errs = d.InFlight()
	require.Empty(t, errs)
	assert.Equal(t, []string{"new/lhnet1"}, ids(recs), "only the ADD holding its mark")

	again, err := d.Adding(record("new", "lhnet1"))
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
	entries, err := os.ReadDir(string(d))
	require.NoError(t, err)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), ".tmp-", "the name a mark was written under is gone")
	}

	_, err = d.Adding(record("../x", "lhnet1"))
	assert.Error(t, err, "a container ID that would leave the directory")
	bad := record("x", "lhnet1")
	bad.PodRef = "\xff"
	_, err = d.Adding(bad)
	assert.Error(t, err, "a mark that would not read back")
}

// A mark an earlier release made (an empty file, its ADD told by the
// record alone: a plugin of the release before, beside this one's agent in
// a rollout) is in flight once its record is written, as it was then; a
// mark that does not read is an error beside the others, which it hides
// nothing of.
func TestAnEarlierReleasesMarkIsToldByItsRecord(t *testing.T) {
	d := Dir(t.TempDir())
	hold := func(name string, data []byte) {
		t.Helper()
		p := filepath.Join(string(d), name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		f, err := os.Open(p)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	}
	hold("new:lhnet1.adding", nil)
	recs, errs := d.InFlight()
	require.Empty(t, errs)
	assert.Empty(t, recs, "an empty mark, no record yet: nothing a DEL could go by")
	require.NoError(t, d.Write(record("new", "lhnet1")))
	recs, errs = d.InFlight()
	require.Empty(t, errs)
	assert.Equal(t, []string{"new/lhnet1"}, ids(recs))

	hold("bad:lhnet1.adding", []byte("{"))
	other := record("other", "lhnet1")
	other.Version = Version
	data, err := json.Marshal(other)
	require.NoError(t, err)
	hold("x:lhnet1.adding", data)
	recs, errs = d.InFlight()
	assert.Equal(t, []string{"new/lhnet1"}, ids(recs), "a mark that names another attachment is not taken for it")
	require.Len(t, errs, 2)
	assert.Contains(t, errs[0].Error(), "bad:lhnet1.adding")
	assert.Contains(t, errs[1].Error(), "records other/lhnet1, not x/lhnet1")
}

// A process that marked an ADD and died (a kill at any instant) leaves a file
// no one holds: no DEL waits on it, and the attachment's DEL removes it.
func TestAnADDThatDiedIsNotInFlight(t *testing.T) {
	if dir := os.Getenv("CHECKPOINT_TEST_MARK_AND_DIE"); dir != "" {
		if _, err := Dir(dir).Adding(record("new", "lhnet1")); err != nil {
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
	done, err := d.Adding(record("new", "lhnet1"))
	require.NoError(t, err)
	defer done()
	require.NoError(t, d.Remove("new", "lhnet1"))
	assert.FileExists(t, filepath.Join(string(d), "new:lhnet1.adding"))
}
