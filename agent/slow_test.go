package agent

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	allocpkg "github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
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

// On a pool of 10,000 entries every write costs the API server a whole
// object (about 1 MiB) to decode, validate and store: 1.3-1.6 s on the
// bench's quiet machine, more on a busy one. The agent's ADD and DEL on
// such a pool, with every pool write taking 2.5 s, are served as
// whereabouts alone would serve them, however long the write (issue 46: 3
// of 39 DELs through the agent failed where whereabouts alone failed none).
// The DEL removes the entry in its turn under whereabouts' Lease, where
// every request was bounded by 2 s.
func TestAVerbOnALargePoolOfASlowServerIsServed(t *testing.T) {
	const entries, slowWrite = 10_000, 2500 * time.Millisecond
	const large = "10.10.0.0-16"
	allocs := make(map[string]alloc, entries)
	for i := 1; i <= entries; i++ {
		allocs[strconv.Itoa(i)] = alloc{ContainerID: fmt.Sprintf("x%d", i), PodRef: fmt.Sprintf("default/other-%d", i), IfName: "net1"}
	}
	r := newRig(t, fake.NewPool(large, "10.10.0.0/16", allocs))
	objs := cache.New()
	objs.SawPool(r.api.Pool("kube-system", large))
	objs.Listed("kube-system")
	r.srv.o.API = cache.API{API: r.api, Objects: objs}
	r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{}), Load: conf.Loader{Quiet: true}.Whereabouts}
	r.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Pools && (c.Verb == "patch" || c.Verb == "update") {
			select {
			case <-time.After(slowWrite):
			case <-c.Ctx.Done():
				return fmt.Errorf("%s pool %s: %w", c.Verb, c.Name, c.Ctx.Err())
			}
		}
		return nil
	}
	config := []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"storagenetwork","type":"bridge","bridge":"mgmt-br",
		"ipam":{"type":"whereabouts","range":"10.10.0.0/16","configuration_path":%q,"harvester_ipam":{"checkpoint_dir":%q}}}`, r.flat, r.cpDir))

	res := r.do(wire.Add, env("c1", "lhnet1"), config)
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "ADD: %v", res.Answer.Error)
	pool := r.api.Pool("kube-system", large)
	require.Len(t, pool.Spec.Allocations, entries+1)
	require.Equal(t, alloc{ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}, pool.Spec.Allocations["10001"])
	_, err := r.api.GetReservation(context.Background(), "kube-system", "10.10.39.17")
	require.NoError(t, err, "the ADD's reservation (offset 10,001)")

	res = r.do(wire.Del, env("c1", "lhnet1"), config)
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "DEL: %v", res.Answer.Error)
	pool = r.api.Pool("kube-system", large)
	assert.Len(t, pool.Spec.Allocations, entries, "the DEL released its entry")
	assert.Empty(t, r.api.AllReservations("kube-system"), "and its reservation")
	assert.Empty(t, r.checkpoints())
}
