package plugin

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

// agentStub plays a node agent on a socket of its own: ack decides on each
// request; after go, serve does the verb and returns the answer to write,
// or nil to close the connection without one (an agent killed midway).
type agentStub struct {
	ack   func(req wire.Request) wire.Ack
	serve func(req wire.Request, conn net.Conn) *wire.Answer
	// requests are those acknowledged, in order.
	requests chan wire.Request
}

func (a *agentStub) start(t *testing.T) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	a.requests = make(chan wire.Request, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			a.handle(c)
		}
	}()
	return &client.Client{Socket: sock}
}

func (a *agentStub) handle(c net.Conn) {
	done := make(chan struct{})
	// serve may end its goroutine (runtime.Goexit) as a killed agent would.
	go func() {
		defer close(done)
		defer c.Close()
		req, err := wire.ReadRequest(c)
		if err != nil {
			return
		}
		if wire.Write(c, wire.Receipt()) != nil {
			return
		}
		ack := wire.Serve()
		if a.ack != nil {
			ack = a.ack(req)
		}
		if wire.Write(c, ack) != nil || !ack.Serve {
			return
		}
		body, err := wire.ReadFrame(c)
		if err != nil || wire.Decode(body, wire.TypeGo, &wire.GoAhead{}) != nil {
			return
		}
		a.requests <- req
		if ans := a.serve(req, c); ans != nil {
			_ = wire.Write(c, *ans)
		}
	}()
	<-done
}

// through runs a verb as the plugin binary does: offered to p.Agent first.
func through(p *Plugin, verb string, a *skel.CmdArgs) error {
	f := p.Funcs()
	switch verb {
	case wire.Add:
		return f.Add(a)
	case wire.Del:
		return f.Del(a)
	case wire.Check:
		return f.Check(a)
	case wire.GC:
		return f.GC(a)
	}
	return f.Status(a)
}

// A verb the agent serves is its answer, printed as the plugin prints its
// own; nothing is done here.
func TestAVerbTheAgentServesIsItsAnswer(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	stub := &agentStub{serve: func(req wire.Request, _ net.Conn) *wire.Answer {
		switch req.Command {
		case wire.Add:
			a := wire.NewAnswer([]byte(`{"cniVersion":"0.3.1","ips":[{"address":"192.168.50.9/24"}]}`), []byte("agent log\n"), nil)
			return &a
		default:
			a := wire.NewAnswer(nil, nil, &wire.Error{Code: 11, Msg: "try again", Details: "the API server is down"})
			return &a
		}
	}}
	r.p.Agent = stub.start(t)
	a := args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))
	a.NetnsOverride = "1"
	require.NoError(t, through(r.p, wire.Add, a))
	assert.Equal(t, `{"cniVersion":"0.3.1","ips":[{"address":"192.168.50.9/24"}]}`, r.out.String())
	assert.Equal(t, "agent log\n", r.log.String())

	req := <-stub.requests
	assert.Equal(t, wire.Add, req.Command)
	assert.Equal(t, map[string]string{"CNI_CONTAINERID": "new", "CNI_IFNAME": "lhnet1", "CNI_ARGS": podArgs,
		"CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin", "CNI_NETNS_OVERRIDE": "1"}, req.Env)
	assert.Equal(t, string(r.config("0.3.1", "")), string(req.Config))

	err := through(r.p, wire.Del, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, &cnitypes.Error{Code: 11, Msg: "try again", Details: "the API server is down"}, err)

	assert.Empty(t, r.calls(), "nothing delegated here")
	assert.Len(t, r.pool(), 3, "nothing released here")
}

