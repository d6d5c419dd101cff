// Package client is the plugin's side of the node agent's protocol
// (wire): find the socket, hand a verb over, and say what became of it.
//
// Whenever the agent is absent or does not take the verb — no socket, a
// refused connection, the connection closed before its decision, its
// process gone, stopped, or idle while the request waits unread (wedged),
// no decision within HandOver of the connect, a decline, a protocol
// version this build does not speak — the outcome is Fallback: nothing was
// written anywhere, and the plugin does the work itself. A busy node is
// none of these: an agent that runs or waits for a CPU is waited for. Once
// the client has said Go, the work is the agent's; a connection that
// breaks before its Answer is Lost: the agent may have done any part of
// the verb.
//
// It uses the standard library and wire only: the plugin links it,
// and every sandbox pays for the plugin's start.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/wire"
)

// DefaultSilence bounds the time the agent may leave a request unread
// while its process is idle: its threads neither running nor waiting for a
// CPU (see Sample). A healthy agent is never idle while a request waits on
// its socket (the kernel wakes it at once, and reading the request is the
// first thing it does), so this tells a wedged agent (a deadlock, a frozen
// cgroup) from a sound one, however busy the node: an agent that runs, or
// waits for a CPU, is never taken for wedged. It is about what whereabouts
// alone takes for one ADD on a quiet node (the bench: 138 ms), so a wedged
// agent costs the plugin about one more whereabouts ADD.
const DefaultSilence = 200 * time.Millisecond

// BlindSilence bounds it instead when the plugin cannot watch the agent's
// process (its PID not visible here, no /proc): every moment then counts,
// busy or not, against a bound ten times as long.
const BlindSilence = 2 * time.Second

// DefaultHandOver bounds the hand-over, from the connect to the agent's
// decision, whatever the agent's process does: an agent busy forever on a
// CPU without reading, or one that received the request and never decides,
// costs the plugin this, and the plugin's own way then still has
// whereabouts' own 2 minutes (AddTimeLimit) within the runtime's 4
// (kubelet's sandbox timeout). The agent decides within its own bound on
// its queue (agent.Options.QueueTimeout, 2 s) and its admission, which
// reads files: a sound agent comes nowhere near it.
const DefaultHandOver = 30 * time.Second

// pollEvery is how often the plugin looks at the agent's process while its
// request waits unread.
const pollEvery = 50 * time.Millisecond

// Outcome is what became of a verb handed to the agent.
type Outcome int

const (
	// Fallback: the agent did not take the verb, and wrote nothing for it.
	Fallback Outcome = iota
	// Served: the agent did the verb; Result.Answer says how it went.
	Served
	// Lost: the agent took the verb and the connection broke before its
	// answer. Any part of the verb may have been done.
	Lost
)

func (o Outcome) String() string {
	switch o {
	case Served:
		return "served"
	case Lost:
		return "lost"
	}
	return "fallback"
}

// Result is a verb's outcome, the agent's answer when Served, and why not
// otherwise.
type Result struct {
	Outcome Outcome
	Answer  wire.Answer
	Reason  string
}

// Client hands verbs to the agent at Socket.
type Client struct {
	// Socket is the agent's unix socket; "" is no agent.
	Socket string
	// Silence bounds the time the agent may leave the request unread while
	// its process is idle; zero is DefaultSilence.
	Silence time.Duration
	// HandOver bounds the wait from the connect to the agent's decision;
	// zero is DefaultHandOver. Neither wait goes past the verb's context.
	HandOver time.Duration
	// Watch watches the agent's process (pid as the connection names it, 0
	// when it does not) while the request waits unread; nil is WatchProc,
	// none for pid 0. Tests give their own.
	Watch func(pid int) Watcher
}

// New is a client of the socket Locate finds, from this process's
// environment and the node's file.
func New() *Client {
	return &Client{Socket: Locate(os.Getenv, wire.NodeFile)}
}

