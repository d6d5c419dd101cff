// Package agent is harvester-ipam's node agent: a daemon on each node that
// serves the plugin's verbs over a unix socket (agent/wire), in-process, with
// a warm client of the API server, so that a verb costs no process start of
// whereabouts, no client set-up and no kubeconfig read.
//
// It runs the plugin's own verbs (plugin.Plugin.Run), each in the
// environment its request carried. ADD allocates with Options.Allocator,
// or, without one, by running the real whereabouts binary as the plugin
// does. The agent is never a single point of failure: whatever it declines
// or cannot take in time, the plugin does itself (agent/client), and it
// writes nothing before the client's go-ahead.
package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/agent/wire"
	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/plugin/steps"
	"github.com/harvester/harvester-ipam/shim"
)

// FollowWait bounds the allocator's wait for the agent's copy of the pools
// to show its own patch, before it trusts the copy's "no other pool shares
// this range" (alloc.Options.Follows); past it, the reservation is created
// under whereabouts' Lease.
const FollowWait = 50 * time.Millisecond

// Allocator is what allocates ADD's addresses in the agent, in place of
// the whereabouts binary: plugin.Allocator, and a say in admission.
type Allocator interface {
	plugin.Allocator
	// Declines says why the allocator would not answer this ADD exactly as
	// whereabouts would ("" when it would): the agent then declines it, and
	// the plugin runs whereabouts itself. It runs before the client's
	// go-ahead, so it must write nothing.
	Declines(cfg *conf.Config, args *skel.CmdArgs) string
}

// Options configure a Server.
type Options struct {
	// API is the agent's own client of the API server, shared by every
	// request.
	API shim.API
	// Namespaces are the pool namespaces the agent serves (the Role it holds
	// there); a config whose pools live elsewhere is declined.
	Namespaces []string
	// Node names the node, for the Lease identity of each request.
	Node string
	// Identity names this start of the agent as a holder of whereabouts'
	// Lease (Identity(Node, instance)); each request's store holds it as
	// Identity/<sequence>. Empty: Identity(Node, the pid).
	Identity string
	// Allocator allocates ADD's addresses; nil runs the whereabouts binary
	// the request's CNI_PATH holds, as the plugin does.
	Allocator Allocator
	// Log receives the agent's own log; nil is stderr.
	Log io.Writer
	// Metrics counts requests; nil counts nothing.
	Metrics *Metrics
	// MaxInFlight bounds the requests admitted and served at once; beyond
	// it a request waits for a slot up to QueueTimeout, then the agent
	// declines (the plugin then works alone). Zero is 256.
	MaxInFlight int
	// QueueTimeout bounds a request's wait for one of MaxInFlight slots,
	// from its receipt: below the plugin's wait for the decision
	// (client.DefaultDecideTimeout, 3 s), so that the plugin hears "busy"
	// rather than give up. Zero is 2 s. A client of protocol version 1,
	// which waits 100 ms for the decision from before its connect, is
	// declined at once, as before.
	QueueTimeout time.Duration
	// HandshakeTimeout bounds each step of the handshake on the agent's
	// side (reading the request and the go-ahead, writing the receipt, the
	// ack and the answer). Zero is 5 s.
	HandshakeTimeout time.Duration
	// VerbTimeout bounds one verb; zero is plugin.DefaultTimeout.
	VerbTimeout time.Duration
	// Env is the environment the request's CNI variables are added to for
	// the delegates; nil is the agent's own, without CNI variables.
	Env []string
	// StoreOptions tune the store of each request (its Identity is set per
	// request).
	// Its Group, shared by every request's store (the agent's main sets
	// one: one holder of whereabouts' Lease, turns under one acquisition,
	// the releases and removals of one moment together; the simulation one
	// whose Go and Await run it under its scheduler); nil: each request
	// takes the Lease itself.
	StoreOptions shim.Options
	// LogRequests logs a line for each request: what, its outcome, and how
	// long it took.
	LogRequests bool
	// CheckpointDirs are the checkpoint directories the agent writes (the
	// ones mounted in its container); a config naming another is declined.
	// Nil is conf.DefaultCheckpointDir.
	CheckpointDirs []string
	// Exec runs the verbs' delegates; nil runs the binaries, each dying with
	// the agent (delegate.Orphanless). The simulation runs its model.
	Exec invoke.Exec
	// AtStep, when set, is called at each step boundary of the verbs the
	// agent runs (plugin.Plugin.AtStep): the simulation kills the agent there.
	AtStep func(step string)
	// Following, when set, says why the agent's copy of the pools may no
	// longer follow the cluster (nil when it does: cache.Objects.Following):
	// meanwhile every request is declined and the plugin works alone.
	Following func() error
	// NodeConfig is the node's settings file for harvester-ipam's own log
	// (plugin.Plugin.NodeConfig); "" is conf.DefaultNodeConfig.
	NodeConfig string
	// Wait, when set, waits until done is closed, for a verb that waits for
	// another of its attachment: the simulation waits under its scheduler.
	// Nil waits for done or the verb's end, whichever is first.
	Wait func(done <-chan struct{})
}

