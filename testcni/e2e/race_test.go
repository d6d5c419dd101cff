package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/testcni"
)

// worker crash-loops one pod on one network until stop: each round the
// current sandbox either dies without DEL or is DELed, and a new one is
// ADDed; a failed ADD is DELed, as the runtime does, and tried again. A
// churning worker's pod goes away instead (see churn).
type worker struct {
	n       *testcni.Network
	pod     testcni.Pod
	rnd     *rand.Rand
	current *testcni.Sandbox
	rounds  int
	// churn makes the worker's pod really go away each round.
	churn bool
	// waited is how long, in all, a churning worker waited for the
	// reconciler to release what its dead sandboxes held.
	waited time.Duration
	// busy counts the churning workers in the middle of a round: the
	// reconciler keeps going past stop until none is.
	busy *atomic.Int32
}

func (w *worker) run(ctx context.Context, stop <-chan struct{}) error {
	if w.churn {
		return w.churnRun(ctx, stop)
	}
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if w.current != nil {
			if w.rnd.Intn(2) == 0 {
				if err := w.current.Kill(); err != nil {
					return err
				}
			} else if err := retryDel(ctx, w.current); err != nil {
				return err
			} else if err := w.current.Kill(); err != nil {
				return err
			}
			w.current = nil
		}
		if err := w.add(ctx); err != nil {
			return err
		}
		w.rounds++
	}
}

