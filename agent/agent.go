// Package agent is harvester-ipam's node agent: a daemon on each node that
// serves the plugin's verbs over a unix socket (wire), in-process, with
// a warm client of the API server, so that a verb costs no process start of
// whereabouts, no client set-up and no kubeconfig read.
//
// It runs the plugin's own verbs (plugin.Plugin.Run), each in the
// environment its request carried. ADD allocates with Options.Allocator,
// or, without one, by running the real whereabouts binary as the plugin
// does. The agent is never a single point of failure: whatever it declines
// or cannot take in time, the plugin does itself (wire/client), and it
// writes nothing before the client's go-ahead.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
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
	// from its receipt: well below the plugin's bound on the hand-over
	// (client.DefaultHandOver, 30 s), so that the plugin hears "busy"
	// rather than give up; the receipt makes the decision the agent's own.
	// Zero is 2 s. A client of protocol version 1, which waited 100 ms for
	// the decision from before its connect, is declined at once, as before.
	QueueTimeout time.Duration
	// HandshakeTimeout bounds each step of the handshake on the agent's
	// side (reading the request and the go-ahead, writing the receipt, the
	// ack and the answer), from when the agent gets to it. Zero is
	// client.DefaultHandOver (30 s), the plugin's own bound on the
	// hand-over: a plugin that lives answers within it however busy its
	// node (5 s lost go-aheads on a loaded machine), and one that went away
	// has closed its end, which ends the step at once.
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
	// meanwhile every request is declined, the probe's too, and the plugin
	// works alone.
	Following func() error
	// NodeConfig is the node's settings file for harvester-ipam's own log
	// (plugin.Plugin.NodeConfig); "" is conf.DefaultNodeConfig.
	NodeConfig string
	// Wait, when set, waits until done is closed, for a verb that waits for
	// another of its attachment: the simulation waits under its scheduler.
	// Nil waits for done or the verb's end, whichever is first.
	Wait func(done <-chan struct{})
	// BeforeWrite, when set, is called before each frame the agent writes
	// to a client (wire.TypeReceived, wire.TypeAck, wire.TypeAnswer): tests
	// slow the agent down there. Nil in production.
	BeforeWrite func(frame string)
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
	// behind says the copy did not follow when last looked at (for the
	// log: a change is logged once).
	behind  atomic.Bool
	seq     atomic.Uint64
	conns   sync.WaitGroup
	connsMu sync.Mutex
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
		o.HandshakeTimeout = client.DefaultHandOver
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
	o.Metrics.declines(s.decliningFor)
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
