package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/agent/wire"
)

// fakeAgent serves one socket with handle, once per connection, and reports
// what the handler saw on seen.
func fakeAgent(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return sock
}

func request() wire.Request {
	return wire.NewRequest(wire.Add, map[string]string{wire.EnvContainerID: "c1"}, []byte(`{"name":"n"}`))
}

func do(t *testing.T, sock string, ack time.Duration) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return (&Client{Socket: sock, AckTimeout: ack}).Do(ctx, request())
}

// readGo reads what follows the acknowledgement: Go, or the end of the
// connection when the client fell back.
func readGo(c net.Conn) string {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	body, err := wire.ReadFrame(c)
	if err != nil {
		return "closed"
	}
	h, _ := wire.ReadHeader(body)
	return h.Type
}

func TestAServedVerbReturnsTheAnswer(t *testing.T) {
	sock := fakeAgent(t, func(c net.Conn) {
		req, err := wire.ReadRequest(c)
		if err != nil || req.Env[wire.EnvContainerID] != "c1" || string(req.Config) != `{"name":"n"}` {
			return
		}
		_ = wire.Write(c, wire.Serve())
		if readGo(c) != wire.TypeGo {
			return
		}
		_ = wire.Write(c, wire.NewAnswer([]byte(`{"ips":[]}`), []byte("log"), nil))
	})
	res := do(t, sock, time.Second)
	if res.Outcome != Served || string(res.Answer.Stdout) != `{"ips":[]}` || string(res.Answer.Stderr) != "log" {
		t.Fatalf("got %+v", res)
	}
}

func TestNoAgentFallsBack(t *testing.T) {
	dir := t.TempDir()
	// A socket file with no listener (an agent that died): refused at once.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("the stale socket file is gone: %v", err)
	}
	for _, tc := range []struct {
		name, sock, want string
	}{
		{"no socket configured", "", "no node agent configured"},
		{"no socket file", filepath.Join(dir, "missing.sock"), syscall.ENOENT.Error()},
		{"a stale socket", stale, syscall.ECONNREFUSED.Error()},
		{"not a socket", dir, syscall.ECONNREFUSED.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := do(t, tc.sock, time.Minute)
			if res.Outcome != Fallback || !strings.Contains(res.Reason, tc.want) {
				t.Fatalf("got %+v, want a fallback for %q", res, tc.want)
			}
		})
	}
}

// Every way the agent may fail before its acknowledgement ends in a
// fallback, and the agent never sees Go.
func TestWhatComesBeforeTheAckFallsBackAndNeverSaysGo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handle func(c net.Conn) // before what follows the ack
		want   string
	}{
		{"a decline", func(c net.Conn) { _ = wire.Write(c, wire.Decline("busy")) }, "node agent declined: busy"},
		{"no ack in time", func(c net.Conn) { time.Sleep(300 * time.Millisecond); _ = wire.Write(c, wire.Serve()) }, "no acknowledgement within 50ms"},
		{"a closed connection", func(c net.Conn) { c.Close() }, "read its acknowledgement: EOF"},
		{"a newer version", func(c net.Conn) {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: wire.Version + 1, Serve: true})
		}, fmt.Sprintf("protocol version %d; this build speaks %d", wire.Version+1, wire.Version)},
		{"an ack that is not one", func(c net.Conn) { _ = wire.Write(c, wire.Go()) }, `type "go", want "ack"`},
		{"an unknown field", func(c net.Conn) {
			_ = wire.Write(c, map[string]any{"type": "ack", "version": wire.Version, "serve": true, "x": 1})
		}, `unknown field "x"`},
		{"garbage", func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, "message larger than the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := make(chan string, 1)
			sock := fakeAgent(t, func(c net.Conn) {
				if _, err := wire.ReadRequest(c); err != nil {
					after <- "bad request: " + err.Error()
					return
				}
				tc.handle(c)
				after <- readGo(c)
			})
			res := do(t, sock, 50*time.Millisecond)
			if res.Outcome != Fallback || !strings.Contains(res.Reason, tc.want) {
				t.Fatalf("got %+v, want a fallback for %q", res, tc.want)
			}
			if got := <-after; got != "closed" {
				t.Fatalf("the agent then read %q, want the connection closed", got)
			}
		})
	}
}