// What the agent logged for a log file (the host's, which its pod does not
// mount) is appended to that file here; lines for a file that is not an
// absolute path go to stderr.
func TestTheAgentsLogForAFileIsAppendedHere(t *testing.T) {
	r := newRig(t)
	file := filepath.Join(t.TempDir(), "harvester-ipam.log")
	require.NoError(t, os.WriteFile(file, []byte("before\n"), 0o600))
	for _, logFile := range []string{file, "relative.log"} {
		stub := &agentStub{serve: func(req wire.Request, _ net.Conn) *wire.Answer {
			a := wire.NewAnswer([]byte(`{"cniVersion":"0.3.1"}`), nil, nil)
			a.LogFile, a.Log = logFile, []byte("[debug] harvester-ipam ADD new: took ...\n")
			return &a
		}}
		r.p.Agent = stub.start(t)
		require.NoError(t, through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, "before\n[debug] harvester-ipam ADD new: took ...\n", string(b))
	assert.Equal(t, "[debug] harvester-ipam ADD new: took ...\n", r.log.String(), "a relative path: stderr")
}

// A verb the agent does not take is done here, as without an agent, and
// the debug log says why: no agent, a dead one (no socket, the socket of
// one that died, one killed as it read the request or after its receipt:
// the kernel closed its end, before go), a decline. The ADD is done once:
// one delegate ADD, the pod one entry.
func TestAVerbTheAgentDoesNotTakeIsDoneHere(t *testing.T) {
	for _, tc := range []struct {
		name  string
		agent func(t *testing.T) *client.Client
		why   string
	}{
		{"no agent", func(t *testing.T) *client.Client { return &client.Client{} }, "no node agent configured"},
		{"no socket", func(t *testing.T) *client.Client {
			return &client.Client{Socket: filepath.Join(t.TempDir(), "agent.sock")}
		}, "no such file or directory"},
		{"the socket of an agent that died", func(t *testing.T) *client.Client {
			sock := filepath.Join(t.TempDir(), "agent.sock")
			l, err := net.Listen("unix", sock)
			require.NoError(t, err)
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			require.NoError(t, l.Close())
			return &client.Client{Socket: sock}
		}, "connection refused"},
		{"an agent killed as it read the request", func(t *testing.T) *client.Client { return killedAgent(t, false) },
			"node agent: read its acknowledgement: EOF"},
		{"an agent killed after its receipt", func(t *testing.T) *client.Client { return killedAgent(t, true) },
			"node agent: read its decision: EOF"},
		{"a decline", func(t *testing.T) *client.Client {
			return (&agentStub{ack: func(wire.Request) wire.Ack { return wire.Decline("node_slice_size") }}).start(t)
		}, "node agent declined: node_slice_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			r.p.Agent = tc.agent(t)
			require.NoError(t, through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", `,"log_level":"debug"`))))
			assert.Equal(t, []string{"ADD whereabouts"}, r.calls())
			var mine []string
			for off, a := range r.pool() {
				if a.PodRef == "longhorn-system/im-a" {
					mine = append(mine, off)
				}
			}
			assert.Equal(t, []string{"2"}, mine, "the pod's entries")
			assert.Equal(t, "new", r.pool()["2"].ContainerID)
			assert.Contains(t, r.log.String(), tc.why+"; doing it here")
		})
	}
}

// killedAgent is an agent killed with the first request it reads, before
// or after its receipt: its process gone, the kernel closes its socket and
// the connection, so the request's end reads EOF.
func killedAgent(t *testing.T, receipt bool) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if _, err := wire.ReadRequest(c); err == nil && receipt {
			_ = wire.Write(c, wire.Receipt())
		}
		c.Close()
		l.Close()
	}()
	return &client.Client{Socket: sock}
}

