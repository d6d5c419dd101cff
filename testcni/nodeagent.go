package testcni

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/harvester/harvester-ipam/wire"
	"github.com/harvester/harvester-ipam/wire/client"
)

// Agent is harvester-ipam-agent as the rig runs it for a tenant's pools, as
// the chart's DaemonSet runs it on a node: a process of the rig's with a
// socket of its own, logged in as the chart's agent (the tenant's
// AgentKubeconfig) or, for a tenant without identities, the rig's admin. A Network whose Agent is
// set hands the plugin's verbs to it (as a node's plugin finds its agent);
// one without never reaches an agent.
type Agent struct {
	Tenant *Tenant
	// Socket is the agent's socket, Log its log.
	Socket, Log string
	// Metrics is where it serves its metrics (http://.../metrics).
	Metrics string

	args []string
	env  []string
	mu   sync.Mutex
	proc *proc
	dir  string
	bin  string
}

// AgentOptions tune an agent.
type AgentOptions struct {
	// Name tells agents of one tenant apart ("agent" unless set).
	Name string
	// Kubeconfig is the agent's identity; empty is the tenant's
	// AgentKubeconfig (the chart's agent Role), else the rig's admin.
	Kubeconfig string
	// Args are more flags of harvester-ipam-agent.
	Args []string
	// Env is more of its environment.
	Env []string
	// Crashpoints runs the agent built with the crashpoints tag: it kills
	// itself at the allocator's step HARVESTER_IPAM_CRASH_AT (in Env) names.
	Crashpoints bool
}

// StartAgent builds harvester-ipam-agent (once per rig) and starts it for
// t's pools (nil: the default tenant); it returns once the agent serves.
func (r *Rig) StartAgent(ctx context.Context, t *Tenant, o AgentOptions) (*Agent, error) {
	if t == nil {
		t = r.Default
	}
	bin, err := r.agentBinary(ctx, o.Crashpoints)
	if err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "agent"
	}
	kubeconfig := o.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = t.AgentKubeconfig
	}
	if kubeconfig == "" {
		kubeconfig = r.Kubeconfig
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// A socket's path holds at most 107 bytes: a short directory of its own.
	dir, err := os.MkdirTemp(r.Dir, "a")
	if err != nil {
		return nil, err
	}
	a := &Agent{Tenant: t, Socket: filepath.Join(dir, "run", "agent.sock"), Log: filepath.Join(dir, o.Name+".log"),
		Metrics: fmt.Sprintf("127.0.0.1:%d", port), dir: dir, bin: bin, env: append(os.Environ(), o.Env...)}
	a.args = append([]string{"--kubeconfig", kubeconfig, "--namespace", t.PoolNamespace, "--socket", a.Socket,
		"--node-file", "", "--metrics-addr", a.Metrics, "--summary-interval", "0",
		"--node", t.Node(o.Name), "--log-requests"}, o.Args...)
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.agents = append(r.agents, a)
	r.mu.Unlock()
	return a, nil
}

func (r *Rig) agentBinary(ctx context.Context, crashpoints bool) (string, error) {
	if r.parent != nil {
		return r.parent.agentBinary(ctx, crashpoints)
	}
	if crashpoints {
		bin := filepath.Join(r.bin, "harvester-ipam-agent-crashpoints")
		r.agentCrashOnce.Do(func() {
			r.agentCrashErr = r.build(ctx, bin, "./cmd/harvester-ipam-agent", "-tags=crashpoints")
		})
		return bin, r.agentCrashErr
	}
	r.agentOnce.Do(func() {
		bin := filepath.Join(r.bin, "harvester-ipam-agent")
		r.agentErr = r.build(ctx, bin, "./cmd/harvester-ipam-agent")
	})
	return filepath.Join(r.bin, "harvester-ipam-agent"), r.agentErr
}

// Start starts the agent (again, after Stop or Kill) and waits until it
// serves: its socket answers a probe and its metrics answer (the agent
// binds its metrics port beside the socket, not before it, so on a busy
// machine a test that read the counts at once found the port refusing).
func (a *Agent) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil && !a.proc.exited() {
		return fmt.Errorf("agent %s runs already", a.Socket)
	}
	p, err := startProcWith(a.dir, strings.TrimSuffix(filepath.Base(a.Log), ".log"), a.bin, nil, a.env, a.args...)
	if err != nil {
		return err
	}
	a.proc = p
	var last client.Result
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if p.exited() {
			return fmt.Errorf("agent exited at start:\n%s", p.tail())
		}
		if last = a.Probe(ctx); last.Outcome != client.Served {
			continue
		}
		if _, err := a.Requests(ctx); err != nil {
			last.Reason = "its metrics: " + err.Error()
			continue
		}
		return nil
	}
	return fmt.Errorf("agent does not serve after 30 s (%s):\n%s", last.Reason, p.tail())
}

