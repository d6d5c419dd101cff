package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/wire"
)

// Job is an admitted request: the verb's arguments and environment.
type Job struct {
	req  wire.Request
	args *skel.CmdArgs
	env  []string

	// What admission read of the request's config: the config as loaded,
	// and the pool namespace its kubeconfig names.
	cfg                   *conf.Config
	kubeconfig, namespace string
}

// load is the loader of the job's verb: the config admission loaded, when
// the verb reads the request's own.
func (s *Server) load(j *Job) func([]byte) (*conf.Config, error) {
	return func(stdin []byte) (*conf.Config, error) {
		if j.cfg != nil && bytes.Equal(stdin, j.req.Config) {
			return j.cfg, nil
		}
		return s.loader.Load(stdin)
	}
}

// storeOf is the store maker of the job's verb: the namespace admission
// read, for the kubeconfig it read it from.
func (s *Server) storeOf(j *Job) func(string) (*shim.Store, error) {
	return func(kubeconfig string) (*shim.Store, error) {
		if j.namespace != "" && kubeconfig == j.kubeconfig {
			return s.storeIn(j.namespace), nil
		}
		return s.newStore(kubeconfig)
	}
}

// stderrLimit bounds the log a verb may hand back on the plugin's stderr.
const stderrLimit = 64 << 10

// Run does the verb of j, as the plugin would, once the client said go,
// and makes its answer; ctx ends when the client is gone.
func (s *Server) Run(ctx context.Context, j *Job) (ans wire.Answer) {
	if j.req.Command == wire.Probe {
		return wire.NewAnswer(nil, nil, nil)
	}
	if j.args.ContainerID != "" && (j.req.Command == wire.Add || j.req.Command == wire.Del || j.req.Command == wire.Check) {
		release, err := s.running.hold(ctx, j.args.ContainerID+"/"+j.args.IfName)
		if err != nil {
			return wire.NewAnswer(nil, nil, &wire.Error{Code: cnitypes.ErrTryAgainLater,
				Msg: fmt.Sprintf("node agent: %s of %s/%s waited for another verb of the attachment: %v", j.req.Command, j.args.ContainerID, j.args.IfName, err)})
		}
		defer release()
	}
	var stdout bytes.Buffer
	stderr := &capped{max: stderrLimit}
	logs := &fileLog{capped: capped{max: stderrLimit}}
	defer func() {
		if r := recover(); r != nil {
			s.log.Printf("%s %s: panic: %v\n%s", j.req.Command, j.args.ContainerID, r, debug.Stack())
			ans = wire.NewAnswer(nil, stderr.Bytes(), &wire.Error{Code: cnitypes.ErrInternal,
				Msg: fmt.Sprintf("node agent: %s failed: %v", j.req.Command, r)})
		}
	}()
	p := &plugin.Plugin{
		NewStore: s.storeOf(j),
		Load:     s.load(j),
		Stdout:   &stdout,
		Stderr:   stderr,
		Timeout:  s.o.VerbTimeout,
		Env:      j.env,
		// A delegate dies with the agent: a client that sees the agent gone
		// does the verb again, and must not race what the agent started.
		Exec:       delegate.Orphanless(stderr),
		AtStep:     s.o.AtStep,
		NodeConfig: s.o.NodeConfig,
		// The log file is the host's: the client appends the lines.
		LogFile: logs.to(stderr),
		// Whereabouts' kubeconfig is read for its namespace only (its
		// token is bound to whereabouts' pod): the client, on the host,
		// explains a full range.
		ExplainedByClient: true,
	}
	defer func() { ans.LogFile, ans.Log = logs.file, logs.Bytes() }()
	if s.o.Exec != nil {
		p.Exec = s.o.Exec
	}
	if s.o.Allocator != nil {
		p.Allocator = s.o.Allocator
	}
	if err := p.Run(ctx, j.req.Command, j.args); err != nil {
		return wire.NewAnswer(nil, stderr.Bytes(), cniError(err))
	}
	return wire.NewAnswer(stdout.Bytes(), stderr.Bytes(), nil)
}

// cniError is err as skel prints it: a CNI error as it is, any other as an
// internal error with its text.
func cniError(err error) *wire.Error {
	var ce *cnitypes.Error
	if errors.As(err, &ce) {
		return &wire.Error{Code: ce.Code, Msg: ce.Msg, Details: ce.Details}
	}
	return &wire.Error{Code: cnitypes.ErrInternal, Msg: err.Error()}
}

// newStore is the store of a request: the agent's client, in the namespace
// of the kubeconfig the config names (whereabouts'; only its namespace is
// read, never its credentials), under a Lease identity of the request's
// own, since two requests in one process must not take each other for the
// holder of whereabouts' Lease.
func (s *Server) newStore(kubeconfig string) (*shim.Store, error) {
	ns, err := s.namespaceOf(kubeconfig)
	if err != nil {
		return nil, err
	}
	if !s.serves(ns) {
		return nil, cnitypes.NewError(cnitypes.ErrTryAgainLater,
			fmt.Sprintf("node agent: pool namespace %s is not served (it serves %s)", ns, strings.Join(s.o.Namespaces, ", ")),
			"the kubeconfig changed under the request; the runtime retries")
	}
	return s.storeIn(ns), nil
}

// storeIn is a request's store of the pools of namespace ns.
func (s *Server) storeIn(ns string) *shim.Store {
	o := s.o.StoreOptions
	o.Identity = fmt.Sprintf("%s/%d", s.o.Identity, s.seq.Add(1))
	return shim.New(s.o.API, ns, o)
}

// Identity names one start of a node's agent as a holder of whereabouts'
// Lease: harvester-ipam-agent/<node>/<instance>/<8 random hex digits>.
// instance names the process (its pod's UID); the random part, drawn anew
// at each call, tells apart starts that share it (a container restarted in
// its pod keeps the UID, and the pid is 1 in every container). The Lease
// and its observers (whereabouts, the simulation's trace) then see each
// agent as a holder of its own; shim's own rule (a record under our name
// that we did not write is another holder's) guards against a clash.
func Identity(node, instance string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("harvester-ipam-agent/%s/%s/%s", node, instance, hex.EncodeToString(b[:]))
}

// namespaceOf is the pool namespace a whereabouts kubeconfig names, read
// as the plugin reads it, without waiting on a file being rewritten: the
// plugin, which waits, serves that case.
func (s *Server) namespaceOf(kubeconfig string) (string, error) {
	k, err := conf.LoadKubeconfig(kubeconfig, noSleep)
	if err != nil {
		return "", err
	}
	return k.Namespace, nil
}

// noSleep makes LoadKubeconfig give up on a half-written file at once.
func noSleep(time.Duration) {}

func (s *Server) serves(ns string) bool {
	for _, n := range s.o.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// capped keeps the first max bytes written to it.
// fileLog collects a verb's lines for a log file, and the file: one a
// request (a second file's lines go to stderr).
type fileLog struct {
	capped
	file string
}

func (l *fileLog) to(stderr io.Writer) func(string) io.Writer {
	return func(file string) io.Writer {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.file == "" {
			l.file = file
		}
		if l.file != file {
			return stderr
		}
		return &l.capped
	}
}

type capped struct {
	buf bytes.Buffer
	max int
	mu  sync.Mutex
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}
