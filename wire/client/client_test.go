package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/wire"
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

func do(t *testing.T, c *Client) Result {
	t.Helper()
	return doWithin(t, c, 10*time.Second)
}

// doWithin is do with the verb's context ending after d: what a test that
// waits on the agent's process, not on the time, gives a busy machine.
func doWithin(t *testing.T, c *Client, d time.Duration) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Do(ctx, request())
}

// fakeProc is an agent's process as a test has the kernel say it is.
type fakeProc struct {
	mu      sync.Mutex
	gone    bool
	stopped bool
	// running: a thread runs or waits for a CPU at every look.
	running bool
	// samples counts the looks.
	samples int
}

func (p *fakeProc) Sample() (Sample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.samples++
	return Sample{Gone: p.gone, Stopped: p.stopped, Running: p.running}, nil
}

func (p *fakeProc) looks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.samples
}

// watching is a Watch that watches p, whatever the PID.
func watching(p *fakeProc) func(int) Watcher { return func(int) Watcher { return p } }

func idleProc() *fakeProc { return &fakeProc{} }
func busyProc() *fakeProc { return &fakeProc{running: true} }

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
		_ = wire.Write(c, wire.Receipt())
		_ = wire.Write(c, wire.Serve())
		if readGo(c) != wire.TypeGo {
			return
		}
		_ = wire.Write(c, wire.NewAnswer([]byte(`{"ips":[]}`), []byte("log"), nil))
	})
	res := do(t, &Client{Socket: sock})
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
	// A listener whose backlog is full (one that stopped accepting long
	// ago): the kernel refuses the next connect at once.
	full := filepath.Join(dir, "full.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: full}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	queued, err := net.Dial("unix", full)
	if err != nil {
		t.Fatalf("the first connect: %v", err)
	}
	defer queued.Close()
	for _, tc := range []struct {
		name, sock, want string
	}{
		{"no socket configured", "", "no node agent configured"},
		{"no socket file", filepath.Join(dir, "missing.sock"), syscall.ENOENT.Error()},
		{"a stale socket", stale, syscall.ECONNREFUSED.Error()},
		{"not a socket", dir, syscall.ECONNREFUSED.Error()},
		{"a full backlog", full, syscall.EAGAIN.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// However long it would wait for an agent that is there.
			res := do(t, &Client{Socket: tc.sock, Silence: time.Hour, HandOver: time.Hour, Watch: watching(busyProc())})
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
		{"silence while idle", func(c net.Conn) {}, "node agent: silent for 50ms in which its process was idle (wedged)"},
		{"a closed connection", func(c net.Conn) { c.Close() }, "read its acknowledgement: EOF"},
		{"a newer version", func(c net.Conn) {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: wire.Version + 1, Serve: true})
		}, fmt.Sprintf("protocol version %d; this build speaks %d", wire.Version+1, wire.Version)},
		{"an older version that serves", func(c net.Conn) {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: wire.MinVersion, Serve: true})
		}, fmt.Sprintf("protocol version %d; this build speaks %d", wire.MinVersion, wire.Version)},
		{"a receipt of another version", func(c net.Conn) {
			_ = wire.Write(c, wire.Received{Type: wire.TypeReceived, Version: wire.Version + 1})
		}, fmt.Sprintf("its receipt: protocol version %d", wire.Version+1)},
		{"a receipt, then a decline", func(c net.Conn) {
			_ = wire.Write(c, wire.Receipt())
			_ = wire.Write(c, wire.Decline("busy: 4 requests in flight"))
		}, "node agent declined: busy: 4 requests in flight"},
		{"a receipt, then no decision within the hand-over", func(c net.Conn) {
			_ = wire.Write(c, wire.Receipt())
		}, "no decision within 500ms of the connect"},
		{"a receipt, then a closed connection", func(c net.Conn) {
			_ = wire.Write(c, wire.Receipt())
			c.Close()
		}, "read its decision: EOF"},
		{"two receipts", func(c net.Conn) {
			_ = wire.Write(c, wire.Receipt())
			_ = wire.Write(c, wire.Receipt())
		}, `type "received", want "ack"`},
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
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res := (&Client{Socket: sock, Silence: 50 * time.Millisecond, HandOver: 500 * time.Millisecond, Watch: watching(idleProc())}).Do(ctx, request())
			if res.Outcome != Fallback || !strings.Contains(res.Reason, tc.want) {
				t.Fatalf("got %+v, want a fallback for %q", res, tc.want)
			}
			if got := <-after; got != "closed" {
				t.Fatalf("the agent then read %q, want the connection closed", got)
			}
		})
	}
}