// add makes sandboxes until one's ADD succeeds: the worker's current one.
func (w *worker) add(ctx context.Context) error {
	for w.current == nil {
		s, err := rig.NewSandbox(w.n, w.pod, "lhnet1")
		if err != nil {
			return err
		}
		if err := s.Add(ctx); err != nil {
			// The runtime tears a failed sandbox down and makes another.
			if err := retryDel(ctx, s); err != nil {
				return err
			}
			if err := s.Kill(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s never got an address: %w", w.pod.Ref(), err)
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		w.current = s
	}
	return nil
}

// releaseWait bounds how long a churning worker waits for the reconciler
// (grace 2 s, a pass a second) to release its gone pod's entries.
const releaseWait = 30 * time.Second

// churnRun is a pod that really goes away, round after round, as a node's
// loss or a force-deletion takes it: its sandbox gets an address, dies
// without DEL, and the pod object is deleted; nothing but the reconciler
// releases what the sandbox held, and it must, while the other workers
// (harvester-ipam and whereabouts alone) keep writing the pool. Only then is
// the pod created again, for the next round. A round is never left half way:
// at stop, the pod exists and holds nothing.
func (w *worker) churnRun(ctx context.Context, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		w.busy.Add(1)
		err := w.churnRound(ctx)
		w.busy.Add(-1)
		if err != nil {
			return err
		}
		w.rounds++
	}
}

// churnRound is one round of churnRun.
func (w *worker) churnRound(ctx context.Context) error {
	if err := w.add(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(w.rnd.Intn(500)) * time.Millisecond):
	}
	if err := w.current.Kill(); err != nil {
		return err
	}
	w.current = nil
	if err := rig.DeletePod(ctx, w.pod); err != nil {
		return err
	}
	start := time.Now()
	for {
		allocs, err := w.n.Allocations(ctx)
		if err != nil {
			return err
		}
		held := testcni.Of(allocs, w.pod.Ref())
		if len(held) == 0 {
			break
		}
		if time.Since(start) > releaseWait {
			return fmt.Errorf("the reconciler did not release %s's entries within %s of the pod's deletion:\n%s", w.pod.Ref(), releaseWait, testcni.Table(held))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	w.waited += time.Since(start)
	return rig.CreatePod(ctx, w.pod, testcni.PodState{Phase: corev1.PodPending})
}

// crew runs workers (and any other loops) until finish.
type crew struct {
	workers []*worker
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

func start(ctx context.Context, workers []*worker) *crew {
	cr := &crew{workers: workers, stop: make(chan struct{})}
	for _, w := range workers {
		cr.goRun(func(stop <-chan struct{}) error { return w.run(ctx, stop) })
	}
	return cr
}

// goRun runs f until stop closes; its error fails the test at finish.
func (cr *crew) goRun(f func(stop <-chan struct{}) error) {
	cr.wg.Add(1)
	go func() {
		defer cr.wg.Done()
		if err := f(cr.stop); err != nil {
			cr.mu.Lock()
			cr.errs = append(cr.errs, err)
			cr.mu.Unlock()
		}
	}()
}

// finish stops everything, reports errors, and returns each worker's live sandbox.
func (cr *crew) finish(t *testing.T) []*testcni.Sandbox {
	close(cr.stop)
	cr.wg.Wait()
	for _, err := range cr.errs {
		t.Error(err)
	}
	var live []*testcni.Sandbox
	for _, w := range cr.workers {
		if w.current != nil {
			live = append(live, w.current)
		}
	}
	return live
}

// retryDel retries DEL until it succeeds, as the runtime does.
func retryDel(ctx context.Context, s *testcni.Sandbox) error {
	for {
		err := s.Del(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("DEL of %s never succeeded: %w", s.ContainerID, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var retriedRE = regexp.MustCompile(`(\d+) writes retried after conflicts`)

// Racing writers on one pool for 40 seconds (HARVESTER_IPAM_RACE_SECONDS):
// harvester-ipam ADDs and DELs, whereabouts' own ADDs and DELs, and the
// reconciler, with random sandbox deaths. Three pods (two of harvester-ipam,
// one of whereabouts alone) really go away, round after round: their
// sandboxes die without DEL and their pod objects are deleted, so the
// reconciler (grace 2 s) releases their entries while the others write. At
// the end the invariants hold for every pod.
func TestRacingWriters(t *testing.T) {
	onEachAllocator(t, testRacingWriters)
}

func testRacingWriters(t *testing.T, e *env) {
	seconds := 40
	if v, err := strconv.Atoi(os.Getenv("HARVESTER_IPAM_RACE_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	c, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second+3*time.Minute)
	defer cancel()
	rng := nextRange() // "10.99.<n>" ran past 255 once the matrix doubled the networks
	logFile := filepath.Join(rig.Dir, "race-"+e.Name+".log")
	shimmed := e.network(t, testcni.Network{Name: "race-shim-" + e.Name, Range: rng, LogFile: logFile, LogLevel: "verbose"})
	alone := e.network(t, testcni.Network{Name: "race-alone-" + e.Name, Range: rng, IPAM: "whereabouts", LogFile: logFile, LogLevel: "verbose"})
	require.Equal(t, shimmed.PoolName(), alone.PoolName(), "one pool")

	var workers []*worker
	var pods []testcni.Pod
	var busy atomic.Int32
	for i := 0; i < 10; i++ {
		n := shimmed
		if i%3 == 2 {
			n = alone
		}
		// Pods 3 and 7 (harvester-ipam's) and 8 (whereabouts alone) go away.
		churn := i == 3 || i == 7 || i == 8
		pod := e.Pod(fmt.Sprintf("race-%s-%02d", n.Name, i))
		require.NoError(t, rig.CreatePod(c, pod, testcni.PodState{Phase: corev1.PodPending}))
		if n == shimmed || churn {
			// whereabouts v0.7.0 alone leaks the addresses of sandboxes
			// that die without DEL: that is its business, not what this
			// test holds harvester-ipam to. What a gone pod held is the
			// reconciler's to release, whoever allocated it.
			pods = append(pods, pod)
		}
		workers = append(workers, &worker{n: n, pod: pod, rnd: rand.New(rand.NewSource(int64(i))), churn: churn, busy: &busy})
	}
	cr := start(c, workers)
	passes := 0
	cr.goRun(func(stop <-chan struct{}) error {
		for {
			select {
			case <-stop:
				if busy.Load() == 0 {
					return nil
				}
			default:
			}
			select {
			case <-c.Done():
				return c.Err()
			case <-time.After(time.Second):
			}
			res, err := e.Reconciler(c, "--grace", "2s")
			if err != nil || res.Exit != 0 {
				return fmt.Errorf("reconciler: %v %s %s", err, res.Stdout, res.Stderr)
			}
			passes++
		}
	})
	time.Sleep(time.Duration(seconds) * time.Second)
	live := cr.finish(t)
	rounds, churned := 0, 0
	var waited time.Duration
	for _, w := range workers {
		rounds += w.rounds
		if w.churn {
			churned += w.rounds
			waited += w.waited
			assert.Positive(t, w.rounds, "the reconciler released what %s's dead sandbox held at least once", w.pod.Ref())
		}
	}
	log, _ := os.ReadFile(logFile)
	retried := 0
	for _, m := range retriedRE.FindAllStringSubmatch(string(log), -1) {
		n, _ := strconv.Atoi(m[1])
		retried += n
	}
	meanWait := time.Duration(0)
	if churned > 0 {
		meanWait = waited / time.Duration(churned)
	}
	t.Logf("whereabouts %s, %ds: %d sandbox rounds over %d pods (7 harvester-ipam, 3 whereabouts alone), %d reconciler passes; "+
		"%d times a gone pod's entries were released by the reconciler (%s after the deletion on average); harvester-ipam retried %d writes after conflicts",
		e.WB, seconds, rounds, len(workers), passes, churned, meanWait.Round(100*time.Millisecond), retried)
	assert.Greater(t, rounds, len(workers), "every pod went round more than once")
	// Every live sandbox (whereabouts' own too) holds its one address, none
	// twice; harvester-ipam's pods and the gone ones hold nothing more.
	verify(t, shimmed, live, pods...)
}

// The API server restarts in the middle of a storm; once it is back and the
// runtime has retried what failed, the invariants hold.
func TestAPIServerRestartDuringAStorm(t *testing.T) {
	inTurn(t, testAPIServerRestartDuringAStorm)
}

func testAPIServerRestartDuringAStorm(t *testing.T, e *env) {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := e.network(t, testcni.Network{})
	var workers []*worker
	var pods []testcni.Pod
	for i := 0; i < 8; i++ {
		pod := e.Pod(fmt.Sprintf("restart-storm-%02d", i))
		pods = append(pods, pod)
		workers = append(workers, &worker{n: n, pod: pod, rnd: rand.New(rand.NewSource(int64(100 + i)))})
	}
	cr := start(c, workers)
	time.Sleep(3 * time.Second)
	rig.StopAPIServer()
	time.Sleep(2 * time.Second)
	require.NoError(t, rig.StartAPIServer(c))
	time.Sleep(3 * time.Second)
	verify(t, n, cr.finish(t), pods...)
}

// After the API server restarts (twice, a DEL made while it was down), the
// pool is deleted, as an operator or whereabouts' cleanup may: every ADD
// still succeeds and the pool is made again, as whereabouts alone makes it.
// Through the agent, whose copy held the pool at a version from before the
// restarts, the patch that finds it gone creates it again, and an agent
// whose watch failed declines until it has listed again (the plugin works
// alone meanwhile).
func TestAPoolDeletedAfterAnAPIServerRestartFailsNoADD(t *testing.T) {
	inTurn(t, testAPoolDeletedAfterAnAPIServerRestartFailsNoADD)
}

func testAPoolDeletedAfterAnAPIServerRestartFailsNoADD(t *testing.T, e *env) {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := e.network(t, testcni.Network{})
	first := e.Pod("restart-pool-first")
	gone := add(t, n, first)
	other := e.Pod("restart-pool-other")
	kept := add(t, n, other)
	for i := 0; i < 2; i++ {
		rig.StopAPIServer()
		if i == 0 {
			// A DEL while it is down fails, and the runtime retries it.
			assert.Error(t, gone.Del(c), "a DEL without the API server")
		}
		time.Sleep(time.Second)
		require.NoError(t, rig.StartAPIServer(c))
	}
	require.NoError(t, gone.Del(c), "the DEL retried")
	require.NoError(t, rig.WB.WhereaboutsV1alpha1().IPPools(n.Tenant.PoolNamespace).Delete(c, n.PoolName(), metav1.DeleteOptions{}))

	var live []*testcni.Sandbox
	pods := []testcni.Pod{first, other}
	for i := 0; i < 3; i++ {
		pod := e.Pod(fmt.Sprintf("restart-pool-after-%d", i))
		pods = append(pods, pod)
		live = append(live, add(t, n, pod))
	}
	require.NoError(t, kept.Del(c), "the DEL of a sandbox whose pool is gone")
	verify(t, n, live, pods...)
}