// Server serves the plugin's verbs on a Listener.
type Server struct {
	o        Options
	log      *log.Logger
	loader   conf.Loader
	env      []string
	slots    chan struct{}
	stopping atomic.Bool
	// stopped is closed by Stop: the requests waiting for a slot are
	// declined at once.
	stopped  chan struct{}
	stopOnce sync.Once
	health   atomic.Pointer[health]
	seq      atomic.Uint64
	conns    sync.WaitGroup
	connsMu  sync.Mutex
	// running serialises the verbs of each attachment.
	running attachments
}

// New is a server of o.
func New(o Options) (*Server, error) {
	if o.API == nil {
		return nil, errors.New("agent: no API")
	}
	if len(o.Namespaces) == 0 {
		return nil, errors.New("agent: no pool namespace to serve")
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.QueueTimeout <= 0 {
		o.QueueTimeout = 2 * time.Second
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.VerbTimeout <= 0 {
		o.VerbTimeout = plugin.DefaultTimeout
	}
	if o.CheckpointDirs == nil {
		o.CheckpointDirs = []string{conf.DefaultCheckpointDir}
	}
	if o.Identity == "" {
		o.Identity = Identity(o.Node, strconv.Itoa(os.Getpid()))
	}
	w := o.Log
	if w == nil {
		w = os.Stderr
	}
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	s := &Server{
		o:       o,
		log:     log.New(w, "", log.LstdFlags|log.Lmicroseconds),
		loader:  conf.Loader{Quiet: true},
		env:     baseEnv(env),
		slots:   make(chan struct{}, o.MaxInFlight),
		stopped: make(chan struct{}),
	}
	s.running.wait = o.Wait
	s.health.Store(notChecked)
	return s, nil
}

// baseEnv is env without any CNI variable or the delegate guard: each
// request brings its own.
func baseEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CNI_") || k == wire.EnvGuard {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Serve accepts connections on l until it is closed.
func (s *Server) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// EMFILE and the like: wait a little rather than spin.
			s.log.Printf("accept: %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			continue
		}
		// A connection accepted once the agent stops is declined, and
		// is none of the verbs Stop waits for; one before is counted
		// before Stop waits (a WaitGroup's Add from zero must come before
		// its Wait).
		s.connsMu.Lock()
		counted := !s.stopping.Load()
		if counted {
			s.conns.Add(1)
		}
		s.connsMu.Unlock()
		go func() {
			if counted {
				defer s.conns.Done()
			}
			s.serveConn(uc)
		}()
	}
}

// Stop makes the server decline every request from now on (the plugin then
// works alone) and waits until the verbs it took are done, or ctx ends.
func (s *Server) Stop(ctx context.Context) error {
	s.connsMu.Lock()
	s.stopping.Store(true)
	s.connsMu.Unlock()
	s.stopOnce.Do(func() { close(s.stopped) })
	done := make(chan struct{})
	go func() {
		s.conns.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("verbs still running: %w", ctx.Err())
	}
	// The Lease handed back, not left to expire under whereabouts' waits.
	if g := s.o.StoreOptions.Group; g != nil {
		if err := g.Wait(ctx); err != nil {
			return fmt.Errorf("whereabouts' Lease not handed back yet: %w", err)
		}
	}
	return nil
}

