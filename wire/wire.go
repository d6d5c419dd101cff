// Package wire is the protocol between harvester-ipam, the plugin a runtime
// execs for each CNI verb, and its node agent, over a unix socket.
//
// A verb is handed over in two steps, because a unix socket's connect()
// succeeds once the kernel queues it, before the agent accepts it: no client
// can tell "the agent took my request" from "my request waits in a queue".
//
//	client -> agent  Request   the verb, its CNI environment and its config
//	agent  -> client Received  at once, before any work: the agent is alive and reading
//	agent  -> client Ack       it serves the request, or declines and why
//	client -> agent  Go        only after an Ack that serves
//	agent  -> client Answer    what the plugin would print: the result or a CNI error
//
// Received tells the client the agent read the request: from then on the
// verb is the agent's to decide, however long a busy node makes admission
// and a wait for one of its slots. Before it, the client waits while the
// agent lives (wire/client: only a closed connection, a process gone,
// stopped or idle while the request waits, says it does not). A request
// the agent cannot read gets an Ack (a decline) without Received.
//
// The agent writes nothing (no checkpoint, no API request) before it reads
// Go, so a client that finds the agent absent, or gets a decline, closes
// the connection and does the work itself at no risk. After Go the
// state is the agent's until its Answer; a connection that breaks before it
// leaves the verb's outcome unknown (see wire/client).
//
// Every message is a frame: a 4-byte big-endian length, then that many bytes
// of JSON, at most MaxMessage. Every message names its type and the protocol
// version; a peer that meets a version it does not know declines (the agent,
// naming its own) or falls back (the client). The frame and the "type" and
// "version" fields never change; anything else may, under a new Version.
//
// Plugin and agent of different builds meet during every rollout (the
// plugin's binary and the agent are two DaemonSets). Each build speaks
// MinVersion to Version: the agent answers a request in the version it came
// in, and a client whose request an older agent declined for its version,
// naming one the client still speaks, asks again in that one (wire/client).
// Version 1 has no Received: its Ack comes after admission.
//
// This package uses the standard library only: the plugin links it, and
// every sandbox pays for what the plugin links at each start.
package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version this build speaks: 2, the Received frame.
const Version = 2

// MinVersion is the oldest version this build still speaks, with a peer of
// another build: 1, without Received.
const MinVersion = 1

// MaxMessage bounds a frame's JSON: a network config is a few KiB, a
// result less.
const MaxMessage = 1 << 20

// The message types.
const (
	TypeRequest  = "request"
	TypeReceived = "received"
	TypeAck      = "ack"
	TypeGo       = "go"
	TypeAnswer   = "answer"
)

// The commands: the CNI verbs, and Probe, which asks whether the agent
// serves and does nothing (its readiness probe).
const (
	Add    = "ADD"
	Del    = "DEL"
	Check  = "CHECK"
	GC     = "GC"
	Status = "STATUS"
	Probe  = "PROBE"
)

// Commands are the commands of this Version.
var Commands = []string{Add, Del, Check, GC, Status, Probe}

// The CNI environment a Request carries: what the runtime set for the plugin.
const (
	EnvContainerID   = "CNI_CONTAINERID"
	EnvNetns         = "CNI_NETNS"
	EnvIfName        = "CNI_IFNAME"
	EnvArgs          = "CNI_ARGS"
	EnvPath          = "CNI_PATH"
	EnvNetnsOverride = "CNI_NETNS_OVERRIDE"
	// EnvGuard marks a harvester-ipam started as a delegate of harvester-ipam
	// (install/standin.GuardEnv): such a request is never served.
	EnvGuard = "HARVESTER_IPAM_DELEGATE"
)

// EnvKeys are the variables a Request may carry.
var EnvKeys = []string{EnvContainerID, EnvNetns, EnvIfName, EnvArgs, EnvPath, EnvNetnsOverride, EnvGuard}

// Where the plugin finds the agent's socket.
const (
	// EnvSocket, when set, is the socket's path ("none": no agent). For tests,
	// and for an operator who wants one node's plugin to work alone.
	EnvSocket = "HARVESTER_IPAM_AGENT_SOCKET"
	// NodeFile is written by the agent when it starts: a NodeConf. It sits in
	// a directory of its own under the CNI config directory, which runtimes
	// do not read (as whereabouts' whereabouts.d).
	NodeFile = "/etc/cni/net.d/harvester-ipam.d/agent.conf"
	// DefaultSocket is the socket when neither says otherwise.
	DefaultSocket = "/run/harvester-ipam/agent.sock"
	// NoAgent as EnvSocket turns the agent off.
	NoAgent = "none"
)

// NodeConf is NodeFile's content.
type NodeConf struct {
	Socket string `json:"socket"`
}

// Request is a verb handed to the agent.
type Request struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
	// Command is one of Commands.
	Command string `json:"command"`
	// Env holds the CNI variables the runtime set, by EnvKeys' names.
	Env map[string]string `json:"env,omitempty"`
	// Config is the network config, the plugin's stdin, as it came.
	Config []byte `json:"config,omitempty"`
}

// Received says the agent read a Request, before any work on it; its
// decision, an Ack, follows. Since version 2.
type Received struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
}

// Ack is the agent's decision on a Request.
type Ack struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
	// Serve is true when the agent does the verb once the client says Go.
	Serve bool `json:"serve"`
	// Reason says why it declines.
	Reason string `json:"reason,omitempty"`
	// Error is set when the request itself was wrong (it did not parse, was
	// too large): what a client that cannot fall back would report.
	Error *Error `json:"error,omitempty"`
}

// GoAhead tells the agent to do the verb it acknowledged.
type GoAhead struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
}

