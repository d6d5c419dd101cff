package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	allocpkg "github.com/harvester/harvester-ipam/agent/alloc"
	"github.com/harvester/harvester-ipam/agent/cache"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

type alloc = whereaboutsv1alpha1.IPAllocation

const (
	poolName = "192.168.50.0-24"
	podArgs  = "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-a"
)

// rig is an agent serving a socket of its own, on an in-memory API server,
// with a model of whereabouts as its allocator.
type rig struct {
	t       *testing.T
	api     *fake.API
	wb      *fake.Whereabouts
	srv     *Server
	l       *Listener
	c       *client.Client
	reg     *prometheus.Registry
	metrics *Metrics
	dir     string
	cpDir   string
	flat    string
	log     syncBuffer
	alloc   *wbAllocator
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// kubeconfig is whereabouts' kubeconfig, of the given namespace; the agent
// reads only that.
func kubeconfig(t *testing.T, dir, ns string) string {
	p := filepath.Join(dir, ns+".kubeconfig")
	nsLine := ""
	if ns != "" {
		nsLine = ", namespace: " + ns
	}
	require.NoError(t, os.WriteFile(p, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: whereabouts-t0ken}}]
contexts: [{name: w, context: {cluster: c, user: u`+nsLine+`}}]
current-context: w
`), 0o600))
	return p
}

func newRig(t *testing.T, objs ...any) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, api: fake.New(), dir: dir, cpDir: filepath.Join(dir, "checkpoints"), flat: filepath.Join(dir, "whereabouts.conf")}
	r.api.Put(objs...)
	kc := kubeconfig(t, dir, "kube-system")
	require.NoError(t, os.WriteFile(r.flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"`+kc+`"},"log_file":"`+filepath.Join(dir, "whereabouts.log")+`","log_level":"debug"}`), 0o600))
	opts := shim.Options{Backoff: shim.Backoff{Steps: 6, Duration: time.Millisecond, Factor: 2}, LeaseRetry: time.Millisecond}
	r.wb = &fake.Whereabouts{API: r.api, Version: fake.V093, Namespace: "kube-system", Options: opts}
	r.alloc = &wbAllocator{wb: r.wb}
	r.reg = prometheus.NewRegistry()
	r.metrics = NewMetrics(r.reg)
	// The agent's requests share one holder of the Lease, as its main sets.
	agentOpts := opts
	agentOpts.Group = &shim.Group{Identity: "harvester-ipam-agent/n1/1"}
	r.start(Options{API: r.api, Namespaces: []string{"kube-system"}, Node: "n1", Allocator: r.alloc,
		Log: &r.log, Metrics: r.metrics, StoreOptions: agentOpts, CheckpointDirs: []string{r.cpDir}, LogRequests: true})
	return r
}

// shortDir is a directory for sockets: a socket's path holds at most 107
// bytes, and t.TempDir's names the test.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "hia")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (r *rig) start(o Options) {
	t := r.t
	srv, err := New(o)
	require.NoError(t, err)
	require.NoError(t, srv.Check(context.Background()))
	l, err := Listen(filepath.Join(shortDir(t), "run", "agent.sock"))
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { l.Close() })
	r.srv, r.l = srv, l
	r.c = &client.Client{Socket: l.Path()}
}