// serveConn serves one connection: one request.
func (s *Server) serveConn(c *net.UnixConn) {
	start := time.Now()
	defer c.Close()
	if uid, err := peerUID(c); err != nil || uid != 0 {
		// Only root runs the plugin; anyone else is refused without a word.
		s.o.Metrics.refused()
		s.log.Printf("refused a connection from uid %d (%v): only root is served", uid, err)
		return
	}
	_ = c.SetDeadline(start.Add(s.o.HandshakeTimeout))
	req, err := wire.ReadRequest(c)
	if err != nil {
		s.badRequest(c, err)
		return
	}
	ph := steps.New(start)
	ph.Mark("read")
	done := func(outcome, reason, detail string) { s.record(req, outcome, reason, detail, start, ph) }

	// Every frame in the request's version: a plugin of an older build
	// (a rollout) is served as that build's agent served it.
	var wait time.Duration
	if req.Version >= 2 {
		// Received, at once and before any work: the client's short bound
		// tells an agent that is alive and reading from a dead or wedged
		// one, not a busy node from an idle one. Its decision follows.
		if err := wire.Write(c, wire.Receipt()); err != nil {
			done(outcomeAbandoned, "", "the client left before the receipt")
			return
		}
		wait = s.o.QueueTimeout
	}
	free, queued, reason, detail := s.slot(wait)
	if queued {
		ph.Mark("queue")
	}
	if queued && reason == "" && peerGone(c) {
		// It gave up waiting (its bound for the decision) and works alone.
		free()
		done(outcomeAbandoned, "", "the client left while it waited for a slot")
		return
	}
	var j *Job
	if reason == "" {
		if j, reason, detail = s.admit(req); reason != "" {
			free()
		}
	}
	ph.Mark("admit")
	_ = c.SetDeadline(time.Now().Add(s.o.HandshakeTimeout))
	if reason != "" {
		s.decline(c, req.Version, done, reason, detail)
		return
	}
	defer free()
	ack := wire.Serve()
	ack.Version = req.Version
	if err := wire.Write(c, ack); err != nil {
		done(outcomeAbandoned, "", "the client left before the acknowledgement")
		return
	}
	body, err := wire.ReadFrame(c)
	if err != nil || wire.DecodeAs(body, req.Version, wire.TypeGo, &wire.GoAhead{}) != nil {
		// The client gave up (no go-ahead in its time) and works alone:
		// nothing was written for it, and nothing will be.
		done(outcomeAbandoned, "", "no go-ahead: the client works alone")
		return
	}
	if peerGone(c) {
		done(outcomeAbandoned, "", "the client left after its go-ahead")
		return
	}
	ph.Mark("go")
	// The verb is ours now. A client that goes away cancels it: whatever
	// it has not written yet it never will.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = c.SetDeadline(time.Time{})
	go func() {
		var b [1]byte
		_, _ = c.Read(b[:]) // the client sends nothing more: this returns when it goes
		cancel()
	}()
	ans := s.Run(ctx, j)
	ans.Version = req.Version
	ph.Mark("verb")
	gone := ctx.Err() != nil
	_ = c.SetWriteDeadline(time.Now().Add(s.o.HandshakeTimeout))
	if err := wire.Write(c, ans); err != nil || gone {
		s.log.Printf("%s %s/%s: the client went away before the answer", req.Command, j.args.ContainerID, j.args.IfName)
		done(outcomeLost, "", "")
		return
	}
	ph.Mark("answer")
	if ans.Error != nil {
		done(outcomeFailed, "", ans.Error.Msg)
		return
	}
	done(outcomeServed, "", "")
}

// record counts a request's outcome and, with Options.LogRequests, logs it.
// A probe is counted only: the readiness probe's, every 5 s, would bury the
// log (and the summary) under lines of nothing done.
func (s *Server) record(req wire.Request, outcome, reason, detail string, start time.Time, ph *steps.Timer) {
	if req.Command == wire.Probe {
		s.o.Metrics.probe(outcome)
		return
	}
	took := time.Since(start)
	s.o.Metrics.count(req.Command, outcome, reason)
	if outcome == outcomeServed || outcome == outcomeFailed {
		s.o.Metrics.observe(req.Command, outcome, took)
	}
	if !s.o.LogRequests {
		return
	}
	what := req.Command
	if id := req.Env[wire.EnvContainerID]; id != "" {
		what += " " + id + "/" + req.Env[wire.EnvIfName]
	}
	if detail != "" {
		detail = ": " + detail
	}
	s.log.Printf("%s: %s in %s (%s)%s", what, outcome, took.Round(10*time.Microsecond), ph, detail)
}

// badRequest answers a request that does not read: a decline that carries
// the CNI error, when the connection still takes it.
func (s *Server) badRequest(c *net.UnixConn, err error) {
	if errors.Is(err, io.EOF) {
		return // connected and left: nothing asked
	}
	var ve *wire.VersionError
	if errors.As(err, &ve) {
		s.o.Metrics.count("", outcomeDeclined, "version")
		_ = wire.Write(c, wire.Decline(fmt.Sprintf("protocol version %d; this agent speaks %d", ve.Got, wire.Version)))
		return
	}
	s.o.Metrics.count("", outcomeDeclined, "malformed")
	s.log.Printf("a request that does not read: %v", err)
	ack := wire.Decline("malformed request: " + err.Error())
	ack.Error = &wire.Error{Code: cnitypes.ErrDecodingFailure, Msg: "node agent: the request does not read: " + err.Error()}
	_ = wire.Write(c, ack)
}

