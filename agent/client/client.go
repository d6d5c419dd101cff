// Package client is the plugin's side of the node agent's protocol
// (agent/wire): find the socket, hand a verb over, and say what became of it.
//
// Whenever the agent cannot serve — no socket, a refused connection, no
// receipt of the request within AckTimeout, no decision within
// DecideTimeout of that receipt, a decline, a protocol version this build
// does not speak — the outcome is Fallback: nothing was written anywhere,
// and the plugin does the work itself. Once the client has said Go, the
// work is the agent's; a connection that breaks before its Answer is Lost:
// the agent may have done any part of the verb.
//
// It uses the standard library and agent/wire only: the plugin links it,
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
	"time"

	"github.com/harvester/harvester-ipam/agent/wire"
)

// DefaultAckTimeout bounds the wait for the agent's receipt of the request
// (wire.Received), from before the connect: an agent that does not read a
// request this fast is not serving (stopped, wedged, being replaced), and
// the plugin's own way costs about 100 ms. The agent writes its receipt
// before any work on the request, so this measures whether it is alive and
// accepting, not how busy the node is.
const DefaultAckTimeout = 100 * time.Millisecond

// DefaultDecideTimeout bounds the wait for the agent's decision (serve or
// decline) after its receipt: its admission reads files and may wait for
// one of its slots (agent.Options.QueueTimeout, 2 s), which a burst on a
// busy node makes slow, while the plugin's own way would queue on
// whereabouts' Lease for seconds.
const DefaultDecideTimeout = 3 * time.Second

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
	// AckTimeout bounds the connect and the wait for the agent's receipt of
	// the request; zero is DefaultAckTimeout.
	AckTimeout time.Duration
	// DecideTimeout bounds the wait for the agent's decision after its
	// receipt; zero is DefaultDecideTimeout. Neither wait goes past the
	// verb's context.
	DecideTimeout time.Duration
}

// New is a client of the socket Locate finds, from this process's
// environment and the node's file, waiting wire.EnvAckTimeout for the
// receipt and wire.EnvDecideTimeout for the decision when they are set.
func New() *Client {
	c := &Client{Socket: Locate(os.Getenv, wire.NodeFile)}
	if d, err := time.ParseDuration(os.Getenv(wire.EnvAckTimeout)); err == nil && d > 0 {
		c.AckTimeout = d
	}
	if d, err := time.ParseDuration(os.Getenv(wire.EnvDecideTimeout)); err == nil && d > 0 {
		c.DecideTimeout = d
	}
	return c
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
	short := c.AckTimeout
	if short <= 0 {
		short = DefaultAckTimeout
	}
	decide := c.DecideTimeout
	if decide <= 0 {
		decide = DefaultDecideTimeout
	}
	h := handshake{ctx: ctx, socket: c.Socket, short: short, decide: decide}
	res, older := h.do(req, time.Now().Add(short))
	if older != 0 {
		// An agent of an older build (a rollout: the plugin's DaemonSet and
		// the agent's roll apart) read the request and declined its
		// version, naming its own, which this build still speaks: asked
		// again in that one. It is alive, and its version acknowledges only
		// after admission: the decision's bound covers that handshake.
		req.Version = older
		res, _ = h.do(req, time.Now().Add(decide))
	}
	return res
}

// handshake is what the exchanges of one Do share: each is a connection.
type handshake struct {
	ctx           context.Context
	socket        string
	short, decide time.Duration
}

// by is t, or ctx's deadline when that comes first.
func (h *handshake) by(t time.Time) time.Time {
	if d, ok := h.ctx.Deadline(); ok && d.Before(t) {
		return d
	}
	return t
}

// do hands req over, in req's version, the first frame due by firstBy. It
// returns the outcome, or, when the agent declined req's version naming an
// older one this build speaks, that version (and a Fallback).
func (h *handshake) do(req wire.Request, firstBy time.Time) (Result, int) {
	firstBy = h.by(firstBy)
	bound := time.Until(firstBy).Round(time.Millisecond)
	if req.Version == wire.Version {
		bound = h.short
	}
	d := net.Dialer{Deadline: firstBy}
	conn, err := d.DialContext(h.ctx, "unix", h.socket)
	if err != nil {
		return fallback("node agent at %s: %v", h.socket, unwrap(err)), 0
	}
	defer conn.Close()
	// A cancelled ctx ends any wait at once.
	stop := context.AfterFunc(h.ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	// setDeadline moves the connection's deadline, keeping a cancel that
	// came meanwhile.
	setDeadline := func(t time.Time) error {
		if err := conn.SetDeadline(t); err != nil {
			return err
		}
		if h.ctx.Err() != nil {
			return conn.SetDeadline(time.Now())
		}
		return nil
	}

	if err := setDeadline(firstBy); err != nil {
		return fallback("node agent: %v", err), 0
	}
	if err := wire.Write(conn, req); err != nil {
		return fallback("node agent: send the request: %v", unwrap(err)), 0
	}
	body, err := wire.ReadFrame(conn)
	if err != nil {
		if isTimeout(err) {
			return fallback("node agent: no acknowledgement within %s", bound), 0
		}
		return fallback("node agent: read its acknowledgement: %v", unwrap(err)), 0
	}
	if head, err := wire.ReadHeader(body); err == nil && head.Type == wire.TypeReceived && req.Version >= 2 {
		// Received: the agent is alive and read the request. Its decision
		// may take admission's time on a busy node, and a wait for a slot.
		if err := wire.DecodeAs(body, req.Version, wire.TypeReceived, &wire.Received{}); err != nil {
			return fallback("node agent: its receipt: %v", err), 0
		}
		if err := setDeadline(h.by(time.Now().Add(h.decide))); err != nil {
			return fallback("node agent: %v", err), 0
		}
		if body, err = wire.ReadFrame(conn); err != nil {
			if isTimeout(err) {
				return fallback("node agent: no decision within %s of its receipt", h.decide), 0
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
	if err := setDeadline(deadline); err != nil {
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
