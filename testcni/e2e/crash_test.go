package e2e

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// crashAt makes the crashpoints build of the plugin SIGKILL itself at a step.
func crashAt(point string) []string { return []string{"HARVESTER_IPAM_CRASH_AT=" + point} }

// Every step boundary of ADD and DEL, crashed with SIGKILL; then what the
// runtime does next (DEL the failed sandbox and ADD a new one, or retry the
// DEL) and a reconcile pass; then the invariants: one allocation per live
// sandbox, none for dead ones, no address twice, reservations matching.
//
// Through the agent, the process killed at the step is the agent (its
// crashpoints build, once), which runs the plugin's verb: the plugin sees
// the verb lost after its go-ahead and does it itself, so the verb the
// runtime ran succeeds, and the runtime has nothing to retry.
func TestCrashAtEveryStep(t *testing.T) {
	onEachAllocator(t, testCrashAtEveryStep)
}

func testCrashAtEveryStep(t *testing.T, e *env) {
	points := []struct {
		point, verb string
		nadGone     bool // DEL from the checkpoint: no delegate, harvester-ipam writes the pool
		// earlierOn is the interface of the pod's earlier sandbox (lhnet1
		// unless set): its entry on the ADD's own interface is whereabouts'
		// to hand over, so only one on another is released before the
		// delegate runs.
		earlierOn string
	}{
		{"add-after-checkpoint", "ADD", false, ""},
		{"add-after-reservations", "ADD", false, "lhnet2"}, // the reclaim deleted the reservation, not yet the entry
		{"add-after-reclaim", "ADD", false, ""},
		{"add-after-delegate", "ADD", false, ""},    // allocated, the checkpoint not updated
		{"del-after-reservations", "DEL", true, ""}, // the reservation deleted, not yet the entry
		{"del-after-release", "DEL", false, ""},     // released, the checkpoint not removed
	}
	for i, tt := range points {
		t.Run(tt.point, func(t *testing.T) {
			c := ctx(t)
			var n *testcni.Network
			log := filepath.Join(t.TempDir(), "whereabouts.log")
			if e.Agent != nil {
				n = e.network(t, testcni.Network{LogFile: log, LogLevel: "debug"})
			} else {
				n = e.network(t, testcni.Network{Crashpoints: true})
			}
			// crashingAgent hands the network's next verbs to an agent that
			// dies at the step; lost says that it took the verb and died.
			crashingAgent := func() {
				t.Helper()
				// The agent releases in one turn, the entries first:
				// killed between, the reservations are left without
				// their entries (whereabouts' own DEL's order).
				at := tt.point
				if strings.HasSuffix(at, "-after-reservations") {
					at = "release-after-entries"
				}
				n.Agent = startAgentWith(t, e.Tenant, testcni.AgentOptions{Name: tt.point, Crashpoints: true,
					Env: []string{"HARVESTER_IPAM_CRASH_AT=" + at, "HARVESTER_IPAM_CRASH_ONCE=" + filepath.Join(t.TempDir(), "crashed")}})
				require.NoError(t, os.WriteFile(log, nil, 0o600))
			}
			lost := func() {
				t.Helper()
				b, err := os.ReadFile(log)
				require.NoError(t, err)
				require.Contains(t, string(b), "node agent: read its answer: ", "the agent was killed at %s after it took the %s", tt.point, tt.verb)
			}
			pod := e.Pod(fmt.Sprintf("instance-manager-crash-%d", i))
			other := e.Pod(fmt.Sprintf("backing-image-manager-crash-%d", i))
			for _, p := range []testcni.Pod{pod, other} {
				// Pending: live to the reconciler whatever happens.
				require.NoError(t, rig.CreatePod(c, p, testcni.PodState{Phase: corev1.PodPending}))
			}
			bystander := add(t, n, other)
			first, err := rig.NewSandbox(n, pod, cmp.Or(tt.earlierOn, "lhnet1"))
			require.NoError(t, err)
			require.NoError(t, first.Add(c), "ADD of a sandbox of %s", pod.Ref())
			live := []*testcni.Sandbox{bystander}

			switch tt.verb {
			case "ADD":
				require.NoError(t, first.Kill(), "the earlier sandbox died without DEL")
				require.NoError(t, n.WaitCached(c, first), "the reclaim must see the earlier sandbox to reach every step")
				s, err := rig.NewSandbox(n, pod, "lhnet1")
				require.NoError(t, err)
				if e.Agent != nil {
					crashingAgent()
					require.NoError(t, s.Add(c), "ADD with the agent killed at %s: the plugin does it", tt.point)
					lost()
					live = append(live, s)
					break
				}
				s.Env = crashAt(tt.point)
				err = s.Add(c)
				require.Error(t, err, "ADD must fail when the plugin is killed")
				// A killed plugin prints no CNI error: libcni says so.
				require.Contains(t, err.Error(), "netplugin failed", "killed at %s", tt.point)
				// The runtime tears the failed sandbox down, then tries a new one.
				s.Env = nil
				require.NoError(t, s.Del(c), "DEL of the crashed sandbox")
				live = append(live, add(t, n, pod))
			case "DEL":
				// The agent leaves a DEL without a config to the plugin:
				// through it, the DEL keeps its config and is the agent's.
				if tt.nadGone && e.Agent == nil {
					require.NoError(t, n.ForgetIPAM())
				}
				if e.Agent != nil {
					crashingAgent()
					require.NoError(t, first.Del(c), "DEL with the agent killed at %s: the plugin does it", tt.point)
					lost()
					break
				}
				first.Env = crashAt(tt.point)
				err := first.Del(c)
				require.Error(t, err, "DEL must fail when the plugin is killed")
				require.Contains(t, err.Error(), "netplugin failed", "killed at %s", tt.point)
				first.Env = nil
				require.NoError(t, first.Del(c), "the runtime retries DEL")
			}
			// The plugin alone brings every case back: the runtime's next step suffices.
			verify(t, n, live, pod, other)
			// And a reconcile pass finds nothing to undo.
			e.reconcile(t, "--grace", "0s")
			verify(t, n, live, pod, other)
		})
	}
}
