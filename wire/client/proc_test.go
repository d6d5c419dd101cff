package client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harvester/harvester-ipam/wire"
)

// An agent of a process of its own, as the kernel sees it: this test binary
// started again as one of agentModes, listening at helperSocket.
const (
	helperMode   = "HARVESTER_IPAM_TEST_AGENT"
	helperSocket = "HARVESTER_IPAM_TEST_AGENT_SOCKET"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperMode); mode != "" {
		agentProcess(mode, os.Getenv(helperSocket))
		return
	}
	os.Exit(m.Run())
}

// agentModes are what the agent's process does with the first connection.
var agentModes = map[string]func(l net.Listener){
	// Wedged: it listens and never accepts, its threads asleep.
	"sleep": func(net.Listener) { time.Sleep(time.Hour) },
	// Busy on a CPU (or waiting for one) and never reading.
	"spin": func(net.Listener) {
		for {
		}
	},
	// Stopped (SIGSTOP, a debugger).
	"stop": func(net.Listener) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		time.Sleep(time.Hour)
	},
	// Killed once it has read the request, before a word.
	"die-before-receipt": func(l net.Listener) { agentDies(l, 0) },
	// Killed after its receipt, before its decision.
	"die-after-receipt": func(l net.Listener) { agentDies(l, 1) },
	// Killed after the go-ahead, before its answer.
	"die-after-go": func(l net.Listener) { agentDies(l, 2) },
}

// agentDies serves the first connection up to step, then is killed.
func agentDies(l net.Listener, step int) {
	c, err := l.Accept()
	if err != nil {
		os.Exit(3)
	}
	if _, err := wire.ReadRequest(c); err != nil {
		os.Exit(3)
	}
	if step >= 1 {
		_ = wire.Write(c, wire.Receipt())
	}
	if step >= 2 {
		_ = wire.Write(c, wire.Serve())
		_, _ = wire.ReadFrame(c)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Hour)
}

func agentProcess(mode, sock string) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	fmt.Println("listening")
	agentModes[mode](l)
}

// startAgentProcess starts the agent's process in mode and returns its
// socket once it listens.
func startAgentProcess(t *testing.T, mode string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperMode+"="+mode, helperSocket+"="+sock)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("the agent's process: %q, %v", line, err)
	}
	return sock
}

// The plugin tells, by what the kernel says of the agent's process, an
// agent that is busy from one that is wedged, stopped or killed: a wedged
// one (asleep while the request waits) costs the silence, a stopped one
// nothing, a killed one nothing before Go (the kernel closes its end) and
// a lost verb after; a busy one is waited for, never taken for wedged.
func TestTheKernelSaysWhetherTheAgentIsThere(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		handOver time.Duration
		outcome  Outcome
		want     []string // the reason is one of these
	}{
		{"sleep", 0, Fallback, []string{"node agent: silent for 200ms in which its process was idle (wedged)"}},
		{"spin", time.Second, Fallback, []string{"node agent: no acknowledgement within 1s of the connect"}},
		{"stop", 0, Fallback, []string{"node agent: its process is stopped"}},
		// The end of its connection, or its process gone: whichever the
		// plugin sees first.
		{"die-before-receipt", 0, Fallback, []string{"node agent: read its acknowledgement: EOF", "node agent: read its acknowledgement: connection reset by peer", "node agent: its process is gone"}},
		{"die-after-receipt", 0, Fallback, []string{"node agent: read its decision: EOF", "node agent: read its decision: connection reset by peer"}},
		{"die-after-go", 0, Lost, []string{"node agent: read its answer: EOF", "node agent: read its answer: connection reset by peer"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			sock := startAgentProcess(t, tc.mode)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res := (&Client{Socket: sock, HandOver: tc.handOver}).Do(ctx, request())
			ok := false
			for _, w := range tc.want {
				ok = ok || res.Reason == w
			}
			if res.Outcome != tc.outcome || !ok {
				t.Fatalf("got %s (%s), want %s for one of %q", res.Outcome, res.Reason, tc.outcome, strings.Join(tc.want, " | "))
			}
		})
	}
}

// WatchProc reads what the kernel says of a process: this one runs (the
// thread that reads), and its time grows as it runs.
func TestWatchProcReadsAProcess(t *testing.T) {
	w := WatchProc(os.Getpid())
	first, err := w.Sample()
	if err != nil {
		t.Fatal(err)
	}
	for s := first; s.CPU <= first.CPU; {
		if s, err = w.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	if first.Gone || first.Stopped || !first.Running {
		t.Fatalf("a sample %+v of a running process", first)
	}
	gone, err := WatchProc(1 << 30).Sample()
	if err != nil || !gone.Gone {
		t.Fatalf("no such process: %+v, %v", gone, err)
	}
}
