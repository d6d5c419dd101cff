package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/plugin/steps"
	"github.com/harvester/harvester-ipam/wire"
)

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
	// Every bound of the handshake starts when the agent gets to its step:
	// one that a busy node made late is not its client's silence.
	_ = c.SetDeadline(time.Now().Add(s.o.HandshakeTimeout))
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
		// Received, at once and before any work: from here the verb is the
		// agent's to decide, however long admission and a wait for a slot
		// take on a busy node (the client no longer watches the agent's
		// process, only the hand-over's bound). Its decision follows.
		s.beforeWrite(wire.TypeReceived)
		_ = c.SetWriteDeadline(time.Now().Add(s.o.HandshakeTimeout))
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
		// It gave up waiting (the verb's deadline, or the hand-over's bound)
		// and works alone.
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
	s.beforeWrite(wire.TypeAck)
	_ = c.SetWriteDeadline(time.Now().Add(s.o.HandshakeTimeout))
	if err := wire.Write(c, ack); err != nil {
		done(outcomeAbandoned, "", "the client left before the acknowledgement")
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(s.o.HandshakeTimeout))
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
	s.beforeWrite(wire.TypeAnswer)
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

// beforeWrite is Options.BeforeWrite's call before a frame.
func (s *Server) beforeWrite(frame string) {
	if s.o.BeforeWrite != nil {
		s.o.BeforeWrite(frame)
	}
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
	s.beforeWrite(wire.TypeAck)
	_ = c.SetWriteDeadline(time.Now().Add(s.o.HandshakeTimeout))
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