// Probe asks the agent whether it serves, as its readiness probe does.
func (a *Agent) Probe(ctx context.Context) client.Result {
	c := &client.Client{Socket: a.Socket}
	return c.Do(ctx, wire.NewRequest(wire.Probe, nil, nil))
}

// Stop stops the agent as its pod's stop does (SIGTERM: it refuses new
// requests and finishes those under way).
func (a *Agent) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proc.stop(30 * time.Second)
}

// Kill kills the agent (SIGKILL): its socket stays, refusing connections.
func (a *Agent) Kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	_ = a.proc.cmd.Process.Kill()
	<-a.proc.done
	a.proc.done <- nil
}

// Pause stops the agent's process (SIGSTOP): connections queue, and nothing
// answers them. Resume lets it go on (SIGCONT).
func (a *Agent) Pause() error  { return a.signal(syscall.SIGSTOP) }
func (a *Agent) Resume() error { return a.signal(syscall.SIGCONT) }

func (a *Agent) signal(s syscall.Signal) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc.cmd.Process.Signal(s)
}

// LogTail is the end of the agent's log.
func (a *Agent) LogTail() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc.tail()
}

// Requests reads the agent's count of requests by "COMMAND outcome[
// reason]" from its metrics.
func (a *Agent) Requests(ctx context.Context) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Metrics+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "harvester_ipam_agent_requests_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(line, "} ")
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		key := strings.TrimSpace(l["command"] + " " + l["outcome"] + " " + l["reason"])
		n, _ := strconv.ParseFloat(value, 64)
		out[key] = int(n)
	}
	return out, sc.Err()
}

// agentEnv is the plugin's environment for a network: its agent's socket,
// or none at all.
func (n *Network) agentEnv() []string {
	if n.Agent == nil {
		return []string{wire.EnvSocket + "=" + wire.NoAgent}
	}
	return []string{wire.EnvSocket + "=" + n.Agent.Socket}
}

// AgentKillerDir is a CNI bin dir where harvester-ipam stands in for
// whereabouts version, as the stand-in's, but whose real whereabouts, the
// first time one of its ADDs succeeds, kills the process that ran it
// (SIGKILL) before that process can answer: a node agent killed right after
// whereabouts allocated, the worst state a lost ADD leaves. Every later run
// is whereabouts' own.
func (r *Rig) AgentKillerDir(version string) (string, error) {
	real := r.Tools["whereabouts-"+version]
	if real == "" {
		return "", fmt.Errorf("no whereabouts %s in the rig's tools", version)
	}
	dir, err := os.MkdirTemp(r.Dir, "killer-")
	if err != nil {
		return "", err
	}
	links := map[string]string{"bridge": r.Tools["bridge"], "host-local": r.Tools["host-local"]}
	script := fmt.Sprintf(`#!/bin/sh
out=$(%q)
rc=$?
if [ "$CNI_COMMAND" = ADD ] && [ $rc = 0 ] && mkdir %q 2>/dev/null; then
	kill -KILL $PPID
	sleep 5
fi
printf '%%s\n' "$out"
exit $rc
`, real, filepath.Join(dir, "killed"))
	wrapper := filepath.Join(dir, "whereabouts-killer")
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "bin")
	if _, err := standInDir(bin, links, filepath.Join(r.bin, "harvester-ipam"), wrapper, false); err != nil {
		return "", err
	}
	return bin, nil
}

// Memory is the agent process's resident set and its peak (VmRSS, VmHWM),
// in KiB.
func (a *Agent) Memory() (rss, peak int64, err error) {
	m, err := a.MemoryDetail()
	if err != nil {
		return 0, 0, err
	}
	return m["VmRSS"], m["VmHWM"], nil
}

// MemoryDetail is the agent process's memory as /proc/PID/status gives it,
// in KiB by field (VmRSS, VmHWM, RssAnon, RssFile, RssShmem, ...).
func (a *Agent) MemoryDetail() (map[string]int64, error) {
	a.mu.Lock()
	pid := a.proc.cmd.Process.Pid
	a.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64); err == nil {
			out[k] = n
		}
	}
	if out["VmRSS"] == 0 {
		return nil, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return out, nil
}
