package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/testcni"
)

// With the API server stopped, ADD and DEL fail with an error that says so;
// once it is back, DEL releases, and nothing leaked or was given twice.
func TestAPIServerOutage(t *testing.T) {
	inTurn(t, testAPIServerOutage)
}

func testAPIServerOutage(t *testing.T, e *env) {
	n := e.network(t, testcni.Network{})
	gone := e.Pod("instance-manager-old")
	fresh := e.Pod("instance-manager-new")
	s1 := add(t, n, gone)

	rig.StopAPIServer()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			require.NoError(t, rig.StartAPIServer(ctx(t)))
		}
	})

	s2, err := rig.NewSandbox(n, fresh, "lhnet1")
	require.NoError(t, err)
	err = s2.Add(ctx(t))
	var ce *testcni.CNIError
	require.ErrorAs(t, err, &ce, "ADD with the API server down must fail")
	assert.NotZero(t, ce.Exit)
	assert.Contains(t, ce.Stderr, "connection refused", "the error says why")
	assert.Contains(t, ce.Stderr, "the runtime retries")
	released := "release earlier sandboxes of " + fresh.Ref() + " from pool " + n.PoolName()
	if e.Agent == nil {
		assert.Contains(t, ce.Stderr, released)
	} else {
		// The agent declines once its watch of the pools has failed (its
		// copy may no longer follow) and the plugin does the work itself,
		// failing where the exec path fails; before the agent has seen its
		// watch fail, it serves, looks for earlier sandboxes in its copy,
		// finds none, and its write of the new entry fails. Either way the
		// ADD fails, saying at which pool.
		allocated := "allocate in pool " + e.PoolNamespace + "/" + n.PoolName()
		assert.True(t, strings.Contains(ce.Stderr, released) || strings.Contains(ce.Stderr, allocated),
			"the error names the step and the pool (%q or %q): %s", released, allocated, ce.Stderr)
	}

	err = s1.Del(ctx(t))
	require.ErrorAs(t, err, &ce, "DEL with the API server down must fail, so that the runtime retries")
	read := "read pool " + e.PoolNamespace + "/" + n.PoolName()
	if e.Agent == nil {
		assert.Contains(t, ce.Stderr, read)
	} else {
		// Declined, the plugin's own DEL fails reading the pool; served,
		// the agent plans on its copy and fails taking whereabouts' Lease
		// for the release.
		released := "release " + s1.ContainerID + "/lhnet1 from pool " + e.PoolNamespace + "/" + n.PoolName()
		assert.True(t, strings.Contains(ce.Stderr, read) || strings.Contains(ce.Stderr, released),
			"the error names the step and the pool (%q or %q): %s", read, released, ce.Stderr)
	}
	assert.Contains(t, ce.Stderr, "connection refused")

	require.NoError(t, rig.StartAPIServer(ctx(t)))
	restarted = true

	// What the runtime does next: DEL again, and DEL then ADD the failed sandbox.
	require.NoError(t, s1.Del(ctx(t)))
	require.NoError(t, s2.Del(ctx(t)))
	require.NoError(t, s2.Add(ctx(t)))
	verify(t, n, []*testcni.Sandbox{s2}, gone, fresh)
}

// A storm: a dozen pods at once, each crash-looping a few times. At the end
// each pod holds one address, none is held twice, and whereabouts'
// reservations agree with the pool.
func TestStorm(t *testing.T) {
	onEachAllocator(t, testStorm)
}

func testStorm(t *testing.T, e *env) {
	const pods, restarts = 12, 3
	n := e.network(t, testcni.Network{})
	live := make([]*testcni.Sandbox, pods)
	var all []testcni.Pod
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for i := 0; i < pods; i++ {
		pod := e.Pod(fmt.Sprintf("instance-manager-%02d", i))
		all = append(all, pod)
		wg.Add(1)
		go func(i int, pod testcni.Pod) {
			defer wg.Done()
			for r := 0; r <= restarts; r++ {
				if live[i] != nil {
					if err := live[i].Kill(); err != nil {
						errs <- err
						return
					}
				}
				s, err := rig.NewSandbox(n, pod, "lhnet1")
				if err != nil {
					errs <- err
					return
				}
				if err := s.Add(ctx(t)); err != nil {
					errs <- fmt.Errorf("%s restart %d: %w", pod.Ref(), r, err)
					return
				}
				live[i] = s
			}
		}(i, pod)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	allocs := mustAllocs(t, n)
	t.Logf("after %d pods x %d sandboxes at once:\n%s", pods, restarts+1, testcni.Table(allocs))
	assert.Len(t, allocs, pods)
	verify(t, n, live, all...)
}