func (s *Server) decline(c *net.UnixConn, version int, done func(outcome, reason, detail string), reason, detail string) {
	done(outcomeDeclined, reason, detail)
	ack := wire.Decline(detail)
	ack.Version = version
	_ = wire.Write(c, ack)
}

// Take is what the agent does with a request before its acknowledgement:
// it takes one of MaxInFlight slots, declining at once (busy) when none is
// free, and admits the request. It returns the job to run once the client
// says go and the function that frees its slot, or why it declines: a
// short reason (the metrics' label) and what to tell the client. It writes
// nothing. (The socket's requests wait for a slot: serveConn.)
func (s *Server) Take(req wire.Request) (j *Job, free func(), reason, detail string) {
	free, _, reason, detail = s.slot(0)
	if reason != "" {
		return nil, nil, reason, detail
	}
	j, reason, detail = s.admit(req)
	if reason != "" {
		free()
		return nil, nil, reason, detail
	}
	return j, free, "", ""
}

// slot takes one of MaxInFlight slots, waiting up to wait for one when none
// is free (queued says it waited), or says why not: busy, or stopping (a
// stop ends the wait at once). free gives the slot back.
func (s *Server) slot(wait time.Duration) (free func(), queued bool, reason, detail string) {
	free = func() { <-s.slots }
	select {
	case s.slots <- struct{}{}:
		return free, false, "", ""
	default:
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case s.slots <- struct{}{}:
			return free, true, "", ""
		case <-s.stopped:
			return nil, true, "stopping", "stopping"
		case <-t.C:
		}
	}
	return nil, wait > 0, "busy", fmt.Sprintf("busy: %d requests in flight", cap(s.slots))
}

// Job is an admitted request: the verb's arguments and environment.
type Job struct {
	req  wire.Request
	args *skel.CmdArgs
	env  []string

	// What admission read of the request's config: the config as loaded,
	// and the pool namespace its kubeconfig names.
	cfg                   *conf.Config
	kubeconfig, namespace string
}

// load is the loader of the job's verb: the config admission loaded, when
// the verb reads the request's own.
func (s *Server) load(j *Job) func([]byte) (*conf.Config, error) {
	return func(stdin []byte) (*conf.Config, error) {
		if j.cfg != nil && bytes.Equal(stdin, j.req.Config) {
			return j.cfg, nil
		}
		return s.loader.Load(stdin)
	}
}

// storeOf is the store maker of the job's verb: the namespace admission
// read, for the kubeconfig it read it from.
func (s *Server) storeOf(j *Job) func(string) (*shim.Store, error) {
	return func(kubeconfig string) (*shim.Store, error) {
		if j.namespace != "" && kubeconfig == j.kubeconfig {
			return s.storeIn(j.namespace), nil
		}
		return s.newStore(kubeconfig)
	}
}

// stderrLimit bounds the log a verb may hand back on the plugin's stderr.
const stderrLimit = 64 << 10

// Run does the verb of j, as the plugin would, once the client said go,
// and makes its answer; ctx ends when the client is gone.
func (s *Server) Run(ctx context.Context, j *Job) (ans wire.Answer) {
	if j.req.Command == wire.Probe {
		return wire.NewAnswer(nil, nil, nil)
	}
	if j.args.ContainerID != "" && (j.req.Command == wire.Add || j.req.Command == wire.Del || j.req.Command == wire.Check) {
		release, err := s.running.hold(ctx, j.args.ContainerID+"/"+j.args.IfName)
		if err != nil {
			return wire.NewAnswer(nil, nil, &wire.Error{Code: cnitypes.ErrTryAgainLater,
				Msg: fmt.Sprintf("node agent: %s of %s/%s waited for another verb of the attachment: %v", j.req.Command, j.args.ContainerID, j.args.IfName, err)})
		}
		defer release()
	}
	var stdout bytes.Buffer
	stderr := &capped{max: stderrLimit}
	logs := &fileLog{capped: capped{max: stderrLimit}}
	defer func() {
		if r := recover(); r != nil {
			s.log.Printf("%s %s: panic: %v\n%s", j.req.Command, j.args.ContainerID, r, debug.Stack())
			ans = wire.NewAnswer(nil, stderr.Bytes(), &wire.Error{Code: cnitypes.ErrInternal,
				Msg: fmt.Sprintf("node agent: %s failed: %v", j.req.Command, r)})
		}
	}()
	p := &plugin.Plugin{
		NewStore: s.storeOf(j),
		Load:     s.load(j),
		Stdout:   &stdout,
		Stderr:   stderr,
		Timeout:  s.o.VerbTimeout,
		Env:      j.env,
		// A delegate dies with the agent: a client that sees the agent gone
		// does the verb again, and must not race what the agent started.
		Exec:       delegate.Orphanless(stderr),
		AtStep:     s.o.AtStep,
		NodeConfig: s.o.NodeConfig,
		// The log file is the host's: the client appends the lines.
		LogFile: logs.to(stderr),
		// Whereabouts' kubeconfig is read for its namespace only (its
		// token is bound to whereabouts' pod): the client, on the host,
		// explains a full range.
		ExplainedByClient: true,
	}
	defer func() { ans.LogFile, ans.Log = logs.file, logs.Bytes() }()
	if s.o.Exec != nil {
		p.Exec = s.o.Exec
	}
	if s.o.Allocator != nil {
		p.Allocator = s.o.Allocator
	}
	if err := p.Run(ctx, j.req.Command, j.args); err != nil {
		return wire.NewAnswer(nil, stderr.Bytes(), cniError(err))
	}
	return wire.NewAnswer(stdout.Bytes(), stderr.Bytes(), nil)
}