// An ADD the agent took and lost, wherever it was lost: the pod ends with
// exactly one address, the one this ADD returns, and one reservation. On
// v0.7.0, which never hands back an existing entry, an ADD that did not
// release the attachment first would leave it two.
func TestALostAddLeavesThePodOneAddress(t *testing.T) {
	for _, v := range []string{fake.V070, fake.V080, fake.V093} {
		for _, step := range []string{"add-after-checkpoint", "add-after-reclaim", "add-after-delegate", "before-answer"} {
			t.Run(v+" "+step, func(t *testing.T) {
				r := newRig(t, crashLoopedPool()...)
				r.wb.Version = v
				// The agent: this plugin's verbs on the same store and
				// whereabouts, killed at step.
				stub := &agentStub{}
				stub.serve = func(req wire.Request, conn net.Conn) *wire.Answer {
					agent := *r.p
					agent.Agent = nil
					agent.Stdout, agent.Stderr = io.Discard, io.Discard
					agent.AtStep = func(s string) {
						if s == step {
							conn.Close()
							runtime.Goexit()
						}
					}
					a := &skel.CmdArgs{ContainerID: req.Env[wire.EnvContainerID], IfName: req.Env[wire.EnvIfName],
						Args: req.Env[wire.EnvArgs], Path: req.Env[wire.EnvPath], Netns: req.Env[wire.EnvNetns], StdinData: req.Config}
					assert.NoError(t, agent.Run(context.Background(), req.Command, a))
					return nil // lost before its answer
				}
				r.p.Agent = stub.start(t)
				require.NoError(t, through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))

				res, err := current.NewResultFromResult(mustResult(t, r.out.Bytes()))
				require.NoError(t, err)
				require.Len(t, res.IPs, 1)
				got := res.IPs[0].Address.IP.String()
				var mine []string
				for off, a := range r.pool() {
					if a.PodRef == "longhorn-system/im-a" {
						mine = append(mine, off)
						assert.Equal(t, alloc{ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: ifnameOf(v)}, a)
					}
				}
				require.Len(t, mine, 1, "the pod's entries: %v", r.pool())
				assert.Equal(t, got, fmt.Sprintf("192.168.50.%s", mine[0]))
				assert.Equal(t, []string{got + "=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"}, r.orips())
				assert.Contains(t, r.log.String(), "the node agent took this ADD and did not answer")
			})
		}
	}
}

// A node agent killed between removing an earlier sandbox's entries and
// judging their reservations (its release's order, whereabouts' own DEL's)
// leaves the pod's reservations without entries. The plugin's ADD that takes
// over the lost ADD releases them, so that whereabouts v0.7.0, which takes
// a reserved address as taken, hands the pod its lowest free address and no
// reservation is left without its entry.
func TestALostAddReleasesThePodsStrayReservations(t *testing.T) {
	for _, v := range []string{fake.V070, fake.V080, fake.V093} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t, ipamPool(map[string]alloc{"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}),
				fake.NewReservation("192.168.50.2", "longhorn-system/im-a"), // the earlier sandbox's, its entry removed
				fake.NewReservation("192.168.50.4", "longhorn-system/im-b"))
			r.wb.Version = v
			// The earlier sandbox's checkpoint on this node, which its DEL
			// never removed, names the address.
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", PodRef: "longhorn-system/im-a",
				Network: "storagenetwork", Namespace: "kube-system", IPs: []string{"192.168.50.2/24"},
				Pools: []checkpoint.Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}}}))
			stub := &agentStub{serve: func(wire.Request, net.Conn) *wire.Answer { return nil }}
			r.p.Agent = stub.start(t)
			require.NoError(t, through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
			assert.Equal(t, map[string]alloc{
				"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: ifnameOf(v)},
				"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}, r.pool())
			assert.Equal(t, []string{"192.168.50.2=longhorn-system/im-a", "192.168.50.4=longhorn-system/im-b"}, r.orips())
		})
	}
}