// config is the storage network's config; ipamExtra is added to its ipam.
func (r *rig) config(version, ipamExtra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"storagenetwork","type":"bridge","bridge":"mgmt-br",
		"ipam":{"type":"whereabouts","range":"192.168.50.0/24","exclude":["192.168.50.1/32"],
		"configuration_path":%q,"log_level":"verbose","harvester_ipam":{"checkpoint_dir":%q}%s}}`, version, r.flat, r.cpDir, ipamExtra))
}

func env(id, ifname string) map[string]string {
	return map[string]string{wire.EnvContainerID: id, wire.EnvIfName: ifname, wire.EnvArgs: podArgs,
		wire.EnvNetns: "/var/run/netns/x", wire.EnvPath: "/opt/cni/bin"}
}

func (r *rig) do(command string, e map[string]string, config []byte) client.Result {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.c.Do(ctx, wire.NewRequest(command, e, config))
}

func (r *rig) pool() map[string]alloc {
	p := r.api.Pool("kube-system", poolName)
	if p == nil || p.Spec.Allocations == nil {
		return map[string]alloc{}
	}
	return p.Spec.Allocations
}

// checkpoints are the attachments' records (an ADD in flight marks itself
// beside its record, in a file of its own).
func (r *rig) checkpoints() []string {
	var out []string
	entries, _ := os.ReadDir(r.cpDir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}

func (r *rig) count(command, outcome, reason string) float64 {
	return testutil.ToFloat64(r.metrics.requests.WithLabelValues(command, outcome, reason))
}

// counted waits until a count reaches want: the agent counts a verb it did
// after it answered.
func (r *rig) counted(command, outcome, reason string, want float64) {
	r.t.Helper()
	assert.Eventually(r.t, func() bool { return r.count(command, outcome, reason) == want }, 10*time.Second, time.Millisecond,
		"%s %s (%s): %v, want %v", command, outcome, reason, r.count(command, outcome, reason), want)
}

// wbAllocator allocates with the model of whereabouts, as the allocator
// of the agent would: the seam's contract.
type wbAllocator struct {
	wb      *fake.Whereabouts
	decline string
	// admitDelay is how long its part of admission takes (a node so busy
	// that reading whereabouts' config costs that).
	admitDelay time.Duration
	// block, when set, is waited on before allocating (or ctx's end).
	block  chan struct{}
	ctxErr chan error
}

func (a *wbAllocator) Declines(*conf.Config, *skel.CmdArgs) string {
	time.Sleep(a.admitDelay)
	return a.decline
}

func (a *wbAllocator) Add(ctx context.Context, _ *shim.Store, cfg *conf.Config, args *skel.CmdArgs) (cnitypes.Result, error) {
	if a.block != nil {
		select {
		case <-a.block:
		case <-ctx.Done():
			if a.ctxErr != nil {
				a.ctxErr <- ctx.Err()
			}
			return nil, ctx.Err()
		}
	}
	pod, err := conf.ParseArgs(args.Args)
	if err != nil {
		return nil, err
	}
	r := cfg.IPAM.IPRanges[0]
	ip, err := a.wb.Add(ctx, fake.Request{ContainerID: args.ContainerID, IfName: args.IfName, PodRef: pod.Ref(),
		Range: r.Range, Exclude: r.OmitRanges, NetworkName: cfg.IPAM.NetworkName})
	if err != nil {
		return nil, &cnitypes.Error{Code: cnitypes.ErrInternal, Msg: err.Error()}
	}
	_, ipn, _ := net.ParseCIDR(r.Range)
	ipn.IP = ip
	return &current.Result{CNIVersion: current.ImplementedSpecVersion, IPs: []*current.IPConfig{{Address: *ipn}}}, nil
}

func TestTheAgentServesAddAndDel(t *testing.T) {
	r := newRig(t)
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error)
	assert.JSONEq(t, `{"cniVersion":"0.3.1","ips":[{"version":"4","address":"192.168.50.2/24"}],"dns":{}}`, string(res.Answer.Stdout))
	assert.Equal(t, map[string]alloc{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool())
	assert.Equal(t, []string{"c1:lhnet1.json"}, r.checkpoints(), "the checkpoint the plugin writes")

	res = r.do(wire.Del, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error)
	assert.Empty(t, r.pool())
	assert.Empty(t, r.checkpoints())
	r.counted(wire.Add, outcomeServed, "", 1)
	r.counted(wire.Del, outcomeServed, "", 1)
	assert.Contains(t, r.metrics.Summary(), "2 served")
	// Any duration a fast or a slow machine prints (rounded to 10µs: 940µs, 4.08ms, 1.2s).
	const took = `[0-9.]+(µs|ms|s)`
	assert.Regexp(t, `ADD c1/lhnet1: served in `+took+` \(read `+took+`, admit `+took+`, go `+took+`, verb `+took+`, answer `+took+`\)\n`, r.log.String())
	assert.Regexp(t, `DEL c1/lhnet1: served in `+took+` \(read `+took+`, admit `+took+`, go `+took+`, verb `+took+`, answer `+took+`\)\n`, r.log.String())
	assert.Equal(t, "", r.metrics.Summary(), "a summary covers what happened since the last")
}

// A DEL whose config no longer reads (the NAD is gone, and the runtime hands
// what it kept of it: no ipam, a field of the wrong type) is the agent's all
// the same when it holds the attachment's checkpoint: it releases by it, as
// the plugin would. Without a checkpoint, it leaves the DEL to the plugin.
func TestTheAgentServesADelByItsCheckpointWhenTheConfigDoesNotRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(r *rig) string
	}{
		{"no ipam", func(r *rig) string { return `{"cniVersion":"0.3.1","name":"storagenetwork","type":"bridge"}` }},
		{"a field of the wrong type", func(r *rig) string {
			return strings.Replace(string(r.config("0.3.1", "")), `"range":"192.168.50.0/24"`, `"range":42`, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Len(t, r.pool(), 1)

			// The checkpoint is where the agent's DEL finds it: in the
			// default directory when the config names none any more.
			cfg := tc.config(r)
			if !strings.Contains(cfg, r.cpDir) {
				r.srv.o.CheckpointDirs = append(r.srv.o.CheckpointDirs, conf.DefaultCheckpointDir)
				cfg = strings.Replace(cfg, `"type":"bridge"`, `"type":"bridge","ipam":{"harvester_ipam":{"checkpoint_dir":"`+r.cpDir+`"}}`, 1)
			}
			res = r.do(wire.Del, env("c1", "lhnet1"), []byte(cfg))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error)
			assert.Empty(t, r.pool(), "released by the checkpoint")
			assert.Empty(t, r.checkpoints())

			res = r.do(wire.Del, env("c2", "lhnet1"), []byte(cfg))
			assert.Equal(t, client.Fallback, res.Outcome, "no checkpoint of c2: the plugin's")
			assert.Contains(t, res.Reason, "no checkpoint of the attachment")
		})
	}
}

// A verb that fails in the agent is answered with the plugin's CNI error,
// and its log comes back for the plugin's stderr.
func TestAFailedVerbIsAnsweredWithItsCNIError(t *testing.T) {
	r := newRig(t)
	res := r.do(wire.Check, env("c1", "lhnet1"), r.config("0.4.0", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.NotNil(t, res.Answer.Error)
	assert.Equal(t, uint(cnitypes.ErrInvalidNetworkConfig), res.Answer.Error.Code)
	assert.Equal(t, "CHECK needs a prevResult", res.Answer.Error.Msg)
	r.counted(wire.Check, outcomeFailed, "", 1)
}

func TestTheAgentDeclinesWhatItDoesNotServe(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command string
		env     func(r *rig) map[string]string
		config  func(r *rig) []byte
		before  func(r *rig)
		reason  string
		want    string
	}{
		{"node slices", wire.Add, nil, func(r *rig) []byte { return r.config("0.3.1", `,"node_slice_size":"/26"`) }, nil, "node_slice_size", "node_slice_size"},
		{"an unknown ipam field", wire.Add, nil, func(r *rig) []byte { return r.config("0.3.1", `,"ip_family":"v4"`) }, nil, "field", `ipam field "ip_family" is unknown`},
		{"a field in another case", wire.Add, nil, func(r *rig) []byte { return r.config("0.3.1", `,"Range":"10.0.0.0/8"`) }, nil, "field", `ipam field "Range"`},
		{"a config that does not load", wire.Add, nil, func(r *rig) []byte { return r.config("0.3.1", `,"routes":[{"dst":"x"}]`) }, nil, "config", "config: "},
		{"a config without a range", wire.Del, nil, func(r *rig) []byte {
			return []byte(`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"whereabouts","configuration_path":"` + r.flat + `"}}`)
		}, nil, "config", "config names no range"},
		{"a CNI version the plugin does not answer", wire.Add, nil, func(r *rig) []byte { return r.config("9.9.9", "") }, nil, "version", `cniVersion "9.9.9"`},
		{"no pod in CNI_ARGS", wire.Add, func(r *rig) map[string]string {
			e := env("c1", "lhnet1")
			e[wire.EnvArgs] = "IgnoreUnknown=true"
			return e
		}, nil, nil, "config", "CNI_ARGS"},
		{"the guard", wire.Add, func(r *rig) map[string]string {
			e := env("c1", "lhnet1")
			e[wire.EnvGuard] = "1"
			return e
		}, nil, nil, "guard", "started as a delegate of harvester-ipam"},
		{"another pool namespace", wire.Add, nil, func(r *rig) []byte {
			return r.config("0.3.1", `,"kubernetes":{"kubeconfig":"`+kubeconfig(r.t, r.dir, "tenant-a")+`"}`)
		}, nil, "namespace", "pool namespace tenant-a is not served here (this agent serves kube-system)"},
		{"a kubeconfig that does not read", wire.Add, nil, func(r *rig) []byte {
			return r.config("0.3.1", `,"kubernetes":{"kubeconfig":"`+r.dir+`/missing"}`)
		}, nil, "kubeconfig", "kubeconfig: "},
		{"a DEL whose checkpoint names another namespace", wire.Del, nil, nil, func(r *rig) {
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "c1", IfName: "lhnet1", Namespace: "tenant-a",
				Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
		}, "namespace", "the checkpoint names pool namespace tenant-a"},
		{"what the allocator declines", wire.Add, nil, nil, func(r *rig) { r.alloc.decline = "range_start beyond the range" }, "allocator", "range_start beyond the range"},
		{"a checkpoint directory not the agent's", wire.Add, nil, func(r *rig) []byte {
			return []byte(strings.Replace(string(r.config("0.3.1", "")), r.cpDir, r.dir+"/elsewhere", 1))
		}, nil, "checkpoint", "checkpoint directory " + "/tmp/"},
		{"a delegate the agent does not see", wire.Add, func(r *rig) map[string]string {
			e := env("c1", "lhnet1")
			e[wire.EnvPath] = r.dir + "/no-bin"
			return e
		}, nil, func(r *rig) { r.srv.o.Allocator = nil }, "delegate", "delegate whereabouts: failed to find plugin"},
		{"a GC whose delegate the agent does not see", wire.GC, func(r *rig) map[string]string {
			e := env("", "")
			e[wire.EnvPath] = r.dir + "/no-bin"
			return e
		}, func(r *rig) []byte { return r.config("1.1.0", "") }, nil, "delegate", "delegate whereabouts: failed to find plugin"},
		{"a stopping agent", wire.Add, nil, nil, func(r *rig) { r.srv.stopping.Store(true) }, "stopping", "stopping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, fake.NewPool(poolName, "192.168.50.0/24", map[string]alloc{"5": {ContainerID: "x", PodRef: "ns/x"}}))
			e, config := env("c1", "lhnet1"), r.config("0.3.1", "")
			if tc.env != nil {
				e = tc.env(r)
			}
			if tc.config != nil {
				config = tc.config(r)
			}
			if tc.before != nil {
				tc.before(r)
			}
			cps := r.checkpoints()
			res := r.do(tc.command, e, config)
			assert.Equal(t, client.Fallback, res.Outcome)
			assert.Contains(t, res.Reason, "node agent declined: "+tc.want)
			assert.Equal(t, 1.0, r.count(tc.command, outcomeDeclined, tc.reason), "declined for %s", tc.reason)
			assert.Contains(t, r.log.String(), ": declined in ", "logged")
			assert.Len(t, r.pool(), 1, "nothing written")
			assert.Equal(t, cps, r.checkpoints(), "nothing written")
		})
	}
}

// A DEL of an attachment whose ADD the agent is still doing waits for it,
// then releases what it wrote: run beside it, it would look before the write
// and leave the entry behind.
func TestADelWaitsForTheAddOfItsAttachment(t *testing.T) {
	r := newRig(t)
	r.alloc.block = make(chan struct{})
	added := make(chan client.Result)
	go func() { added <- r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the ADD is under way")
	deleted := make(chan client.Result)
	go func() { deleted <- r.do(wire.Del, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	select {
	case res := <-deleted:
		t.Fatalf("the DEL answered while its attachment's ADD ran: %+v", res)
	case <-time.After(200 * time.Millisecond):
	}
	// Another attachment's DEL does not wait.
	other := r.do(wire.Del, env("c2", "lhnet1"), r.config("0.3.1", ""))
	assert.Equal(t, client.Served, other.Outcome, other.Reason)
	close(r.alloc.block)
	require.Equal(t, client.Served, (<-added).Outcome)
	require.Equal(t, client.Served, (<-deleted).Outcome)
	assert.Empty(t, r.pool(), "the DEL released what the ADD wrote")
	assert.Empty(t, r.checkpoints())
}

// Beyond MaxInFlight requests at once, a request waits for a slot, up to
// QueueTimeout: a burst stays with the agent rather than fall back to the
// plugin's slower way. One that waits longer is declined (busy); the plugin
// then works alone.
func TestABusyAgentQueuesForAWhileThenDeclines(t *testing.T) {
	r := newRig(t)
	r.srv.slots = make(chan struct{}, 1)
	r.srv.o.QueueTimeout = 300 * time.Millisecond
	r.alloc.block = make(chan struct{})
	first := make(chan client.Result)
	go func() { first <- r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the first ADD holds the slot")

	start := time.Now()
	res := r.do(wire.Add, env("c2", "lhnet1"), r.config("0.3.1", ""))
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Equal(t, "node agent declined: busy: 1 requests in flight", res.Reason)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited for a slot")
	r.counted(wire.Add, outcomeDeclined, "busy", 1)

	// A slot freed within the wait: served.
	queued := make(chan client.Result)
	e := env("c3", "lhnet1")
	e[wire.EnvArgs] = "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-c"
	go func() { queued <- r.do(wire.Add, e, r.config("0.3.1", "")) }()
	time.Sleep(100 * time.Millisecond)
	close(r.alloc.block)
	assert.Equal(t, client.Served, (<-first).Outcome)
	res = <-queued
	assert.Equal(t, client.Served, res.Outcome, res.Reason)
	assert.Len(t, r.pool(), 2)
}

// An agent that is alive and reading takes a request however long its
// admission takes on a busy node (the config, the kubeconfig, the
// checkpoint read; here the allocator's part): it acknowledges receipt as
// soon as it has read the request, and from then on the verb is its to
// decide. Before the receipt, the acknowledgement came after admission,
// past the plugin's bound of the time: the plugin had gone on alone, and
// the agent counted the request abandoned.
func TestASlowAdmissionIsServed(t *testing.T) {
	r := newRig(t)
	r.alloc.admitDelay = 300 * time.Millisecond
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error)
	r.counted(wire.Add, outcomeServed, "", 1)
	assert.Zero(t, r.count(wire.Add, outcomeAbandoned, ""))
}

// A burst on one node (48 ADDs at once, 4 slots, each admission costing a
// busy node's time) is the agent's whole, however busy the machine the
// test runs on: every ADD is served by the agent (none declined, none
// abandoned by its client, none left to the exec path), and each pod holds
// one address, the one its ADD answered. How fast is the bench's to say.
func TestABurstIsServedWhole(t *testing.T) {
	const n = 48
	r := newRig(t)
	r.srv.slots = make(chan struct{}, 4)
	// The queue's own bound (2 s) is not what this holds: a machine busy
	// enough makes 44 ADDs' admissions longer than that.
	r.srv.o.QueueTimeout = time.Hour
	r.alloc.admitDelay = 5 * time.Millisecond
	results := make([]client.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", i)
			e := env(id, "lhnet1")
			e[wire.EnvArgs] = "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=" + id
			results[i] = r.do(wire.Add, e, r.config("0.3.1", ""))
		}()
	}
	wg.Wait()
	answered := map[string]string{} // pod: the address its ADD answered
	for i, res := range results {
		require.Equal(t, client.Served, res.Outcome, "ADD %d: %s", i, res.Reason)
		require.Nil(t, res.Answer.Error, "ADD %d", i)
		var out struct {
			IPs []struct{ Address string } `json:"ips"`
		}
		require.NoError(t, json.Unmarshal(res.Answer.Stdout, &out), "ADD %d: %s", i, res.Answer.Stdout)
		require.Len(t, out.IPs, 1, "ADD %d", i)
		answered[fmt.Sprintf("longhorn-system/c%d", i)] = out.IPs[0].Address
	}
	held := map[string]string{} // pod: the address its entry holds
	for off, a := range r.pool() {
		require.Empty(t, held[a.PodRef], "%s holds two entries", a.PodRef)
		held[a.PodRef] = "192.168.50." + off + "/24"
	}
	assert.Equal(t, answered, held, "each pod one address, the one it was answered")
	r.counted(wire.Add, outcomeServed, "", n)
	assert.Zero(t, r.count(wire.Add, outcomeDeclined, "busy"))
	assert.Zero(t, r.count(wire.Add, outcomeAbandoned, ""))
}

// A client that gives up waiting for the decision (the agent waits for a
// slot, and the verb's deadline comes first) works alone: nothing is
// written for it, whenever the slot comes.
func TestAClientThatGivesUpWhileQueuedGetsNothingWritten(t *testing.T) {
	r := newRig(t)
	r.srv.slots = make(chan struct{}, 1)
	r.srv.o.QueueTimeout = 10 * time.Second
	r.alloc.block = make(chan struct{})
	first := make(chan client.Result)
	go func() { first <- r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the first ADD holds the slot")

	e := env("c2", "lhnet1")
	e[wire.EnvArgs] = "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-b"
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res := r.c.Do(ctx, wire.NewRequest(wire.Add, e, r.config("0.3.1", "")))
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Equal(t, "node agent: no decision before the verb ended (context deadline exceeded)", res.Reason)
	close(r.alloc.block)
	assert.Equal(t, client.Served, (<-first).Outcome)
	r.counted(wire.Add, outcomeAbandoned, "", 1)
	assert.Contains(t, r.log.String(), "the client left while it waited for a slot")
	assert.Equal(t, map[string]alloc{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool(), "nothing written for c2")
	assert.Equal(t, []string{"c1:lhnet1.json"}, r.checkpoints())
}

// A stopping agent declines the requests waiting for a slot at once: the
// plugin works alone rather than wait for an agent on its way out.
func TestAStopDeclinesTheQueuedAtOnce(t *testing.T) {
	r := newRig(t)
	r.srv.slots = make(chan struct{}, 1)
	r.srv.o.QueueTimeout = 10 * time.Second
	r.alloc.block = make(chan struct{})
	first := make(chan client.Result)
	go func() { first <- r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the first ADD holds the slot")
	queued := make(chan client.Result)
	go func() { queued <- r.do(wire.Add, env("c2", "lhnet1"), r.config("0.3.1", "")) }()
	time.Sleep(100 * time.Millisecond)
	stopped := make(chan error)
	go func() { stopped <- r.srv.Stop(context.Background()) }()
	select {
	case res := <-queued:
		assert.Equal(t, client.Fallback, res.Outcome)
		assert.Equal(t, "node agent declined: stopping", res.Reason)
	case <-time.After(5 * time.Second):
		t.Fatal("the queued request still waits")
	}
	close(r.alloc.block)
	assert.Equal(t, client.Served, (<-first).Outcome, "what it took, it finishes")
	require.NoError(t, <-stopped)
}

// A plugin of the build before (protocol version 1) meets a new agent
// during a rollout: it is served as that build's agent served it, every
// frame in version 1 and no receipt (which it would take for a malformed
// acknowledgement); beyond the slots, it is declined at once, since it
// waits only 100 ms from before its connect.
// A config of any CNI version whereabouts answers is served, and answered in
// its version, as whereabouts would (its own end-to-end suite's NADs say
// 0.3.0; a 0.2.0 result has an ip4 object, not a list of ips).
func TestEveryCNIVersionWhereaboutsAnswersIsServed(t *testing.T) {
	for i, v := range []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t)
			res := r.do(wire.Add, env(fmt.Sprintf("c%d", i), "lhnet1"), r.config(v, ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error)
			var out map[string]any
			require.NoError(t, json.Unmarshal(res.Answer.Stdout, &out), "%s", res.Answer.Stdout)
			assert.Equal(t, v, out["cniVersion"], "answered in the config's version: %s", res.Answer.Stdout)
			assert.Contains(t, string(res.Answer.Stdout), "192.168.50.2/24")
		})
	}
}

func TestAnOlderPluginIsServedInItsVersion(t *testing.T) {
	r := newRig(t)
	r.srv.slots = make(chan struct{}, 1)
	handshake := func(id string) (net.Conn, wire.Ack) {
		c, err := net.Dial("unix", r.l.Path())
		require.NoError(t, err)
		req := wire.NewRequest(wire.Add, env(id, "lhnet1"), r.config("0.3.1", ""))
		req.Version = 1
		require.NoError(t, wire.Write(c, req))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		body, err := wire.ReadFrame(c)
		require.NoError(t, err)
		var ack wire.Ack
		require.NoError(t, wire.DecodeAs(body, 1, wire.TypeAck, &ack), "the first frame is version 1's acknowledgement")
		return c, ack
	}
	c, ack := handshake("c1")
	defer c.Close()
	require.True(t, ack.Serve, ack.Reason)
	require.NoError(t, wire.Write(c, wire.GoAhead{Type: wire.TypeGo, Version: 1}))
	body, err := wire.ReadFrame(c)
	require.NoError(t, err)
	var ans wire.Answer
	require.NoError(t, wire.DecodeAs(body, 1, wire.TypeAnswer, &ans))
	require.Nil(t, ans.Error)
	assert.Contains(t, string(ans.Stdout), "192.168.50.2/24")
	r.counted(wire.Add, outcomeServed, "", 1)

	// Its slot given back (after the answer), then taken by another.
	require.Eventually(t, func() bool { return len(r.srv.slots) == 0 }, 10*time.Second, time.Millisecond)
	r.srv.slots <- struct{}{}
	start := time.Now()
	c2, ack := handshake("c2")
	defer c2.Close()
	assert.False(t, ack.Serve)
	assert.Equal(t, "busy: 1 requests in flight", ack.Reason)
	assert.Less(t, time.Since(start), time.Second, "declined at once")
}

// Stop waits for the verbs the agent took, and declines what comes
// meanwhile. (Under -race it held a WaitGroup's Add from zero, for a
// connection accepted while nothing ran, racing Stop's Wait.)
func TestStopWaitsForTheVerbsItTook(t *testing.T) {
	r := newRig(t)
	r.alloc.block = make(chan struct{})
	first := make(chan client.Result)
	go func() { first <- r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", "")) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the ADD is under way")
	stopped := make(chan error)
	go func() { stopped <- r.srv.Stop(context.Background()) }()
	require.Eventually(t, func() bool { return r.srv.stopping.Load() }, 10*time.Second, time.Millisecond)
	res := r.do(wire.Probe, nil, nil)
	assert.Equal(t, "node agent declined: stopping", res.Reason)
	select {
	case err := <-stopped:
		t.Fatalf("stopped (%v) while a verb ran", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(r.alloc.block)
	assert.Equal(t, client.Served, (<-first).Outcome)
	require.NoError(t, <-stopped)
}

// Until the agent has read the pools as itself, and whenever it cannot,
// it declines: the plugin works with whereabouts' credentials meanwhile.
func TestAnAgentThatCannotReachThePoolsDeclines(t *testing.T) {
	r := newRig(t)
	srv, err := New(r.srv.o)
	require.NoError(t, err)
	l, err := Listen(filepath.Join(shortDir(t), "agent.sock"))
	require.NoError(t, err)
	defer l.Close()
	go func() { _ = srv.Serve(l) }()
	res := probe(t, l.Path())
	assert.Equal(t, "node agent declined: not yet connected to the API server", res.Reason)

	forbidden := fmt.Errorf(`overlappingrangeipreservations.whereabouts.cni.cncf.io is forbidden: User "system:serviceaccount:kube-system:harvester-ipam-agent" cannot list resource`)
	r.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Reservations {
			return forbidden
		}
		return nil
	}
	assert.ErrorContains(t, srv.Check(context.Background()), "namespace kube-system: "+forbidden.Error())
	res = probe(t, l.Path())
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Contains(t, res.Reason, "node agent declined: cannot reach the pools as itself: namespace kube-system: overlappingrangeipreservations")
	assert.Contains(t, r.log.String(), "declining every request")

	r.api.Hook = nil
	require.NoError(t, srv.Check(context.Background()))
	assert.Equal(t, client.Served, probe(t, l.Path()).Outcome)
}

// A probe is admitted while the agent serves, and does nothing.
func TestAProbeDoesNothing(t *testing.T) {
	r := newRig(t)
	res := r.do(wire.Probe, nil, nil)
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	assert.Equal(t, wire.NewAnswer(nil, nil, nil), res.Answer)
	r.srv.stopping.Store(true)
	assert.Equal(t, client.Fallback, r.do(wire.Probe, nil, nil).Outcome)
}

// A probe (the readiness probe's, every 5 s) writes no line in the log, even
// with LogRequests, and is not in the minute's summary: it is counted, by
// its result, in a series of its own.
func TestAProbeIsCountedNotLogged(t *testing.T) {
	r := newRig(t)
	before := r.log.String()
	for i := 0; i < 3; i++ {
		require.Equal(t, client.Served, r.do(wire.Probe, nil, nil).Outcome)
	}
	r.srv.stopping.Store(true)
	require.Equal(t, client.Fallback, r.do(wire.Probe, nil, nil).Outcome)
	probes := func(result string) float64 {
		mfs, err := r.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "harvester_ipam_agent_probes_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == result {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	assert.Eventually(t, func() bool { return probes(outcomeServed) == 3 && probes(outcomeDeclined) == 1 }, 10*time.Second, time.Millisecond,
		"harvester_ipam_agent_probes_total: served %v (want 3), declined %v (want 1)", probes(outcomeServed), probes(outcomeDeclined))
	assert.Equal(t, before, r.log.String(), "a probe writes no log line")
	assert.Equal(t, "", r.metrics.Summary(), "a probe is not in the summary")
	assert.Zero(t, r.count(wire.Probe, outcomeServed, ""), "a probe is not a request of the verbs")
}

// The client is the one to say go: an agent whose client left before it
// (it timed out on the ack, or it left at once) writes nothing.
func TestAClientThatLeavesBeforeGoGetsNothingWritten(t *testing.T) {
	r := newRig(t)
	// Acknowledged, then left.
	c, err := net.Dial("unix", r.l.Path())
	require.NoError(t, err)
	require.NoError(t, wire.Write(c, wire.NewRequest(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))))
	require.Equal(t, wire.TypeReceived, frameType(t, c))
	body, err := wire.ReadFrame(c)
	require.NoError(t, err)
	var ack wire.Ack
	require.NoError(t, wire.Decode(body, wire.TypeAck, &ack))
	require.True(t, ack.Serve)
	c.Close()
	r.counted(wire.Add, outcomeAbandoned, "", 1)

	// Received, then left before the decision.
	c, err = net.Dial("unix", r.l.Path())
	require.NoError(t, err)
	require.NoError(t, wire.Write(c, wire.NewRequest(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))))
	require.Equal(t, wire.TypeReceived, frameType(t, c))
	c.Close()
	r.counted(wire.Add, outcomeAbandoned, "", 2)

	// A go-ahead, and the client gone before the agent reads it: these
	// clients connect while the agent accepts nothing yet.
	srv, err := New(r.srv.o)
	require.NoError(t, err)
	require.NoError(t, srv.Check(context.Background()))
	l, err := Listen(filepath.Join(shortDir(t), "agent.sock"))
	require.NoError(t, err)
	defer l.Close()
	for i, halfClose := range []bool{false, true} {
		c, err := net.Dial("unix", l.Path())
		require.NoError(t, err)
		require.NoError(t, wire.Write(c, wire.NewRequest(wire.Add, env(fmt.Sprint("c", i+2), "lhnet1"), r.config("0.3.1", ""))))
		require.NoError(t, wire.Write(c, wire.Go()))
		if halfClose {
			require.NoError(t, c.(*net.UnixConn).CloseWrite())
			defer c.Close()
		} else {
			c.Close()
		}
	}
	go func() { _ = srv.Serve(l) }()
	r.counted(wire.Add, outcomeAbandoned, "", 4)
	assert.Empty(t, r.pool())
	assert.Empty(t, r.checkpoints())
}

// A client that goes away while the verb runs cancels it.
func TestAClientThatGoesAwayCancelsTheVerb(t *testing.T) {
	r := newRig(t)
	r.alloc.block = make(chan struct{})
	r.alloc.ctxErr = make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan client.Result)
	go func() { done <- r.c.Do(ctx, wire.NewRequest(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))) }()
	require.Eventually(t, func() bool { return len(r.checkpoints()) == 1 }, 10*time.Second, time.Millisecond, "the ADD is under way")
	cancel()
	assert.Equal(t, client.Lost, (<-done).Outcome)
	select {
	case err := <-r.alloc.ctxErr:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the allocation was not cancelled")
	}
	r.counted(wire.Add, outcomeLost, "", 1)
	assert.Empty(t, r.pool())
}

// Whatever arrives on the socket, the agent answers what it can and keeps
// serving.
func TestHostileRequestsLeaveTheAgentServing(t *testing.T) {
	r := newRig(t)
	for _, tc := range []struct {
		name  string
		send  []byte
		want  string // in the ack's reason; "" expects no ack
		error bool   // the ack carries a CNI error
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "malformed request: message larger than the limit", true},
		{"an oversized frame", []byte{0, 0x20, 0, 1}, "malformed request: message larger than the limit", true},
		{"an empty frame", []byte{0, 0, 0, 0}, "malformed request: empty message", true},
		{"a truncated frame", []byte{0, 0, 1, 0, '{', '"'}, "malformed request: message cut short", true},
		{"not JSON", frameOf(`{{{`), "malformed request: not a message", true},
		{"an unknown command", frameOf(`{"type":"request","version":1,"command":"VERSION"}`), `malformed request: unknown command "VERSION"`, true},
		{"an unknown variable", frameOf(`{"type":"request","version":1,"command":"ADD","env":{"LD_PRELOAD":"x"}}`), "unknown environment variable", true},
		{"a newer protocol", frameOf(`{"type":"request","version":3,"command":"ADD","extra":{}}`), "protocol version 3; this agent speaks 2", false},
		{"nothing at all", nil, "", false},
		{"a config that is not JSON", mustFrame(wire.NewRequest(wire.Add, env("c1", "lhnet1"), []byte("\x00\xff not json"))), "config: network config is not valid JSON", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", r.l.Path())
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write(tc.send)
			require.NoError(t, err)
			if tc.name == "a truncated frame" || tc.name == "nothing at all" {
				require.NoError(t, c.(*net.UnixConn).CloseWrite())
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			body, err := wire.ReadFrame(c)
			if h, _ := wire.ReadHeader(body); err == nil && h.Type == wire.TypeReceived {
				body, err = wire.ReadFrame(c) // a request that reads: its decision follows
			}
			if tc.want == "" {
				assert.Error(t, err, "no answer")
				return
			}
			require.NoError(t, err)
			var ack wire.Ack
			require.NoError(t, wire.Decode(body, wire.TypeAck, &ack))
			assert.False(t, ack.Serve)
			assert.Contains(t, ack.Reason, tc.want)
			assert.Equal(t, tc.error, ack.Error != nil, "a CNI error: %+v", ack.Error)
			if ack.Error != nil {
				assert.Equal(t, uint(cnitypes.ErrDecodingFailure), ack.Error.Code)
			}
			_, err = wire.ReadFrame(c)
			assert.Error(t, err, "and the connection is closed")
		})
	}
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, "still serving: %s", res.Reason)
	assert.Equal(t, 1.0, r.count("", outcomeDeclined, "version"))
}

// frameType reads a frame and says its type.
func frameType(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := wire.ReadFrame(c)
	require.NoError(t, err)
	h, err := wire.ReadHeader(body)
	require.NoError(t, err)
	return h.Type
}

func frameOf(body string) []byte {
	b := []byte{0, 0, 0, 0}
	b[2], b[3] = byte(len(body)>>8), byte(len(body))
	return append(b, body...)
}

func mustFrame(v any) []byte {
	var buf bytes.Buffer
	if err := wire.Write(&buf, v); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// A panic in a verb is answered as an internal error; the agent goes on.
func TestAPanicIsAnsweredAndTheAgentGoesOn(t *testing.T) {
	r := newRig(t)
	r.srv.o.Allocator = panicking{r.alloc}
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.NotNil(t, res.Answer.Error)
	assert.Equal(t, "node agent: ADD failed: allocator bug", res.Answer.Error.Msg)
	assert.Contains(t, r.log.String(), "panic: allocator bug")
	assert.Equal(t, client.Served, r.do(wire.Probe, nil, nil).Outcome)
}

type panicking struct{ *wbAllocator }

func (panicking) Add(context.Context, *shim.Store, *conf.Config, *skel.CmdArgs) (cnitypes.Result, error) {
	panic("allocator bug")
}

// Requests run at once share whereabouts' Lease through the agent's group
// (shim.Group): one holder, the agent, whose turns are serialised, and the
// releases of one moment judged in one turn; far fewer acquisitions than
// requests, and every reservation released.
func TestConcurrentRequestsShareTheAgentsHoldOfTheLease(t *testing.T) {
	allocs := map[string]alloc{}
	var objs []any
	for i := 2; i < 22; i++ {
		id := fmt.Sprintf("c%d", i)
		allocs[fmt.Sprint(i)] = alloc{ContainerID: id, PodRef: "longhorn-system/" + id, IfName: "lhnet1"}
		objs = append(objs, fake.NewReservation(fmt.Sprintf("192.168.50.%d", i), "longhorn-system/"+id))
	}
	r := newRig(t, append(objs, fake.NewPool(poolName, "192.168.50.0/24", allocs))...)
	var mu sync.Mutex
	holders := map[string]bool{}
	takes := 0
	r.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Leases && (c.Verb == "update" || c.Verb == "create") {
			time.Sleep(5 * time.Millisecond) // an API server's time, in which requests come
			mu.Lock()
			defer mu.Unlock()
			l := r.api.Lease("kube-system", "whereabouts")
			if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				takes++ // free: this write takes it
			} else {
				holders[*l.Spec.HolderIdentity] = true
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for i := 2; i < 22; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("c%d", i)
			e := env(id, "lhnet1")
			e[wire.EnvArgs] = "K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=" + id
			res := r.do(wire.Del, e, r.config("0.3.1", ""))
			assert.Equal(t, client.Served, res.Outcome, res.Reason)
			assert.Nil(t, res.Answer.Error)
		}(i)
	}
	wg.Wait()
	require.NoError(t, r.srv.Stop(context.Background()))
	assert.Empty(t, r.pool())
	assert.Empty(t, r.api.AllReservations("kube-system"), "every reservation released")
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, holders, 1, "the Lease's holders: %v", holders)
	for h := range holders {
		assert.True(t, strings.HasPrefix(h, "harvester-ipam-agent/n1/"), h)
	}
	t.Logf("%d acquisitions", takes)
	assert.Less(t, takes, 10, "acquisitions of the Lease for 20 releases")
	l := r.api.Lease("kube-system", "whereabouts")
	require.NotNil(t, l)
	assert.Equal(t, "", *l.Spec.HolderIdentity, "handed back once the agent stopped")
}

// Without an allocator the agent's ADD runs the whereabouts binary the
// request's CNI_PATH holds, in the request's environment.
func TestWithoutAnAllocatorAddRunsTheDelegateInTheRequestsEnvironment(t *testing.T) {
	r := newRig(t)
	r.srv.o.Allocator = nil
	bin := t.TempDir()
	script := "#!/bin/sh\nenv | grep -E '^(CNI_|HARVESTER)' | sort > " + bin + "/env\ncat > " + bin + "/stdin\n" +
		`echo '{"cniVersion":"0.3.1","ips":[{"version":"4","address":"192.168.50.9/24"}]}'` + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "whereabouts"), []byte(script), 0o755))
	e := env("c1", "lhnet1")
	e[wire.EnvPath] = bin
	res := r.do(wire.Add, e, r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
	assert.Contains(t, string(res.Answer.Stdout), "192.168.50.9/24")
	got, err := os.ReadFile(filepath.Join(bin, "env"))
	require.NoError(t, err)
	assert.Equal(t, "CNI_ARGS="+podArgs+"\nCNI_COMMAND=ADD\nCNI_CONTAINERID=c1\nCNI_IFNAME=lhnet1\nCNI_NETNS=/var/run/netns/x\nCNI_PATH="+bin+"\nHARVESTER_IPAM_DELEGATE=harvester-ipam\n", string(got),
		"the request's CNI variables, and the guard every delegate gets")
	stdin, err := os.ReadFile(filepath.Join(bin, "stdin"))
	require.NoError(t, err)
	assert.Equal(t, string(r.config("0.3.1", "")), string(stdin), "the config as it came (it names whereabouts)")
	rec, ok, err := checkpoint.Dir(r.cpDir).Read("c1", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []string{"192.168.50.9/24"}, rec.IPs)
}

// The agent loads a config per request: whereabouts' loader must neither
// keep a log file open per load nor race on its globals. With -race, 10,000
// requests; without, 2,000 show a leak as well (a descriptor each).
func TestManyRequestsKeepTheDescriptorsFlat(t *testing.T) {
	n := 2000
	if raceEnabled {
		n = 10000
	}
	if testing.Short() {
		n = 500
	}
	r := newRig(t)
	logFile := filepath.Join(r.dir, "whereabouts.log")
	// Warm up: the runtime's own descriptors (epoll, timers) come first.
	require.Equal(t, client.Served, r.do(wire.Probe, nil, nil).Outcome)
	before := countFDs(t, "")
	var wg sync.WaitGroup
	work := make(chan int)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				res := r.do(wire.Del, env(fmt.Sprintf("c%d", i), "lhnet1"), r.config("0.3.1", ""))
				if res.Outcome != client.Served || res.Answer.Error != nil {
					t.Errorf("request %d: %+v", i, res)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	assert.Equal(t, 0, countFDs(t, logFile), "descriptors of whereabouts' log file left open")
	require.Eventually(t, func() bool { return countFDs(t, "") <= before }, 10*time.Second, 10*time.Millisecond,
		"descriptors: %d before, %d after %d requests", before, countFDs(t, ""), n)
	r.counted(wire.Del, outcomeServed, "", float64(n))
}

// countFDs counts the process's descriptors, or those of one file.
func countFDs(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	if path == "" {
		return len(fds)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// The log a verb writes for a log file (whereabouts' log_file, or the node's
// own settings, plugin.logFile) is the host's file, which the agent's pod
// does not mount: the agent hands the lines and the file to its client, the
// plugin on the host, which appends them there. The agent writes no file.
func TestTheLogOfALogFileGoesToTheClient(t *testing.T) {
	r := newRig(t)
	nodeConf := filepath.Join(r.dir, "harvester-ipam.conf")
	hostLog := filepath.Join(r.dir, "host", "harvester-ipam.log")
	require.NoError(t, os.WriteFile(nodeConf, []byte(`{"log_level":"debug","log_file":"`+hostLog+`"}`), 0o644))
	r.srv.o.NodeConfig = nodeConf

	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error)
	assert.Equal(t, hostLog, res.Answer.LogFile, "the file the plugin would have logged to")
	assert.Contains(t, string(res.Answer.Log), "[debug] harvester-ipam ADD c1: ")
	assert.NotContains(t, string(res.Answer.Stderr), "harvester-ipam ADD", "the lines go to the file, not to the runtime's log")
	assert.NoFileExists(t, hostLog, "the agent writes no host file")

	// Without the node's settings: whereabouts' log_file (the flat file's).
	require.NoError(t, os.Remove(nodeConf))
	res = r.do(wire.Del, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	assert.Equal(t, filepath.Join(r.dir, "whereabouts.log"), res.Answer.LogFile)
	assert.Contains(t, string(res.Answer.Log), "harvester-ipam DEL c1: ")
	assert.NoFileExists(t, filepath.Join(r.dir, "whereabouts.log"))
}

// With whereabouts' allocator in-process (alloc.Delegate, a
// plugin.RecordingAllocator), the attachment's checkpoint is written once,
// by the allocator, with the address it chose, before it writes that
// address: not before the earlier sandbox is released, which allocates
// nothing for this attachment. (The earlier sandbox's entry has no ifname,
// as whereabouts v0.7.0 writes it: one on lhnet1 would be handed over.)
func TestTheAllocatorRecordsTheAttachmentOnceBeforeItWrites(t *testing.T) {
	r := newRig(t, fake.NewPool(poolName, "192.168.50.0/24", map[string]alloc{
		"2": {ContainerID: "c0", PodRef: "longhorn-system/im-a"}}),
		fake.NewReservation("192.168.50.2", "longhorn-system/im-a"))
	var atReclaim, atPatch []string
	reclaimed := false
	var recorded checkpoint.Record
	r.api.Hook = func(c *fake.Call) error {
		if c.Resource == fake.Reservations && c.Verb == "delete" {
			reclaimed = true // the earlier sandbox's reservation
			atReclaim = r.checkpoints()
		}
		return nil
	}
	r.srv.o.Allocator = allocpkg.Delegate{
		Batcher: allocpkg.New(allocpkg.Options{AtStep: func(step string) {
			if step == "alloc-before-patch" {
				atPatch = r.checkpoints()
				recorded, _, _ = checkpoint.Dir(r.cpDir).Read("c1", "lhnet1")
			}
		}}),
		Load: conf.Loader{Quiet: true}.Whereabouts,
	}
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
	assert.JSONEq(t, `{"cniVersion":"0.3.1","ips":[{"version":"4","address":"192.168.50.2/24"}],"dns":{}}`, string(res.Answer.Stdout))
	assert.Equal(t, map[string]alloc{"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool())
	require.True(t, reclaimed, "the earlier sandbox's reservation was released")
	assert.Empty(t, atReclaim, "no record of c1 while the earlier sandbox is released")
	assert.Equal(t, []string{"c1:lhnet1.json"}, atPatch, "recorded before the pool is written")
	assert.Equal(t, []string{"192.168.50.2/24"}, recorded.IPs)
	assert.Equal(t, "longhorn-system/im-a", recorded.PodRef)
	assert.Equal(t, []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, recorded.Pools)
	rec, ok, err := checkpoint.Dir(r.cpDir).Read("c1", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []string{"192.168.50.2/24"}, rec.IPs, "the result's address, as the plugin records it")
}

// whereabouts' own suite ("can recover from an exhausted IP pool", CI at
// 4c5451a: it failed on the agent's side alone) deletes a StatefulSet's pod
// with a grace period of 0 and polls its pool for the pod's entry: the
// kubelet runs the new sandbox's ADD while it tears the old one down. The
// agent's allocator records the attachment only when it chooses the
// address, so between the ADD's mark and that record a DEL of the old
// sandbox must still know the mark's ADD as the one to leave the entry to:
// the pool never shows the pod without its address.
func TestAnEarlierSandboxsDELLeavesItsEntryToTheAgentsADDBeforeItRecords(t *testing.T) {
	r := newRig(t)
	r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{}), Load: conf.Loader{Quiet: true}.Whereabouts}
	res := r.do(wire.Add, env("old", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
	require.Equal(t, map[string]alloc{"2": {ContainerID: "old", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool())

	var mu sync.Mutex
	var gaps []string
	watch := func(c *fake.Call) error {
		p := r.api.Pool("kube-system", poolName)
		found := false
		for _, a := range p.Spec.Allocations {
			found = found || a.PodRef == "longhorn-system/im-a"
		}
		if !found {
			mu.Lock()
			gaps = append(gaps, c.Verb+" "+c.Resource+" "+c.Name)
			mu.Unlock()
		}
		return nil
	}
	r.api.Hook = watch
	var del client.Result
	delDone, recordedAtDel := false, true
	r.srv.o.AtStep = func(step string) {
		if step != "add-after-reclaim" || delDone {
			return
		}
		delDone = true
		_, recordedAtDel, _ = checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
		del = r.do(wire.Del, env("old", "lhnet1"), r.config("0.3.1", ""))
		_ = watch(&fake.Call{Verb: "after", Resource: "the old sandbox's DEL"})
	}
	res = r.do(wire.Add, env("new", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
	require.True(t, delDone, "the old sandbox's DEL ran inside the ADD")
	require.Equal(t, client.Served, del.Outcome, del.Reason)
	require.Nil(t, del.Answer.Error, "%v", del.Answer.Error)
	assert.False(t, recordedAtDel, "the DEL ran before the allocator recorded the attachment")

	assert.Equal(t, map[string]alloc{"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool(), "the pod's one entry, the new sandbox's")
	mu.Lock()
	assert.Empty(t, gaps, "requests that found the pod without its entry")
	mu.Unlock()
	o, err := r.api.GetReservation(context.Background(), "kube-system", "192.168.50.2")
	require.NoError(t, err, "the pod's reservation")
	assert.Equal(t, "longhorn-system/im-a", o.Spec.PodRef)
	assert.Equal(t, []string{"new:lhnet1.json"}, r.checkpoints(), "the old sandbox's DEL forgot its record")
}

// The ADD the earlier sandbox's DEL left the entry to may fail after all (the
// API server refusing its write): no sandbox holds the entry then. The ADD,
// failing, releases it, as its reclaim would have without a hand-over; when
// the API server refuses that too, the pod's next ADD (the runtime tries
// the sandbox again) releases it before it allocates.
func TestAnEntryLeftToAnADDThatFailsIsReleased(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refuse  int // pool writes refused from the old sandbox's DEL on
		nextADD bool
		// later: meanwhile a later sandbox of the pod holds an entry on the
		// interface (the failing ADD's client gone, the runtime on to the
		// pod's next sandbox): the failing ADD was not left it.
		later bool
	}{
		{"the ADD's write refused: the failing ADD releases it", 1, false, false},
		{"every write refused: the pod's next ADD releases it", 1 << 20, true, false},
		{"a later sandbox's entry written meanwhile: it stays", 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{}), Load: conf.Loader{Quiet: true}.Whereabouts}
			res := r.do(wire.Add, env("old", "lhnet1"), r.config("0.3.1", ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)

			var refuse atomic.Int64
			r.api.Hook = func(c *fake.Call) error {
				if c.Resource == fake.Pools && c.Verb != "get" && c.Verb != "list" && refuse.Add(-1) >= 0 {
					return fmt.Errorf("etcdserver: request timed out")
				}
				return nil
			}
			var del client.Result
			delDone := false
			r.srv.o.AtStep = func(step string) {
				if step != "add-after-reclaim" || delDone {
					return
				}
				delDone = true
				del = r.do(wire.Del, env("old", "lhnet1"), r.config("0.3.1", ""))
				if tc.later {
					p := r.api.Pool("kube-system", poolName)
					p.Spec.Allocations["7"] = alloc{ContainerID: "later", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}
					_, err := r.api.UpdatePool("kube-system", p)
					require.NoError(t, err)
					r.api.Put(fake.NewReservation("192.168.50.7", "longhorn-system/im-a"))
				}
				refuse.Store(int64(tc.refuse))
			}
			res = r.do(wire.Add, env("new", "lhnet1"), r.config("0.3.1", ""))
			require.True(t, delDone, "the old sandbox's DEL ran inside the ADD")
			require.Equal(t, client.Served, del.Outcome, del.Reason)
			require.Nil(t, del.Answer.Error, "%v", del.Answer.Error)
			require.True(t, res.Outcome != client.Served || res.Answer.Error != nil, "the ADD fails: its pool write refused (%v)", res.Outcome)

			refuse.Store(0)
			if tc.later {
				assert.Equal(t, map[string]alloc{"7": {ContainerID: "later", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool(),
					"the later sandbox's entry stays; the one the failing ADD was left goes")
				_, err := r.api.GetReservation(context.Background(), "kube-system", "192.168.50.7")
				assert.NoError(t, err, "the later sandbox's reservation stays")
				return
			}
			res = r.do(wire.Del, env("new", "lhnet1"), r.config("0.3.1", ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
			if tc.nextADD {
				res = r.do(wire.Add, env("newer", "lhnet1"), r.config("0.3.1", ""))
				require.Equal(t, client.Served, res.Outcome, res.Reason)
				require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
				assert.Equal(t, map[string]alloc{"2": {ContainerID: "newer", PodRef: "longhorn-system/im-a", IfName: "lhnet1"}}, r.pool(), "the pod's one entry, its live sandbox's")
				assert.Equal(t, []string{"newer:lhnet1.json"}, r.checkpoints())
				return
			}
			assert.Empty(t, r.pool(), "no entry of the pod: both its sandboxes are gone")
			_, err := r.api.GetReservation(context.Background(), "kube-system", "192.168.50.2")
			assert.Error(t, err, "no reservation of the pod")
			assert.Empty(t, r.checkpoints(), "no record of either sandbox")
		})
	}
}

// The agent's copy of the pool may lack an entry written a moment ago: an
// earlier sandbox of the pod allocated (by the exec path, or by an agent
// before a reboot) after the copy was listed. ADD's reclaim must not decide
// "no earlier sandbox" from that copy (the simulation's seeds 973 and 1227
// on v0.7.0): the pool the allocation is written on shows the earlier
// sandbox, and it is released before the new address is chosen.
func TestAnAddWhoseCopyMissesTheEarlierSandboxReclaimsIt(t *testing.T) {
	for _, v070 := range []bool{false, true} {
		t.Run(fmt.Sprintf("ifname pruned %v", v070), func(t *testing.T) {
			r := newRig(t, fake.NewPool(poolName, "192.168.50.0/24", map[string]alloc{
				"9": {ContainerID: "x1", PodRef: "longhorn-system/other", IfName: "lhnet1"}}),
				fake.NewReservation("192.168.50.9", "longhorn-system/other"))
			objs := cache.New()
			objs.SawPool(r.api.Pool("kube-system", poolName))
			objs.Listed("kube-system")
			// Since the copy was listed: the earlier sandbox c0 of im-a got .2.
			ifname := "lhnet1"
			if v070 {
				ifname = "" // whereabouts v0.7.0's CRD prunes it
			}
			p := r.api.Pool("kube-system", poolName)
			p.Spec.Allocations["2"] = alloc{ContainerID: "c0", PodRef: "longhorn-system/im-a", IfName: ifname}
			_, err := r.api.UpdatePool("kube-system", p)
			require.NoError(t, err)
			r.api.Put(fake.NewReservation("192.168.50.2", "longhorn-system/im-a"))
			r.srv.o.API = cache.API{API: r.api, Objects: objs}
			r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{}), Load: conf.Loader{Quiet: true}.Whereabouts}

			res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
			assert.Equal(t, map[string]alloc{
				"2": {ContainerID: "c1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
				"9": {ContainerID: "x1", PodRef: "longhorn-system/other", IfName: "lhnet1"},
			}, r.pool(), "the earlier sandbox's entry released, its address the lowest free again")
			o, err := r.api.GetReservation(context.Background(), "kube-system", "192.168.50.2")
			require.NoError(t, err, "the new sandbox's reservation")
			assert.Equal(t, "longhorn-system/im-a", o.Spec.PodRef)
		})
	}
}

// Two agents of one node (a rollout's new one beside the old, two releases
// of the chart, a crashed one's replacement: pid 1 in each container) hold
// whereabouts' Lease under names of their own, each request's its
// agent's name and a sequence of its own.
func TestTwoAgentsOfANodeHoldTheLeaseUnderNamesOfTheirOwn(t *testing.T) {
	api := fake.New()
	holder := func(s *shim.Store) string {
		var h string
		require.NoError(t, s.Locked(context.Background(), func(context.Context, *shim.Locked) error {
			h = *api.Lease("kube-system", "whereabouts").Spec.HolderIdentity
			return nil
		}))
		return h
	}
	var names []string
	for i := 0; i < 2; i++ {
		srv, err := New(Options{API: api, Namespaces: []string{"kube-system"}, Node: "n1", Log: &bytes.Buffer{}})
		require.NoError(t, err)
		first, second := holder(srv.storeIn("kube-system")), holder(srv.storeIn("kube-system"))
		assert.True(t, strings.HasPrefix(first, "harvester-ipam-agent/n1/"), first)
		assert.NotEqual(t, first, second, "two requests of one agent")
		names = append(names, first)
	}
	assert.NotEqual(t, names[0], names[1], "the first requests of two agents of one node")
}

// An agent whose copy of the pools may no longer follow the cluster (a watch
// failed, and it has neither listed again nor had a new watch deliver)
// declines every verb, and says so where an operator and an alert look: its
// readiness probe is declined with the reason (the kubelet shows it in the
// pod's Events), harvester_ipam_agent_declining{reason="behind"} is 1, and
// the log says when it starts and stops. Before, the probe was served: the
// agent was Ready while the plugin did every verb alone, silently.
func TestAnAgentWhoseCopyDoesNotFollowDeclines(t *testing.T) {
	r := newRig(t)
	declining := func(reason string) float64 {
		mfs, err := r.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "harvester_ipam_agent_declining" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == reason {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatalf("no harvester_ipam_agent_declining{reason=%q}", reason)
		return 0
	}
	for _, reason := range DecliningReasons {
		assert.Zero(t, declining(reason), "serving: not declining for %s", reason)
	}
	behind := errors.New("the watch of kube-system/ippools failed 2m0s ago (forbidden) and has neither listed again nor had a new watch deliver")
	var follows atomic.Bool
	r.srv.o.Following = func() error {
		if follows.Load() {
			return nil
		}
		return behind
	}
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	assert.Equal(t, client.Fallback, res.Outcome)
	assert.Equal(t, "node agent declined: its copy of the pools may not follow the cluster: "+behind.Error(), res.Reason)
	assert.Empty(t, r.pool(), "nothing written")
	res = r.do(wire.Probe, nil, nil)
	assert.Equal(t, client.Fallback, res.Outcome, "not ready")
	assert.Equal(t, "node agent declined: its copy of the pools may not follow the cluster: "+behind.Error(), res.Reason)
	assert.Equal(t, 1.0, declining("behind"))
	assert.Zero(t, declining("unhealthy"))
	assert.Equal(t, 1, strings.Count(r.log.String(), "declining every request: its copy of the pools may not follow the cluster: "+behind.Error()), "logged once")

	follows.Store(true)
	assert.Equal(t, client.Served, r.do(wire.Probe, nil, nil).Outcome)
	assert.Zero(t, declining("behind"))
	res = r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	assert.Equal(t, client.Served, res.Outcome, res.Reason)
	assert.Equal(t, 1, strings.Count(r.log.String(), "serving again: its copy of the pools follows the cluster"), "logged once")
}

// A full range's explanation, when the agent serves the ADD, never lists
// pods with whereabouts' kubeconfig (its token is bound to whereabouts'
// pod, and the agent reads only its namespace): the agent answers
// whereabouts' error, and the plugin on the host explains it
// (plugin's TestAFullRangeTheAgentAnswersIsExplainedHere).
func TestAFullRangeIsExplainedWithoutWhereaboutsCredentials(t *testing.T) {
	r := newRig(t, fake.NewPool("192.168.50.0-30", "192.168.50.0/30", map[string]alloc{
		"1": {ContainerID: "x1", PodRef: "longhorn-system/gone-a", IfName: "lhnet1"},
		"2": {ContainerID: "x2", PodRef: "longhorn-system/gone-b", IfName: "lhnet1"},
	}))
	r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{}), Load: conf.Loader{Quiet: true}.Whereabouts}
	config := []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"storagenetwork","type":"bridge","bridge":"mgmt-br",
		"ipam":{"type":"whereabouts","range":"192.168.50.0/30","configuration_path":%q,"harvester_ipam":{"checkpoint_dir":%q}}}`, r.flat, r.cpDir))
	res := r.do(wire.Add, env("c1", "lhnet1"), config)
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	require.NotNil(t, res.Answer.Error)
	assert.Contains(t, res.Answer.Error.Msg, "Could not allocate IP in range", "whereabouts' own error")
	assert.NotContains(t, res.Answer.Error.Msg, "holds 2 entries", "the client, on the host, explains it")
	assert.NotContains(t, res.Answer.Error.Msg, "127.0.0.1:1", "no request with whereabouts' kubeconfig")
}

