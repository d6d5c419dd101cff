package testcni

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Gate is a TCP forwarder on loopback in front of the API server: a node's
// kubeconfig names the gate, so that cutting it makes the API server
// unreachable from that node only (connection refused, as when it is down),
// while the tests and every other node still reach it.
type Gate struct {
	Addr   string // host:port the node dials
	target string
	// listen opens the gate's listener (again): on the rig's loopback, or on
	// an address inside a machine.
	listen func() (net.Listener, error)

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

func newGate(target string) (*Gate, error) {
	var addr string
	return newGateWith(target, func() (net.Listener, error) {
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			addr = ln.Addr().String() // the same port when opened again
		}
		return ln, err
	})
}

// newGateWith is a gate whose listener listen opens.
func newGateWith(target string, listen func() (net.Listener, error)) (*Gate, error) {
	g := &Gate{target: target, conns: map[net.Conn]bool{}, listen: listen}
	ln, err := listen()
	if err != nil {
		return nil, fmt.Errorf("gate to %s: %w", target, err)
	}
	g.Addr = ln.Addr().String()
	g.serve(ln)
	return g, nil
}

// Cut closes the gate: new connections are refused, open ones are reset.
func (g *Gate) Cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		g.ln.Close()
		g.ln = nil
	}
	for c := range g.conns {
		c.Close()
	}
	g.conns = map[net.Conn]bool{}
}

// Open opens the gate again on the same address.
func (g *Gate) Open() error {
	g.mu.Lock()
	open := g.ln != nil
	g.mu.Unlock()
	if open {
		return nil
	}
	ln, err := g.listen()
	if err != nil {
		return fmt.Errorf("reopen the gate on %s: %w", g.Addr, err)
	}
	g.serve(ln)
	return nil
}

func (g *Gate) serve(ln net.Listener) {
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // cut or closed
			}
			go g.forward(c)
		}
	}()
}

func (g *Gate) track(c net.Conn, on bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on && g.ln == nil {
		return false // cut meanwhile
	}
	if on {
		g.conns[c] = true
	} else {
		delete(g.conns, c)
	}
	return true
}

func (g *Gate) forward(c net.Conn) {
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		c.Close()
		return
	}
	if !g.track(c, true) || !g.track(up, true) {
		c.Close()
		up.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side closes or the gate is cut
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
	g.track(c, false)
	g.track(up, false)
}
