package agent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/agent/client"
	"github.com/harvester/harvester-ipam/agent/wire"
)

// busyNode keeps a CPU of this process busy until the test ends, as a node
// busy with everything else keeps the agent's threads running or waiting
// for a CPU: the kernel never sees the agent idle.
func busyNode(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
}

// An agent slowed down far past the plugin's old bound (each frame it
// writes, its receipt first, 2 s late), on a node kept busy, serves every
// ADD and every DEL a plugin hands it, with the plugin's default client:
// none goes to the exec path, each ADD allocates once (one entry each in
// the pool), and each DEL releases its own. Before, the plugin waited
// 100 ms for the receipt and did every one of these itself.
func TestASlowAgentOnABusyNodeServesEveryVerb(t *testing.T) {
	const n, slow = 8, 2 * time.Second
	r := newRig(t)
	r.srv.o.BeforeWrite = func(string) { time.Sleep(slow) }
	busyNode(t)
	plugin := &client.Client{Socket: r.l.Path()}
	verbs := func(command string) []client.Result {
		results := make([]client.Result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("c%d", i)
				e := env(id, "lhnet1")
				e[wire.EnvArgs] = "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=" + id
				results[i] = plugin.Do(t.Context(), wire.NewRequest(command, e, r.config("0.3.1", "")))
			}()
		}
		wg.Wait()
		return results
	}
	for i, res := range verbs(wire.Add) {
		require.Equal(t, client.Served, res.Outcome, "ADD %d: %s", i, res.Reason)
		require.Nil(t, res.Answer.Error, "ADD %d", i)
	}
	pods := map[string]string{}
	for off, a := range r.pool() {
		assert.Empty(t, pods[a.PodRef], "%s holds two entries", a.PodRef)
		pods[a.PodRef] = off
	}
	assert.Len(t, pods, n, "one entry per ADD: %v", r.pool())
	r.counted(wire.Add, outcomeServed, "", n)

	for i, res := range verbs(wire.Del) {
		require.Equal(t, client.Served, res.Outcome, "DEL %d: %s", i, res.Reason)
		require.Nil(t, res.Answer.Error, "DEL %d", i)
	}
	assert.Empty(t, r.pool())
	assert.Empty(t, r.checkpoints())
	r.counted(wire.Del, outcomeServed, "", n)
	assert.Zero(t, r.count(wire.Add, outcomeAbandoned, "")+r.count(wire.Del, outcomeAbandoned, ""), "no client gave up")
}