// Locate finds the agent's socket: the variable wire.EnvSocket when set
// (wire.NoAgent: none), else the socket nodeFile names, else
// wire.DefaultSocket. "" means no agent.
func Locate(getenv func(string) string, nodeFile string) string {
	if s := getenv(wire.EnvSocket); s != "" {
		if s == wire.NoAgent {
			return ""
		}
		return s
	}
	if b, err := os.ReadFile(nodeFile); err == nil {
		var nc wire.NodeConf
		if json.Unmarshal(b, &nc) == nil && filepath.IsAbs(nc.Socket) {
			return nc.Socket
		}
	}
	return wire.DefaultSocket
}

func fallback(format string, a ...any) Result {
	return Result{Outcome: Fallback, Reason: fmt.Sprintf(format, a...)}
}

func lost(format string, a ...any) Result {
	return Result{Outcome: Lost, Reason: fmt.Sprintf(format, a...)}
}

// Do hands req to the agent and waits for its answer until ctx ends.
func (c *Client) Do(ctx context.Context, req wire.Request) Result {
	if c == nil || c.Socket == "" {
		return fallback("no node agent configured")
	}
	h := handshake{ctx: ctx, socket: c.Socket, silence: c.Silence, handOver: c.HandOver, watch: c.Watch}
	if h.silence <= 0 {
		h.silence = DefaultSilence
	}
	if h.handOver <= 0 {
		h.handOver = DefaultHandOver
	}
	if h.watch == nil {
		h.watch = func(pid int) Watcher {
			if pid <= 0 {
				return nil
			}
			return WatchProc(pid)
		}
	}
	res, older := h.do(req)
	if older != 0 {
		// An agent of an older build (a rollout: the plugin's DaemonSet and
		// the agent's roll apart) read the request and declined its
		// version, naming its own, which this build still speaks: asked
		// again in that one. Its version acknowledges after admission.
		req.Version = older
		res, _ = h.do(req)
	}
	return res
}

// handshake is what the exchanges of one Do share: each is a connection.
type handshake struct {
	ctx               context.Context
	socket            string
	silence, handOver time.Duration
	watch             func(pid int) Watcher
}

// by is t, or ctx's deadline when that comes first.
func (h *handshake) by(t time.Time) time.Time {
	if d, ok := h.ctx.Deadline(); ok && d.Before(t) {
		return d
	}
	return t
}

// late says why a frame did not come by the hand-over's deadline.
func (h *handshake) late(what string) Result {
	err := h.ctx.Err()
	if d, ok := h.ctx.Deadline(); ok && err == nil && !time.Now().Before(d) {
		err = context.DeadlineExceeded // its timer has yet to say so
	}
	if err != nil {
		return fallback("node agent: no %s before the verb ended (%v)", what, err)
	}
	return fallback("node agent: no %s within %s of the connect", what, h.handOver)
}