// While its request waits unread, the plugin asks the kernel about the
// agent's process, not the time: one that runs or waits for a CPU (a busy
// node) is waited for however long it takes; one that is gone or stopped
// is absent at once; one that is idle while the request waits is wedged;
// one it cannot watch is given a longer bound of the time alone.
func TestAnAgentIsWaitedForWhileItsProcessIsBusy(t *testing.T) {
	for _, tc := range []struct {
		name string
		proc *fakeProc // nil: it cannot be watched
		// looks before the agent reads the request and serves; 0: never.
		serveAfter int
		handOver   time.Duration
		want       string // "" served
	}{
		{"busy, or waiting for a CPU", busyProc(), 40, time.Hour, ""},
		{"idle", idleProc(), 0, time.Hour, "node agent: silent for 100ms in which its process was idle (wedged)"},
		{"stopped", &fakeProc{stopped: true}, 0, time.Hour, "node agent: its process is stopped"},
		{"gone", &fakeProc{gone: true}, 0, time.Hour, "node agent: its process is gone"},
		{"not to be watched", nil, 0, time.Hour, fmt.Sprintf("node agent: silent for %s (its process cannot be watched)", BlindSilence)},
		{"busy forever", busyProc(), 0, time.Second, "node agent: no acknowledgement within 1s of the connect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			watch := func(int) Watcher { return nil }
			if tc.proc != nil {
				watch = watching(tc.proc)
			}
			sock := fakeAgent(t, func(c net.Conn) {
				if tc.serveAfter == 0 {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					_, _ = c.Read(make([]byte, 1<<16))
					_, _ = c.Read(make([]byte, 1)) // until the client leaves
					return
				}
				for tc.proc.looks() < tc.serveAfter {
					time.Sleep(time.Millisecond)
				}
				if _, err := wire.ReadRequest(c); err != nil {
					return
				}
				_ = wire.Write(c, wire.Receipt())
				_ = wire.Write(c, wire.Serve())
				if readGo(c) == wire.TypeGo {
					_ = wire.Write(c, wire.NewAnswer([]byte(`{}`), nil, nil))
				}
			})
			// The verb's own bound (the plugin's: minutes), not a test's
			// guess at how long 40 looks take on a busy machine (at load,
			// more than 10 s: a fallback for the context's end).
			res := doWithin(t, &Client{Socket: sock, Silence: 100 * time.Millisecond, HandOver: tc.handOver, Watch: watch}, 3*time.Minute)
			if tc.want == "" {
				if res.Outcome != Served {
					t.Fatalf("got %+v, want it served", res)
				}
				return
			}
			if res.Outcome != Fallback || res.Reason != tc.want {
				t.Fatalf("got %+v, want a fallback for %q", res, tc.want)
			}
		})
	}
}

// An agent that received the request waits for its decision as long as
// the hand-over allows, idle or not: the agent decides, and bounds its own
// wait for one of its slots.
func TestAReceivedRequestWaitsForTheDecision(t *testing.T) {
	sock := fakeAgent(t, func(c net.Conn) {
		if _, err := wire.ReadRequest(c); err != nil {
			return
		}
		_ = wire.Write(c, wire.Receipt())
		time.Sleep(300 * time.Millisecond)
		_ = wire.Write(c, wire.Serve())
		if readGo(c) == wire.TypeGo {
			_ = wire.Write(c, wire.NewAnswer([]byte(`{}`), nil, nil))
		}
	})
	res := do(t, &Client{Socket: sock, Silence: 10 * time.Millisecond, Watch: watching(idleProc())})
	if res.Outcome != Served {
		t.Fatalf("got %+v", res)
	}
}