// A DEL admitted by its checkpoint (its config no longer reads) is checked
// for what the verb will read: the checkpoint's pool namespace, and the
// namespace of the kubeconfig it names. A kubeconfig that now names a
// namespace the agent does not serve is the plugin's DEL, declined at
// admission, never a failed DEL of the agent's.
func TestADelByItsCheckpointIsCheckedForItsKubeconfigsNamespace(t *testing.T) {
	r := newRig(t)
	res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
	require.Equal(t, client.Served, res.Outcome, res.Reason)
	rec, ok, err := checkpoint.Dir(r.cpDir).Read("c1", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	// whereabouts' kubeconfig rewritten for another namespace since.
	require.NoError(t, os.WriteFile(rec.Kubeconfig, []byte(strings.Replace(mustRead(t, rec.Kubeconfig), "namespace: kube-system", "namespace: elsewhere", 1)), 0o600))

	cfg := `{"cniVersion":"0.3.1","name":"storagenetwork","type":"bridge","ipam":{"harvester_ipam":{"checkpoint_dir":"` + r.cpDir + `"}}}`
	res = r.do(wire.Del, env("c1", "lhnet1"), []byte(cfg))
	assert.Equal(t, client.Fallback, res.Outcome, "the plugin's DEL, not a failed one of the agent's")
	assert.Contains(t, res.Reason, "elsewhere")
	assert.Len(t, r.pool(), 1, "nothing released by the agent")
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// A request the agent declines gives its slot back before the decline is
// written, whatever declined it (its health, its copy, its admission of the
// config, the allocator), on the socket and through Take: else after
// MaxInFlight declines the agent would be busy for good, and every verb
// would go to the plugin's slower way, silently.
func TestADeclinedRequestGivesItsSlotBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reason  string
		decline func(r *rig) (config []byte, undo func())
	}{
		{"unhealthy", "unhealthy", func(r *rig) ([]byte, func()) {
			r.srv.health.Store(&health{reason: "cannot reach the pools as itself: forbidden"})
			return r.config("0.3.1", ""), func() { r.srv.health.Store(&health{}) }
		}},
		{"its copy behind", "behind", func(r *rig) ([]byte, func()) {
			r.srv.o.Following = func() error { return errors.New("the watch of kube-system/ippools failed") }
			return r.config("0.3.1", ""), func() { r.srv.o.Following = nil }
		}},
		{"an ipam field it does not know", "field", func(r *rig) ([]byte, func()) {
			return r.config("0.3.1", `,"ip_family":"v4"`), func() {}
		}},
		{"what the allocator declines", "allocator", func(r *rig) ([]byte, func()) {
			r.alloc.decline = "range_start beyond the range"
			return r.config("0.3.1", ""), func() { r.alloc.decline = "" }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.srv.slots = make(chan struct{}, 1)
			r.srv.o.QueueTimeout = 50 * time.Millisecond
			config, undo := tc.decline(r)
			for i := 0; i < 3; i++ {
				res := r.do(wire.Add, env(fmt.Sprint("d", i), "lhnet1"), config)
				require.Equal(t, client.Fallback, res.Outcome)
				require.NotContains(t, res.Reason, "busy", "declined %d times before", i)
			}
			r.counted(wire.Add, outcomeDeclined, tc.reason, 3)
			for i := 0; i < 3; i++ {
				_, free, reason, detail := r.srv.Take(wire.NewRequest(wire.Add, env(fmt.Sprint("t", i), "lhnet1"), config))
				require.Equal(t, tc.reason, reason, detail)
				require.Nil(t, free)
			}
			undo()
			j, free, reason, detail := r.srv.Take(wire.NewRequest(wire.Add, env("c2", "lhnet1"), r.config("0.3.1", "")))
			require.Empty(t, reason, detail)
			require.NotNil(t, j)
			free()
			res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
			assert.Equal(t, client.Served, res.Outcome, res.Reason)
			assert.Zero(t, r.count(wire.Add, outcomeDeclined, "busy"), "no request found the slot taken")
		})
	}
}