// do hands req over, in req's version. It returns the outcome, or, when the
// agent declined req's version naming an older one this build speaks, that
// version (and a Fallback).
//
// The plugin falls back before Go only when the agent is absent: the
// socket missing or refusing (no agent, or one that died), the connection
// closed before a decision (the agent killed, or stopping), its process
// gone, stopped or idle while the request waits unread (wedged); or when it
// declines, or past the hand-over bound. A busy node is none of these.
func (h *handshake) do(req wire.Request) (Result, int) {
	handOver := h.by(time.Now().Add(h.handOver))
	d := net.Dialer{Deadline: handOver}
	conn, err := d.DialContext(h.ctx, "unix", h.socket)
	if err != nil {
		return fallback("node agent at %s: %v", h.socket, unwrap(err)), 0
	}
	defer conn.Close()
	// A cancelled ctx ends any wait at once.
	stop := context.AfterFunc(h.ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	x := exchange{h: h, conn: conn}

	if err := x.setDeadline(handOver); err != nil {
		return fallback("node agent: %v", err), 0
	}
	if err := wire.Write(conn, req); err != nil {
		return fallback("node agent: send the request: %v", unwrap(err)), 0
	}
	// Its first frame: the receipt (version 2), or its decision (version
	// 1, or a request it cannot read).
	if why := x.awaitRead(handOver); why != "" {
		return fallback("node agent: %s", why), 0
	}
	body, err := wire.ReadFrame(conn)
	if err != nil {
		if isTimeout(err) {
			return h.late("acknowledgement"), 0
		}
		return fallback("node agent: read its acknowledgement: %v", unwrap(err)), 0
	}
	if head, err := wire.ReadHeader(body); err == nil && head.Type == wire.TypeReceived && req.Version >= 2 {
		// Received: the agent read the request, and the verb is its to
		// decide. Its decision may take admission's time on a busy node,
		// and a wait for a slot, which the agent bounds itself.
		if err := wire.DecodeAs(body, req.Version, wire.TypeReceived, &wire.Received{}); err != nil {
			return fallback("node agent: its receipt: %v", err), 0
		}
		if body, err = wire.ReadFrame(conn); err != nil {
			if isTimeout(err) {
				return h.late("decision"), 0
			}
			return fallback("node agent: read its decision: %v", unwrap(err)), 0
		}
	}
	var ack wire.Ack
	if err := wire.DecodeAs(body, req.Version, wire.TypeAck, &ack); err != nil {
		var ve *wire.VersionError
		if errors.As(err, &ve) && ve.Got < req.Version && wire.Speaks(ve.Got) {
			var old wire.Ack
			if wire.DecodeAs(body, ve.Got, wire.TypeAck, &old) == nil && !old.Serve {
				return fallback("node agent declined: %s", old.Reason), ve.Got
			}
		}
		return fallback("node agent: its acknowledgement: %v", err), 0
	}
	if !ack.Serve {
		return fallback("node agent declined: %s", ack.Reason), 0
	}

	// From here the agent may write: a break is Lost, not Fallback.
	var deadline time.Time
	if d, ok := h.ctx.Deadline(); ok {
		deadline = d
	}
	if err := x.setDeadline(deadline); err != nil {
		return fallback("node agent: %v", err), 0
	}
	goAhead := wire.Go()
	goAhead.Version = req.Version
	if err := wire.Write(conn, goAhead); err != nil {
		// A write to a unix socket that fails delivered nothing (the agent
		// closed its end): the agent never read Go, and writes only after it.
		return fallback("node agent: send go: %v", unwrap(err)), 0
	}
	body, err = wire.ReadFrame(conn)
	if err != nil {
		if isTimeout(err) {
			return lost("node agent: no answer before the verb's deadline"), 0
		}
		return lost("node agent: read its answer: %v", unwrap(err)), 0
	}
	var ans wire.Answer
	if err := wire.DecodeAs(body, req.Version, wire.TypeAnswer, &ans); err != nil {
		return lost("node agent: its answer: %v", err), 0
	}
	return Result{Outcome: Served, Answer: ans}, 0
}

// exchange is one connection of a handshake.
type exchange struct {
	h    *handshake
	conn net.Conn
}

// setDeadline moves the connection's deadline, keeping a cancel that came
// meanwhile.
func (x exchange) setDeadline(t time.Time) error {
	if err := x.conn.SetDeadline(t); err != nil {
		return err
	}
	if x.h.ctx.Err() != nil {
		return x.conn.SetDeadline(time.Now())
	}
	return nil
}

// awaitRead waits until the agent's first frame (or the end of the
// connection) can be read, or until, looking at its process every
// pollEvery, the agent is found absent: it says why then, "" otherwise.
// It leaves the connection's deadline at until, or past (ctx ended): the
// read that follows says what became of it.
func (x exchange) awaitRead(until time.Time) string {
	uc, ok := x.conn.(*net.UnixConn)
	if !ok {
		return ""
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ""
	}
	defer func() { _ = x.setDeadline(until) }()
	watch := func() Watcher { return x.h.watch(peerPID(x.conn)) }
	s := newSilence(watch, x.h.silence, BlindSilence)
	for {
		next := time.Now().Add(pollEvery)
		if next.After(until) {
			next = until
		}
		if err := x.setDeadline(next); err != nil {
			return ""
		}
		ready := false
		err := raw.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
				return false // nothing yet: wait until it can be read
			}
			ready = true // a frame, the end of the stream, or an error: the read says
			return true
		})
		now := time.Now()
		if ready || !errors.Is(err, os.ErrDeadlineExceeded) || !now.Before(until) || x.h.ctx.Err() != nil {
			return ""
		}
		if why := s.observe(now); why != "" {
			return why
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// unwrap drops the net package's "dial unix /path:" prefixes, which the
// message names already.
func unwrap(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}