// The wait for the decision never goes past the verb's context.
func TestTheWaitForTheDecisionEndsWithTheVerb(t *testing.T) {
	sock := fakeAgent(t, func(c net.Conn) {
		if _, err := wire.ReadRequest(c); err != nil {
			return
		}
		_ = wire.Write(c, wire.Receipt())
		_, _ = c.Read(make([]byte, 1)) // until the client leaves
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res := (&Client{Socket: sock}).Do(ctx, request())
	if want := "node agent: no decision before the verb ended (context deadline exceeded)"; res.Outcome != Fallback || res.Reason != want {
		t.Fatalf("got %+v, want a fallback for %q", res, want)
	}
	// And a cancel ends it at once.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	res = (&Client{Socket: sock}).Do(ctx, request())
	if want := "node agent: no decision before the verb ended (context canceled)"; res.Outcome != Fallback || res.Reason != want {
		t.Fatalf("cancelled: got %+v, want a fallback for %q", res, want)
	}
}

// oldAgent is an agent of version 1 as it was built: it declines a request
// of another version naming its own, and acknowledges after its admission
// (here well past the short bound); it sees Go and answers in version 1.
func oldAgent(t *testing.T, decline string, seen chan<- string) string {
	return fakeAgent(t, func(c net.Conn) {
		body, err := wire.ReadFrame(c)
		if err != nil {
			return
		}
		h, _ := wire.ReadHeader(body)
		seen <- fmt.Sprintf("request %d", h.Version)
		if h.Version != 1 {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: 1, Reason: fmt.Sprintf("protocol version %d; this agent speaks 1", h.Version)})
			return
		}
		time.Sleep(600 * time.Millisecond)
		if decline != "" {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: 1, Reason: decline})
			return
		}
		_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: 1, Serve: true})
		body, err = wire.ReadFrame(c)
		if err != nil {
			return
		}
		h, _ = wire.ReadHeader(body)
		seen <- fmt.Sprintf("%s %d", h.Type, h.Version)
		_ = wire.Write(c, wire.Answer{Type: wire.TypeAnswer, Version: 1, Stdout: []byte(`{"ips":[]}`)})
	})
}

// During a rollout the plugin may be newer than its node's agent: the agent
// declines the request's version naming its own, 1, which this build still
// speaks, and the plugin asks again in it, with the decision's bound for
// that version's acknowledgement (it comes after admission).
func TestAnOlderAgentIsAskedAgainInItsVersion(t *testing.T) {
	seen := make(chan string, 10)
	// Its admission is work: its process is busy meanwhile.
	older := func(sock string) *Client { return &Client{Socket: sock, Watch: watching(busyProc())} }
	res := do(t, older(oldAgent(t, "", seen)))
	if res.Outcome != Served || string(res.Answer.Stdout) != `{"ips":[]}` {
		t.Fatalf("got %+v", res)
	}
	close(seen)
	var got []string
	for s := range seen {
		got = append(got, s)
	}
	if want := []string{"request 2", "request 1", "go 1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the agent saw %q, want %q", got, want)
	}

	// Its decline in its version is a decline; it is asked once more only.
	seen = make(chan string, 10)
	res = do(t, older(oldAgent(t, "busy: 256 requests in flight", seen)))
	if res.Outcome != Fallback || res.Reason != "node agent declined: busy: 256 requests in flight" {
		t.Fatalf("got %+v", res)
	}
	if len(seen) != 2 {
		t.Fatalf("%d requests, want 2", len(seen))
	}
}

// A version decline naming a version this build does not speak falls back
// at once, without asking again.
func TestADeclineOfAVersionThisBuildDoesNotSpeakFallsBack(t *testing.T) {
	var n atomic.Int32
	sock := fakeAgent(t, func(c net.Conn) {
		n.Add(1)
		if _, err := wire.ReadFrame(c); err == nil {
			_ = wire.Write(c, wire.Ack{Type: wire.TypeAck, Version: wire.MinVersion - 1, Reason: "protocol version 2; this agent speaks 0"})
		}
	})
	res := do(t, &Client{Socket: sock})
	if res.Outcome != Fallback || !strings.Contains(res.Reason, "protocol version 0") || n.Load() != 1 {
		t.Fatalf("got %+v after %d connections", res, n.Load())
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
			res := do(t, &Client{Socket: sock})
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
	res := (&Client{Socket: sock}).Do(ctx, request())
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
	if c := New(); c.Socket != "/tmp/x.sock" || c.Silence != 0 || c.HandOver != 0 || c.Watch != nil {
		t.Fatalf("got %+v", c)
	}
}