// Answer is the outcome of the verb: what the plugin prints.
type Answer struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
	// Stdout is the verb's output (ADD's result), when it succeeded.
	Stdout []byte `json:"stdout,omitempty"`
	// Stderr is what the verb logged where the plugin logs to its stderr.
	Stderr []byte `json:"stderr,omitempty"`
	// Error is the verb's CNI error, when it failed.
	Error *Error `json:"error,omitempty"`
	// Log is what the verb logged for LogFile (whereabouts' log_file, or the
	// node's own plugin.logFile): a host file the agent's pod does not
	// mount, which the plugin appends it to.
	LogFile string `json:"logFile,omitempty"`
	Log     []byte `json:"log,omitempty"`
}

// Error is a CNI error (the spec's code, msg and details).
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details != "" {
		return e.Msg + "; " + e.Details
	}
	return e.Msg
}

// NewRequest is a Request of this Version.
func NewRequest(command string, env map[string]string, config []byte) Request {
	return Request{Type: TypeRequest, Version: Version, Command: command, Env: env, Config: config}
}

// Receipt is a Received of this Version.
func Receipt() Received { return Received{Type: TypeReceived, Version: Version} }

// Serve is an Ack that serves.
func Serve() Ack { return Ack{Type: TypeAck, Version: Version, Serve: true} }

// Decline is an Ack that declines, for reason.
func Decline(reason string) Ack {
	return Ack{Type: TypeAck, Version: Version, Reason: reason}
}

// Go is the client's go-ahead.
func Go() GoAhead { return GoAhead{Type: TypeGo, Version: Version} }

// NewAnswer is an Answer of this Version.
func NewAnswer(stdout, stderr []byte, err *Error) Answer {
	return Answer{Type: TypeAnswer, Version: Version, Stdout: stdout, Stderr: stderr, Error: err}
}

// Errors of reading a frame.
var (
	// ErrTooLarge is a frame longer than MaxMessage: its body is not read.
	ErrTooLarge = errors.New("message larger than the limit")
	// ErrEmpty is a frame of length 0.
	ErrEmpty = errors.New("empty message")
	// ErrTruncated is a frame cut short by the end of the stream.
	ErrTruncated = errors.New("message cut short")
)

// Write writes v as one frame.
func Write(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	if len(body) > MaxMessage {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(body), MaxMessage)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	_, err = w.Write(frame)
	return err
}

// ReadFrame reads one frame's JSON. io.EOF means the stream ended before a
// frame began; ErrTruncated that it ended inside one.
func ReadFrame(r io.Reader) ([]byte, error) {
	var head [4]byte
	if n, err := io.ReadFull(r, head[:]); err != nil {
		if n > 0 && errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ErrTruncated
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 {
		return nil, ErrEmpty
	}
	if n > MaxMessage {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, n, MaxMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, ErrTruncated
		}
		return nil, err
	}
	return body, nil
}

// Header is what every message carries, whatever its version.
type Header struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
}

// ReadHeader decodes a frame's type and version only.
func ReadHeader(body []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(body, &h); err != nil {
		return h, fmt.Errorf("not a message: %w", err)
	}
	return h, nil
}

// Decode decodes a frame of this Version into v, a message of type typ:
// strictly (an unknown field is an error: under this Version it means
// nothing the reader could honour; data after the message is one too, as
// ReadHeader refuses it).
func Decode(body []byte, typ string, v any) error {
	return DecodeAs(body, Version, typ, v)
}

// DecodeAs is Decode of a frame of the given version, one this build still
// speaks (MinVersion to Version), whose messages of type typ have v's shape.
func DecodeAs(body []byte, version int, typ string, v any) error {
	h, err := ReadHeader(body)
	if err != nil {
		return err
	}
	if h.Version != version {
		return &VersionError{Got: h.Version}
	}
	if h.Type != typ {
		return fmt.Errorf("got a message of type %q, want %q", h.Type, typ)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s message: %w", typ, err)
	}
	return nil
}

// Speaks says whether this build speaks version.
func Speaks(version int) bool { return version >= MinVersion && version <= Version }

// VersionError is a message of a protocol version this build does not speak.
type VersionError struct{ Got int }

func (e *VersionError) Error() string {
	return fmt.Sprintf("protocol version %d; this build speaks %d", e.Got, Version)
}

// ReadRequest reads and checks a Request of any version this build speaks
// (its Version says which: the agent answers in it). A *VersionError says
// the client speaks another (the agent declines, naming its own).
func ReadRequest(r io.Reader) (Request, error) {
	body, err := ReadFrame(r)
	if err != nil {
		return Request{}, err
	}
	return DecodeRequest(body)
}

// DecodeRequest decodes and checks a Request's JSON.
// A Request's shape is the same in every version this build speaks.
func DecodeRequest(body []byte) (Request, error) {
	h, err := ReadHeader(body)
	if err != nil {
		return Request{}, err
	}
	if !Speaks(h.Version) {
		return Request{}, &VersionError{Got: h.Version}
	}
	var req Request
	if err := DecodeAs(body, h.Version, TypeRequest, &req); err != nil {
		return Request{}, err
	}
	return req, req.Validate()
}

// Validate checks what a Request may hold: a command of this Version and
// only the CNI variables of EnvKeys.
func (r Request) Validate() error {
	known := false
	for _, c := range Commands {
		if r.Command == c {
			known = true
		}
	}
	if !known {
		return fmt.Errorf("unknown command %q", clip(r.Command))
	}
	for k := range r.Env {
		ok := false
		for _, want := range EnvKeys {
			if k == want {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("unknown environment variable %q", clip(k))
		}
	}
	return nil
}

// clip keeps an error about hostile input short.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
