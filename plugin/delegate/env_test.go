package delegate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In an environment of its own (a node agent's request), a delegate is found
// on that environment's CNI_PATH and inherits its variables, not the
// process's; with none, it runs exactly as invoke's Delegate* run it.
func TestADelegateRunsInTheEnvironmentItIsGiven(t *testing.T) {
	own := plugin(t, "whereabouts", "echo '"+result+"'") // the process's CNI_PATH, CNI_CONTAINERID c1
	theirs := t.TempDir()
	script := "#!/bin/sh\necho \"$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME\" > " + theirs + "/started\ncat > /dev/null\necho '" + result + "'\n"
	require.NoError(t, os.WriteFile(filepath.Join(theirs, "whereabouts"), []byte(script), 0o755))
	env := []string{"PATH=" + os.Getenv("PATH"), "CNI_PATH=" + theirs, "CNI_CONTAINERID=c2", "CNI_IFNAME=lhnet1", "CNI_COMMAND=DEL"}
	ctx := context.Background()
	conf := []byte(`{"cniVersion":"1.0.0","name":"n"}`)

	_, err := Add(ctx, "whereabouts", conf, Plain(nil), env)
	require.NoError(t, err)
	assert.Equal(t, "ADD c2 lhnet1\n", read(t, filepath.Join(theirs, "started")))
	assert.Equal(t, "(none)", read(t, filepath.Join(own, "started")))

	require.NoError(t, Run(ctx, "whereabouts", "GC", conf, Plain(nil), env))
	assert.Equal(t, "GC c2 lhnet1\n", read(t, filepath.Join(theirs, "started")))

	e := StartIn(ctx, "whereabouts", "ADD", env, nil)
	require.True(t, e.Started())
	_, err = Add(ctx, "whereabouts", conf, e, env)
	require.NoError(t, err)
	assert.False(t, e.Started(), "the started process ran the ADD")
	assert.Equal(t, "ADD c2 lhnet1\n", read(t, filepath.Join(theirs, "started")))

	// No environment: the process's, as invoke.DelegateAdd.
	_, err = Add(ctx, "whereabouts", conf, Plain(nil), nil)
	require.NoError(t, err)
	assert.Equal(t, "ADD c1\n", read(t, filepath.Join(own, "started")))
}

// The environment a delegate gets is invoke's: each variable once, the
// later value winning, CNI_COMMAND set.
func TestCommandEnvIsInvokes(t *testing.T) {
	t.Setenv("CNI_COMMAND", "VERSION")
	t.Setenv("CNI_CONTAINERID", "c1")
	got := commandEnv(nil, "ADD")
	want := (&invoke.DelegateArgs{Command: "ADD"}).AsEnv()
	sort.Strings(got)
	sort.Strings(want)
	assert.Equal(t, want, got)

	assert.Equal(t, []string{"B=2", "NOEQUALS", "A=3", "CNI_COMMAND=DEL"}, commandEnv([]string{"A=1", "B=2", "NOEQUALS", "A=3", "CNI_COMMAND=ADD"}, "DEL"))
	assert.Equal(t, "3", Getenv([]string{"A=1", "A=3"}, "A"))
	assert.Equal(t, "", Getenv([]string{}, "HOME"), "an empty environment is not the process's")
	assert.Equal(t, os.Getenv("HOME"), Getenv(nil, "HOME"))
}

// orphanHelperEnv makes this test binary run a delegate with Orphanless and
// wait (TestOrphanlessHelper), for TestAnOrphanlessDelegateDiesWithItsParent.
const orphanHelperEnv = "HARVESTER_IPAM_ORPHAN_HELPER"

func TestOrphanlessHelper(t *testing.T) {
	dir := os.Getenv(orphanHelperEnv)
	if dir == "" {
		return // a helper process only
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "CNI_PATH=" + dir}
	_ = Run(context.Background(), "whereabouts", "ADD", []byte(`{}`), Orphanless(nil), env)
}

// A node agent killed midway leaves no delegate going on with the verb.
func TestAnOrphanlessDelegateDiesWithItsParent(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho $$ > " + dir + "/pid.tmp\nmv " + dir + "/pid.tmp " + dir + "/pid\nexec sleep 60\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "whereabouts"), []byte(script), 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	helper := exec.Command(self, "-test.run=^TestOrphanlessHelper$", "-test.count=1")
	helper.Env = append(os.Environ(), orphanHelperEnv+"="+dir)
	require.NoError(t, helper.Start())
	waitFor(t, filepath.Join(dir, "pid"))
	pid, err := strconv.Atoi(strings.TrimSpace(read(t, filepath.Join(dir, "pid"))))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, 0), "the delegate runs")

	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()
	assert.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 10*time.Second, 10*time.Millisecond,
		"the delegate %d outlived the process that ran it", pid)
}
