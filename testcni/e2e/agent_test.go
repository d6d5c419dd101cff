package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// The node agent, as a node's plugin meets it: cnitool runs harvester-ipam
// (standing in for whereabouts), which hands each verb to the agent while
// it serves, and does the verb itself while the agent is killed (its socket
// left behind, refusing), stalled (SIGSTOP: connections queue and nothing
// acknowledges them) or back. Whatever the agent's state, every verb
// succeeds and the pool holds one entry per live attachment, none for the
// deleted ones; the agent's own counts say which verbs it served.
func TestTheNodeAgentServesAndThePluginCoversForIt(t *testing.T) {
	onEachAllocatorExecOnly(t, "the agent's own test: it starts, kills and stalls its agent", func(t *testing.T, e *env) {
		a := startAgent(t, e.Tenant)
		n := e.network(t, testcni.Network{Agent: a})
		var live []*testcni.Sandbox
		var pods []testcni.Pod
		next := 0
		addPod := func() {
			t.Helper()
			next++
			pod := e.Pod(fmt.Sprintf("instance-manager-%d", next))
			pods = append(pods, pod)
			live = append(live, add(t, n, pod))
		}
		delFirst := func() {
			t.Helper()
			require.NoError(t, live[0].Del(ctx(t)), "DEL of %s", live[0].Pod.Ref())
			live = live[1:]
		}
		served := func(want map[string]int) {
			t.Helper()
			got, err := a.Requests(ctx(t))
			require.NoError(t, err)
			for k, v := range want {
				assert.Equal(t, v, got[k], "the agent's count of %q (all: %v)", k, got)
			}
		}

		// Up: the agent serves.
		for i := 0; i < 3; i++ {
			addPod()
		}
		delFirst()
		served(map[string]int{"ADD served": 3, "DEL served": 1})
		verify(t, n, live, pods...)

		// Killed: its socket stays and refuses; the plugin works alone.
		a.Kill()
		addPod()
		addPod()
		delFirst()
		verify(t, n, live, pods...)

		// Back (a new process: its counts start again).
		require.NoError(t, a.Start(ctx(t)))
		addPod()
		delFirst()
		served(map[string]int{"ADD served": 1, "DEL served": 1})
		verify(t, n, live, pods...)

		// Stalled: no acknowledgement comes; the plugin gives up on it
		// after the bound and works alone. Let go, the agent finds those
		// clients gone and does nothing for them.
		require.NoError(t, a.Pause())
		addPod()
		delFirst()
		require.NoError(t, a.Resume())
		require.Eventually(t, func() bool {
			got, err := a.Requests(ctx(t))
			return err == nil && got["ADD abandoned"] == 1 && got["DEL abandoned"] == 1
		}, 30*time.Second, 50*time.Millisecond, "the stalled agent, let go, abandons what it was handed")
		served(map[string]int{"ADD served": 1, "DEL served": 1})
		verify(t, n, live, pods...)

		// And all gone: nothing left of any of them.
		for len(live) > 0 {
			delFirst()
		}
		verify(t, n, nil, pods...)
		assert.Empty(t, mustORIPs(t, n), "no reservation left")
	})
}

// The agent killed in the middle of a storm of ADDs: every ADD succeeds
// (those the agent never took by the plugin alone, those it took and lost
// after releasing what the attachment may hold), and no pod holds two
// addresses. It dies right after its allocator wrote the first group of
// ADDs to the pool (its crashpoints build, once): with group commit, a kill
// at a moment chosen from outside met none under way when the machine was
// loaded (all twelve answered at once).
func TestAnAgentKilledInAStormFailsNoADD(t *testing.T) {
	onEachAllocatorExecOnly(t, "the agent's own test: it starts the agent it kills", func(t *testing.T, e *env) {
		a := startAgentWith(t, e.Tenant, testcni.AgentOptions{Crashpoints: true,
			Env: []string{"HARVESTER_IPAM_CRASH_AT=alloc-after-patch", "HARVESTER_IPAM_CRASH_ONCE=" + filepath.Join(t.TempDir(), "crashed")}})
		log := filepath.Join(t.TempDir(), "whereabouts.log")
		n := e.network(t, testcni.Network{Agent: a, LogFile: log, LogLevel: "debug"})
		const storm = 12
		pods := make([]testcni.Pod, storm)
		live := make([]*testcni.Sandbox, storm)
		errs := make([]error, storm)
		var wg sync.WaitGroup
		for i := range storm {
			pods[i] = e.Pod(fmt.Sprintf("instance-manager-%d", i))
			s, err := rig.NewSandbox(n, pods[i], "lhnet1")
			require.NoError(t, err)
			live[i] = s
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Add(ctx(t))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "ADD of %s", pods[i].Ref())
		}
		verify(t, n, live, pods...)
		b, err := os.ReadFile(log)
		require.NoError(t, err)
		// The plugin's debug log says why the agent did not serve a verb,
		// once a verb: "... harvester-ipam ADD <container>: node agent: ...".
		lost := strings.Count(string(b), "node agent: read its answer: ")
		t.Logf("%d of %d ADDs were under way in the agent when it was killed", lost, storm)
		assert.Positive(t, lost, "the kill met ADDs the agent had taken: what this test is about")
	})
}

// An ADD the agent took and lost after it allocated (the agent killed
// before its answer): the plugin releases what the attachment holds, then
// allocates as ever. The pod ends with exactly one address, the one its ADD
// returned, and one reservation, on every version: v0.7.0 never hands back
// an existing entry, and would give it a second. The agent is killed where
// its allocator has written the entry, and where it has written the
// reservation too; and, running the whereabouts binary instead
// (--exec-whereabouts), right after that binary allocated.
func TestALostAddLeavesThePodOneAddress(t *testing.T) {
	onEachAllocatorExecOnly(t, "the agent's own test: it starts the agents it kills", func(t *testing.T, e *env) {
		for _, kill := range []string{"alloc-after-patch", "alloc-after-reserve", "after whereabouts"} {
			t.Run(kill, func(t *testing.T) {
				var a *testcni.Agent
				var bin string
				if kill == "after whereabouts" {
					a = startAgentWith(t, e.Tenant, testcni.AgentOptions{Name: "exec", Args: []string{"--exec-whereabouts"}})
					var err error
					bin, err = rig.AgentKillerDir(e.WB)
					require.NoError(t, err)
				} else {
					a = startAgentWith(t, e.Tenant, testcni.AgentOptions{Name: kill, Crashpoints: true,
						Env: []string{"HARVESTER_IPAM_CRASH_AT=" + kill, "HARVESTER_IPAM_CRASH_ONCE=" + filepath.Join(t.TempDir(), "crashed")}})
				}
				log := filepath.Join(t.TempDir(), "whereabouts.log")
				n := e.network(t, testcni.Network{Agent: a, BinDir: bin, LogFile: log, LogLevel: "debug"})
				pod := e.Pod("instance-manager-lost")
				s := add(t, n, pod)
				b, err := os.ReadFile(log)
				require.NoError(t, err)
				require.Contains(t, string(b), "node agent: read its answer: ", "the agent was killed after it took the ADD")
				verify(t, n, []*testcni.Sandbox{s}, pod)
				assert.Len(t, testcni.Of(mustAllocs(t, n), pod.Ref()), 1)
				assert.Len(t, oripsOf(t, n, pod.Ref()), 1)
				require.NoError(t, s.Del(ctx(t)))
				verify(t, n, nil, pod)
			})
		}
	})
}