// A lost ADD of one interface never releases another interface's entry of
// the same sandbox, even without ifnames (v0.7.0): the sibling's recorded
// address tells them apart; a sibling that recorded none leaves the unnamed
// entries alone.
func TestALostAddKeepsTheSandboxsOtherInterface(t *testing.T) {
	for _, tc := range []struct {
		name       string
		siblingIPs []string
		wantKept   []string // offsets of the pod's entries besides the new one
	}{
		{"a sibling that recorded its address", []string{"192.168.50.5/24"}, []string{"5"}},
		{"a sibling that recorded nothing", nil, []string{"5", "6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t,
				ipamPool(map[string]alloc{
					"5": {ContainerID: "new", PodRef: "longhorn-system/im-a"}, // lhnet2's, v0.7.0
					"6": {ContainerID: "new", PodRef: "longhorn-system/im-a"}, // what the lost ADD of lhnet1 wrote
				}),
				fake.NewReservation("192.168.50.5", "longhorn-system/im-a"),
				fake.NewReservation("192.168.50.6", "longhorn-system/im-a"))
			r.wb.Version = fake.V070
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "new", IfName: "lhnet2", Network: "storagenetwork",
				PodRef: "longhorn-system/im-a", Kubeconfig: r.kubeconfig(), Namespace: "kube-system",
				Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, IPs: tc.siblingIPs}))
			stub := &agentStub{serve: func(wire.Request, net.Conn) *wire.Answer { return nil }}
			r.p.Agent = stub.start(t)
			require.NoError(t, through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
			got := mustIP(t, r.out.Bytes())
			var kept []string
			for off := range r.pool() {
				if fmt.Sprintf("192.168.50.%s", off) != got {
					kept = append(kept, off)
				}
			}
			sort.Strings(kept)
			assert.Equal(t, tc.wantKept, kept)
		})
	}
}

func mustIP(t *testing.T, out []byte) string {
	t.Helper()
	res, err := current.NewResultFromResult(mustResult(t, out))
	require.NoError(t, err)
	require.Len(t, res.IPs, 1)
	return res.IPs[0].Address.IP.String()
}

func ifnameOf(wb string) string {
	if wb == fake.V070 {
		return ""
	}
	return "lhnet1"
}

func mustResult(t *testing.T, out []byte) cnitypes.Result {
	t.Helper()
	res, err := version.NewResult("0.3.1", out)
	require.NoError(t, err, "a result: %s", out)
	return res
}

// A DEL the agent took and lost is done here as it is: it is idempotent.
func TestALostDelIsDoneHere(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	stub := &agentStub{serve: func(wire.Request, net.Conn) *wire.Answer { return nil }}
	r.p.Agent = stub.start(t)
	require.NoError(t, through(r.p, wire.Del, args(t, "b1", "lhnet1", podArgs, r.config("0.3.1", ""))))
	assert.NotContains(t, r.pool(), "4", "released here")
	assert.Equal(t, wire.Del, (<-stub.requests).Command)
}

// The allocator seam: with an Allocator, ADD allocates through it, after
// the checkpoint and the reclaim, and records and prints what it returns;
// no delegate runs.
func TestAddAllocatesThroughTheAllocator(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	alloc := &allocatorStub{ip: "192.168.50.7/24"}
	r.p.Allocator = alloc
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("1.0.0", ""))))
	assert.Empty(t, r.calls(), "no delegate")
	assert.JSONEq(t, `{"cniVersion":"1.0.0","ips":[{"address":"192.168.50.7/24"}]}`, r.out.String())
	require.Len(t, alloc.calls, 1)
	assert.Equal(t, "new/lhnet1 "+poolName, alloc.calls[0])
	assert.NotContains(t, r.pool(), "3", "earlier sandboxes reclaimed before")
	rec, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []string{"192.168.50.7/24"}, rec.IPs)
}

func TestTheAllocatorsErrorIsWhereaboutsErrorExplained(t *testing.T) {
	r := newRig(t, ipamPool(map[string]alloc{}))
	r.fillPool(t)
	r.p.Allocator = &allocatorStub{err: &cnitypes.Error{Code: 999, Msg: "error at storage engine: Could not allocate IP in range: ip: 192.168.50.1 / - 192.168.50.254 / range: 192.168.50.0/24 / excludeRanges: []"}}
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, uint(999), cniCode(t, err))
	assert.Contains(t, err.Error(), "whereabouts ADD: error at storage engine: Could not allocate IP in range")
	assert.Contains(t, err.Error(), "pool kube-system/192.168.50.0-24 (192.168.50.0/24) holds 256 entries")
}