// cniError is err as skel prints it: a CNI error as it is, any other as an
// internal error with its text.
func cniError(err error) *wire.Error {
	var ce *cnitypes.Error
	if errors.As(err, &ce) {
		return &wire.Error{Code: ce.Code, Msg: ce.Msg, Details: ce.Details}
	}
	return &wire.Error{Code: cnitypes.ErrInternal, Msg: err.Error()}
}

// newStore is the store of a request: the agent's client, in the namespace
// of the kubeconfig the config names (whereabouts'; only its namespace is
// read, never its credentials), under a Lease identity of the request's
// own, since two requests in one process must not take each other for the
// holder of whereabouts' Lease.
func (s *Server) newStore(kubeconfig string) (*shim.Store, error) {
	ns, err := s.namespaceOf(kubeconfig)
	if err != nil {
		return nil, err
	}
	if !s.serves(ns) {
		return nil, cnitypes.NewError(cnitypes.ErrTryAgainLater,
			fmt.Sprintf("node agent: pool namespace %s is not served (it serves %s)", ns, strings.Join(s.o.Namespaces, ", ")),
			"the kubeconfig changed under the request; the runtime retries")
	}
	return s.storeIn(ns), nil
}

// storeIn is a request's store of the pools of namespace ns.
func (s *Server) storeIn(ns string) *shim.Store {
	o := s.o.StoreOptions
	o.Identity = fmt.Sprintf("%s/%d", s.o.Identity, s.seq.Add(1))
	return shim.New(s.o.API, ns, o)
}

// Identity names one start of a node's agent as a holder of whereabouts'
// Lease: harvester-ipam-agent/<node>/<instance>/<8 random hex digits>.
// instance names the process (its pod's UID); the random part, drawn anew
// at each call, tells apart starts that share it (a container restarted in
// its pod keeps the UID, and the pid is 1 in every container). The Lease
// and its observers (whereabouts, the simulation's trace) then see each
// agent as a holder of its own; shim's own rule (a record under our name
// that we did not write is another holder's) guards against a clash.
func Identity(node, instance string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("harvester-ipam-agent/%s/%s/%s", node, instance, hex.EncodeToString(b[:]))
}

// namespaceOf is the pool namespace a whereabouts kubeconfig names, read
// as the plugin reads it, without waiting on a file being rewritten: the
// plugin, which waits, serves that case.
func (s *Server) namespaceOf(kubeconfig string) (string, error) {
	k, err := conf.LoadKubeconfig(kubeconfig, noSleep)
	if err != nil {
		return "", err
	}
	return k.Namespace, nil
}

// noSleep makes LoadKubeconfig give up on a half-written file at once.
func noSleep(time.Duration) {}

func (s *Server) serves(ns string) bool {
	for _, n := range s.o.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// capped keeps the first max bytes written to it.
// fileLog collects a verb's lines for a log file, and the file: one a
// request (a second file's lines go to stderr).
type fileLog struct {
	capped
	file string
}

func (l *fileLog) to(stderr io.Writer) func(string) io.Writer {
	return func(file string) io.Writer {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.file == "" {
			l.file = file
		}
		if l.file != file {
			return stderr
		}
		return &l.capped
	}
}

type capped struct {
	buf bytes.Buffer
	max int
	mu  sync.Mutex
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}