// An agent that never accepts (stopped, its backlog full): the connect
// succeeds, and the acknowledgement never comes.
func TestAnAgentThatNeverAcceptsFallsBack(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	res := do(t, sock, 50*time.Millisecond)
	if res.Outcome != Fallback || !strings.Contains(res.Reason, "no acknowledgement within 50ms") {
		t.Fatalf("got %+v", res)
	}
}

func TestABreakAfterGoIsLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handle func(c net.Conn)
		want   string
	}{
		{"closed", func(c net.Conn) {}, "read its answer: EOF"},
		{"cut", func(c net.Conn) { _, _ = c.Write([]byte{0, 0, 1, 0, '{'}) }, "read its answer: message cut short"},
		{"not an answer", func(c net.Conn) { _ = wire.Write(c, wire.Serve()) }, `type "ack", want "answer"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeAgent(t, func(c net.Conn) {
				if _, err := wire.ReadRequest(c); err != nil {
					return
				}
				_ = wire.Write(c, wire.Serve())
				if readGo(c) == wire.TypeGo {
					tc.handle(c)
				}
			})
			res := do(t, sock, time.Second)
			if res.Outcome != Lost || !strings.Contains(res.Reason, tc.want) {
				t.Fatalf("got %+v, want lost for %q", res, tc.want)
			}
		})
	}
}

// After Go the client waits as long as the verb may take, and no longer.
func TestTheWaitForTheAnswerEndsWithTheVerb(t *testing.T) {
	sock := fakeAgent(t, func(c net.Conn) {
		if _, err := wire.ReadRequest(c); err != nil {
			return
		}
		_ = wire.Write(c, wire.Serve())
		readGo(c)
		time.Sleep(2 * time.Second)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res := (&Client{Socket: sock, AckTimeout: time.Second}).Do(ctx, request())
	if res.Outcome != Lost || !strings.Contains(res.Reason, "no answer before the verb's deadline") {
		t.Fatalf("got %+v", res)
	}
}

func TestLocate(t *testing.T) {
	dir := t.TempDir()
	n := 0
	file := func(content string) string {
		n++
		p := filepath.Join(dir, fmt.Sprintf("agent%d.conf", n))
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == wire.EnvSocket {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name, env, nodeFile, want string
	}{
		{"the variable wins", "/tmp/a.sock", file(`{"socket":"/run/x/agent.sock"}`), "/tmp/a.sock"},
		{"the variable turns it off", wire.NoAgent, file(`{"socket":"/run/x/agent.sock"}`), ""},
		{"the node file", "", file(`{"socket":"/run/x/agent.sock"}`), "/run/x/agent.sock"},
		{"a relative socket in the node file", "", file(`{"socket":"agent.sock"}`), wire.DefaultSocket},
		{"a broken node file", "", file(`{"socket":`), wire.DefaultSocket},
		{"no node file", "", filepath.Join(dir, "none"), wire.DefaultSocket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Locate(env(tc.env), tc.nodeFile); got != tc.want {
				t.Fatalf("Locate = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNewReadsTheEnvironment(t *testing.T) {
	t.Setenv(wire.EnvSocket, "/tmp/x.sock")
	t.Setenv(wire.EnvAckTimeout, "2s")
	c := New()
	if c.Socket != "/tmp/x.sock" || c.AckTimeout != 2*time.Second {
		t.Fatalf("got %+v", c)
	}
	t.Setenv(wire.EnvAckTimeout, "soon")
	if c := New(); c.AckTimeout != 0 {
		t.Fatalf("a bad duration: %+v, want the default", c)
	}
}