// delivering is an API server whose pool writes the agent's informer then
// delivers, when deliver says so (its watch on time), or never (its watch
// behind).
type delivering struct {
	shim.API
	w       *watch.FakeWatcher
	deliver bool
}

func (d delivering) PatchPool(ctx context.Context, namespace, name string, patch shim.Patch) (*shim.Pool, error) {
	p, err := d.API.PatchPool(ctx, namespace, name, patch)
	if err == nil && d.deliver {
		d.w.Modify(p.DeepCopy())
	}
	return p, err
}

// The agent creates an address's reservation without whereabouts' Lease
// only where no other pool can hold the address, and it knows that from its
// copy only once the copy has shown the allocation's own patch as its
// informer delivered it: a pool created before the patch is then in the
// copy. The answer to the agent's own patch says nothing of the pools the
// watch has not delivered yet; taken as that proof, an overlapping pool
// missing from the copy is missed, and the reservation is made without the
// Lease (whereabouts' ADD on another node, under the Lease, then loses it:
// agent/SAFETY.md, "The reservation's create is the commit point").
func TestAReservationIsMadeWithoutTheLeaseOnlyOnceTheWatchShowedItsPatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		other   bool // a pool whose range overlaps, created after the copy listed, not delivered
		deliver bool // the informer delivers the allocation's patch
		lease   bool
	}{
		{"an overlapping pool the copy lacks, the patch not delivered: under the Lease", true, false, true},
		{"no other pool, the patch not delivered: under the Lease", false, false, true},
		{"no other pool, the patch delivered: without the Lease", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, fake.NewPool(poolName, "192.168.50.0/24", map[string]alloc{}))
			objs := cache.New()
			pw := watch.NewFakeWithChanSize(8, false)
			lw := func(list func() runtime.Object, w watch.Interface) toolscache.ListerWatcher {
				return &toolscache.ListWatch{
					ListFunc:  func(metav1.ListOptions) (runtime.Object, error) { return list(), nil },
					WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return w, nil },
				}
			}
			pools := func() runtime.Object {
				l := &shim.PoolList{ListMeta: metav1.ListMeta{ResourceVersion: r.api.ResourceVersion(fake.Pools, "kube-system", poolName)}}
				l.Items = append(l.Items, r.api.AllPools("kube-system")...)
				return l
			}
			reservations := func() runtime.Object { return &shim.ReservationList{} }
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			require.NoError(t, objs.Watch(ctx, "kube-system", lw(pools, pw), lw(reservations, watch.NewFake())))
			if tc.other {
				r.api.Put(fake.NewPool("192.168.50.0-25", "192.168.50.0/25", nil))
			}
			var holders []string
			r.api.Hook = func(c *fake.Call) error {
				if c.Verb == "create" && c.Resource == fake.Reservations {
					holder := ""
					if l := r.api.Lease("kube-system", "whereabouts"); l != nil && l.Spec.HolderIdentity != nil {
						holder = *l.Spec.HolderIdentity
					}
					holders = append(holders, holder)
				}
				return nil
			}
			wait := 100 * time.Millisecond
			if tc.deliver {
				wait = 10 * time.Second
			}
			r.srv.o.API = cache.API{API: delivering{API: r.api, w: pw, deliver: tc.deliver}, Objects: objs}
			r.srv.o.Allocator = allocpkg.Delegate{Batcher: allocpkg.New(allocpkg.Options{Reserved: objs.Reservation, Pools: objs.Pools,
				Follows: func(namespace, rv string) bool {
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					defer cancel()
					return objs.WaitFollows(ctx, namespace, rv)
				}}), Load: conf.Loader{Quiet: true}.Whereabouts}

			res := r.do(wire.Add, env("c1", "lhnet1"), r.config("0.3.1", ""))
			require.Equal(t, client.Served, res.Outcome, res.Reason)
			require.Nil(t, res.Answer.Error, "%v", res.Answer.Error)
			require.Len(t, holders, 1, "one reservation created")
			if tc.lease {
				assert.NotEmpty(t, holders[0], "created under whereabouts' Lease")
			} else {
				assert.Empty(t, holders[0], "created without whereabouts' Lease")
			}
		})
	}
}
