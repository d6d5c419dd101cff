// Package client is the plugin's side of the node agent's protocol
// (agent/wire): find the socket, hand a verb over, and say what became of it.
//
// Whenever the agent cannot serve — no socket, a refused connection, no
// acknowledgement within AckTimeout, a decline, a protocol version this
// build does not speak — the outcome is Fallback: nothing was written
// anywhere, and the plugin does the work itself. Once the client has said
// Go, the work is the agent's; a connection that breaks before its Answer is
// Lost: the agent may have done any part of the verb.
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

// DefaultAckTimeout bounds the wait for the agent's acknowledgement, from
// before the connect: an agent that does not answer this fast is not
// serving (stopped, overloaded, being replaced), and the plugin's own way
// costs about 100 ms.
const DefaultAckTimeout = 100 * time.Millisecond

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
	// AckTimeout bounds the wait for the acknowledgement; zero is
	// DefaultAckTimeout.
	AckTimeout time.Duration
}

// New is a client of the socket Locate finds, from this process's
// environment and the node's file, waiting wire.EnvAckTimeout for the
// acknowledgement when that is set.
func New() *Client {
	c := &Client{Socket: Locate(os.Getenv, wire.NodeFile)}
	if d, err := time.ParseDuration(os.Getenv(wire.EnvAckTimeout)); err == nil && d > 0 {
		c.AckTimeout = d
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
	bound := c.AckTimeout
	if bound <= 0 {
		bound = DefaultAckTimeout
	}
	ackBy := time.Now().Add(bound)
	if d, ok := ctx.Deadline(); ok && d.Before(ackBy) {
		ackBy = d
	}
	d := net.Dialer{Deadline: ackBy}
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return fallback("node agent at %s: %v", c.Socket, unwrap(err))
	}
	defer conn.Close()
	// A cancelled ctx ends any wait at once.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	if err := conn.SetDeadline(ackBy); err != nil {
		return fallback("node agent: %v", err)
	}
	if err := wire.Write(conn, req); err != nil {
		return fallback("node agent: send the request: %v", unwrap(err))
	}
	body, err := wire.ReadFrame(conn)
	if err != nil {
		if isTimeout(err) {
			return fallback("node agent: no acknowledgement within %s", bound)
		}
		return fallback("node agent: read its acknowledgement: %v", unwrap(err))
	}
	var ack wire.Ack
	if err := wire.Decode(body, wire.TypeAck, &ack); err != nil {
		return fallback("node agent: its acknowledgement: %v", err)
	}
	if !ack.Serve {
		return fallback("node agent declined: %s", ack.Reason)
	}

	// From here the agent may write: a break is Lost, not Fallback.
	var deadline time.Time
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return fallback("node agent: %v", err)
	}
	if err := wire.Write(conn, wire.Go()); err != nil {
		// A write to a unix socket that fails delivered nothing (the agent
		// closed its end): the agent never read Go, and writes only after it.
		return fallback("node agent: send go: %v", unwrap(err))
	}
	body, err = wire.ReadFrame(conn)
	if err != nil {
		if isTimeout(err) {
			return lost("node agent: no answer before the verb's deadline")
		}
		return lost("node agent: read its answer: %v", unwrap(err))
	}
	var ans wire.Answer
	if err := wire.Decode(body, wire.TypeAnswer, &ans); err != nil {
		return lost("node agent: its answer: %v", err)
	}
	return Result{Outcome: Served, Answer: ans}
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
