package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// GC, invoked as a delegating main plugin would (the bridge plugin v1.9.1
// does not forward GC yet), releases this node's checkpointed attachments of
// the network that cni.dev/valid-attachments does not name, and never one it names.
func TestGCReleasesWhatIsNoLongerValid(t *testing.T) {
	onEachAllocator(t, testGCReleasesWhatIsNoLongerValid)
}

func testGCReleasesWhatIsNoLongerValid(t *testing.T, e *env) {
	n := e.network(t, testcni.Network{CNIVersion: "1.1.0"})
	kept := add(t, n, e.Pod("instance-manager-kept"))
	lost := add(t, n, e.Pod("instance-manager-lost"))
	require.NoError(t, lost.Kill())

	conf := n.PluginConf()
	conf["cni.dev/valid-attachments"] = []map[string]string{{"containerID": kept.ContainerID, "ifname": "lhnet1"}}
	stdin, err := json.Marshal(conf)
	require.NoError(t, err)
	res, err := rig.Plugin(ctx(t), n, []string{"CNI_COMMAND=GC"}, stdin)
	require.NoError(t, err)
	require.Zero(t, res.Exit, "GC failed: %s %s", res.Stdout, res.Stderr)
	assert.Contains(t, res.Stderr, "released "+lost.IP()+" from pool "+n.PoolName())

	verify(t, n, []*testcni.Sandbox{kept}, kept.Pod, lost.Pod)
	_, err = os.Stat(filepath.Join("/var/lib/cni/harvester-ipam", lost.ContainerID+":lhnet1.json"))
	assert.True(t, os.IsNotExist(err), "the released attachment's checkpoint is gone")
	_, err = os.Stat(filepath.Join("/var/lib/cni/harvester-ipam", kept.ContainerID+":lhnet1.json"))
	assert.NoError(t, err, "the valid attachment's checkpoint stays")

	// Again: nothing left to do.
	res, err = rig.Plugin(ctx(t), n, []string{"CNI_COMMAND=GC"}, stdin)
	require.NoError(t, err)
	require.Zero(t, res.Exit, res.Stdout)
	verify(t, n, []*testcni.Sandbox{kept}, kept.Pod, lost.Pod)
}

// STATUS through cnitool on a 1.1.0 bridge conflist: ready while the API
// server answers, error 50 while it does not.
func TestStatus(t *testing.T) {
	inTurn(t, testStatus)
}

func testStatus(t *testing.T, e *env) {
	n := e.network(t, testcni.Network{CNIVersion: "1.1.0"})
	s, err := rig.NewSandbox(n, e.Pod("status"), "lhnet1")
	require.NoError(t, err)
	require.NoError(t, s.Status(ctx(t)))

	rig.StopAPIServer()
	err = s.Status(ctx(t))
	// cnitool does not print the code: ask the plugin itself, as bridge does.
	stdin, jerr := json.Marshal(n.PluginConf()["ipam"])
	require.NoError(t, jerr)
	stdin = []byte(`{"cniVersion":"1.1.0","name":"` + n.Name + `","type":"bridge","ipam":` + string(stdin) + `}`)
	direct, rerr := rig.Plugin(ctx(t), n, []string{"CNI_COMMAND=STATUS"}, stdin)
	require.NoError(t, rig.StartAPIServer(ctx(t)))
	require.NoError(t, rerr)
	var cniErr struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	require.NotZero(t, direct.Exit)
	require.NoError(t, json.Unmarshal([]byte(direct.Stdout), &cniErr), direct.Stdout)
	assert.EqualValues(t, 50, cniErr.Code, "plugin not available: no ADD can succeed")
	assert.Contains(t, cniErr.Msg, "IPPool store unreachable")
	var ce *testcni.CNIError
	require.ErrorAs(t, err, &ce)
	assert.NotZero(t, ce.Exit)
	t.Logf("cnitool status with the API server down:\n%s", ce.Stderr)
	assert.Contains(t, ce.Stderr, "IPPool store unreachable")
	assert.Contains(t, ce.Stderr, "connection refused")
	require.NoError(t, s.Status(ctx(t)), "ready again once the API server is back")
}