type allocatorStub struct {
	ip    string
	err   error
	calls []string
}

func (a *allocatorStub) Add(_ context.Context, _ *shim.Store, cfg *conf.Config, args *skel.CmdArgs) (cnitypes.Result, error) {
	a.calls = append(a.calls, args.ContainerID+"/"+args.IfName+" "+cfg.Pools[0].Name)
	if a.err != nil {
		return nil, a.err
	}
	_, ipn, _ := net.ParseCIDR(a.ip)
	ip, _, _ := net.ParseCIDR(a.ip)
	ipn.IP = ip
	return &current.Result{CNIVersion: current.ImplementedSpecVersion, IPs: []*current.IPConfig{{Address: *ipn}}}, nil
}

// A node agent answers a full range with whereabouts' error alone (it lists
// no pods with whereabouts' kubeconfig); the plugin, on the host, adds the
// explanation its own ADD gives, gone pods named, as the exec path would.
func TestAFullRangeTheAgentAnswersIsExplainedHere(t *testing.T) {
	r := newRig(t, ipamPool(map[string]alloc{}))
	r.fillPool(t)
	r.p.Pods = func(context.Context, string, string) ([]Pod, error) { return nil, nil } // every pod gone
	stub := &agentStub{serve: func(req wire.Request, _ net.Conn) *wire.Answer {
		a := wire.NewAnswer(nil, nil, &wire.Error{Code: 999, Msg: "whereabouts ADD: error at storage engine: Could not allocate IP in range: ip: 192.168.50.1 / - 192.168.50.254 / range: 192.168.50.0/24 / excludeRanges: []"})
		return &a
	}}
	r.p.Agent = stub.start(t)
	err := through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, uint(999), cniCode(t, err))
	assert.Contains(t, err.Error(), "whereabouts ADD: error at storage engine: Could not allocate IP in range")
	assert.Contains(t, err.Error(), "pool kube-system/192.168.50.0-24 (192.168.50.0/24) holds 256 entries")
	assert.Contains(t, err.Error(), "gone or finished")
}

// askedAgent counts the verbs offered to it and declines each, as the node
// agent declines every verb of a node-slice config.
type askedAgent struct{ asked []string }

func (a *askedAgent) Do(_ context.Context, req wire.Request) client.Result {
	a.asked = append(a.asked, req.Command)
	return client.Result{Outcome: client.Fallback, Reason: "node agent declined: node_slice_size"}
}

// A node-slice network is whereabouts' own on every verb, and the agent
// declines each: the plugin does not ask it. On a busy node a round trip to
// an agent of little CPU weight, only to be declined, made every pod of
// such a network slower than whereabouts alone (whereabouts' node-slice
// suite, on the rig: up to 1.5x per spec).
func TestANodeSliceVerbIsNotOfferedToTheAgent(t *testing.T) {
	for _, verb := range []string{wire.Add, wire.Del, wire.Check, wire.GC, wire.Status} {
		t.Run(verb, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			agent := &askedAgent{}
			r.p.Agent = agent
			_ = through(r.p, verb, args(t, "new", "lhnet1", podArgs, r.standInConfig("0.3.1", `,"node_slice_size":"/26"`)))
			assert.Empty(t, agent.asked)
		})
	}
	// Any other config is offered first, as ever.
	r := newRig(t, crashLoopedPool()...)
	agent := &askedAgent{}
	r.p.Agent = agent
	_ = through(r.p, wire.Add, args(t, "new", "lhnet1", podArgs, r.standInConfig("0.3.1", "")))
	assert.Equal(t, []string{wire.Add}, agent.asked)
}
