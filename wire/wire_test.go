package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func frame(body string) []byte {
	b := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	copy(b[4:], body)
	return b
}

func TestARequestRoundTrips(t *testing.T) {
	req := NewRequest(Add, map[string]string{EnvContainerID: "c1", EnvIfName: "lhnet1", EnvArgs: "K8S_POD_NAME=a"}, []byte(`{"cniVersion":"0.3.1"}`))
	var buf bytes.Buffer
	if err := Write(&buf, req); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRequest(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.Command != Add || got.Env[EnvIfName] != "lhnet1" || string(got.Config) != `{"cniVersion":"0.3.1"}` || got.Version != Version {
		t.Fatalf("got %+v", got)
	}
}

func TestReadRequestRefusesWhatIsNotARequest(t *testing.T) {
	long := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name  string
		input []byte
		want  string
	}{
		{"nothing", nil, "EOF"},
		{"a cut header", []byte{0, 0}, ErrTruncated.Error()},
		{"an empty frame", frame(""), ErrEmpty.Error()},
		{"a cut body", frame(`{"type":"request"}`)[:10], ErrTruncated.Error()},
		{"too large", []byte{0x7f, 0xff, 0xff, 0xff}, ErrTooLarge.Error()},
		{"not JSON", frame(`hello`), "not a message"},
		{"an array", frame(`[1,2]`), "not a message"},
		{"a newer version", frame(`{"type":"request","version":3,"command":"ADD"}`), "protocol version 3; this build speaks 2"},
		{"no version", frame(`{"type":"request","command":"ADD"}`), "protocol version 0"},
		{"another type", frame(`{"type":"go","version":1}`), `type "go", want "request"`},
		{"an unknown field", frame(`{"type":"request","version":1,"command":"ADD","extra":1}`), `unknown field "extra"`},
		{"an unknown command", frame(`{"type":"request","version":1,"command":"VERSION"}`), `unknown command "VERSION"`},
		{"a long command", frame(`{"type":"request","version":1,"command":"` + long + `"}`), `unknown command "xxxx`},
		{"an unknown variable", frame(`{"type":"request","version":1,"command":"ADD","env":{"LD_PRELOAD":"/x.so"}}`), `unknown environment variable "LD_PRELOAD"`},
		{"a config that is not base64", frame(`{"type":"request","version":1,"command":"ADD","config":"{}"}`), "illegal base64"},
		{"two messages in a frame", frame(`{"type":"request","version":1,"command":"ADD"}{}`), "after top-level value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadRequest(bytes.NewReader(tc.input))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if len(err.Error()) > 300 {
				t.Fatalf("error of %d bytes: hostile input must not make long errors", len(err.Error()))
			}
		})
	}
}

// A request of version 1 (a plugin of an older build, during a rollout)
// reads as it came: its shape is this version's, and its Version tells the
// agent which version to answer in.
func TestARequestOfAnOlderVersionThisBuildSpeaksReads(t *testing.T) {
	if MinVersion != 1 || Version != 2 {
		t.Fatalf("versions %d to %d: revisit this test", MinVersion, Version)
	}
	req, err := ReadRequest(bytes.NewReader(frame(`{"type":"request","version":1,"command":"ADD","env":{"CNI_IFNAME":"lhnet1"},"config":"e30="}`)))
	if err != nil {
		t.Fatal(err)
	}
	if req.Version != 1 || req.Command != Add || req.Env[EnvIfName] != "lhnet1" || string(req.Config) != "{}" {
		t.Fatalf("got %+v", req)
	}
	for _, v := range []int{0, 3} {
		_, err := DecodeRequest([]byte(fmt.Sprintf(`{"type":"request","version":%d,"command":"ADD"}`, v)))
		var ve *VersionError
		if !errors.As(err, &ve) || ve.Got != v {
			t.Fatalf("version %d: error %v, want a VersionError", v, err)
		}
	}
}

// Received is version 2's: a frame of its type, distinct from the Ack that
// follows it, and no Ack decodes as one.
func TestReceivedIsAFrameOfItsOwn(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, Receipt()); err != nil {
		t.Fatal(err)
	}
	if got := buf.String()[4:]; got != `{"type":"received","version":2}` {
		t.Fatalf("frame %s", got)
	}
	body, _ := ReadFrame(&buf)
	if err := Decode(body, TypeAck, &Ack{}); err == nil || !strings.Contains(err.Error(), `type "received", want "ack"`) {
		t.Fatalf("a receipt decoded as an ack: %v", err)
	}
	if err := Decode(mustWrite(t, Serve()), TypeReceived, &Received{}); err == nil {
		t.Fatal("an ack decoded as a receipt")
	}
	if err := Decode([]byte(`{"type":"received","version":2,"serve":true}`), TypeReceived, &Received{}); err == nil {
		t.Fatal("a receipt with an ack's field decoded")
	}
}

// DecodeAs reads a message of an older version this build speaks (an
// agent's decline in version 1); Decode reads this Version's only.
func TestDecodeAsReadsAnOlderVersion(t *testing.T) {
	body := []byte(`{"type":"ack","version":1,"serve":false,"reason":"protocol version 2; this agent speaks 1"}`)
	var ve *VersionError
	if err := Decode(body, TypeAck, &Ack{}); !errors.As(err, &ve) || ve.Got != 1 {
		t.Fatalf("Decode: %v, want a VersionError of 1", err)
	}
	var ack Ack
	if err := DecodeAs(body, 1, TypeAck, &ack); err != nil || ack.Serve || ack.Version != 1 || ack.Reason == "" {
		t.Fatalf("DecodeAs: %+v, %v", ack, err)
	}
	if !Speaks(1) || !Speaks(Version) || Speaks(0) || Speaks(Version+1) {
		t.Fatal("Speaks")
	}
}

func mustWrite(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()[4:]
}

func TestAVersionErrorSaysWhichVersions(t *testing.T) {
	_, err := DecodeRequest([]byte(`{"type":"request","version":7}`))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Got != 7 {
		t.Fatalf("error %v, want a VersionError of 7", err)
	}
}

func TestATooLargeFrameIsNotRead(t *testing.T) {
	// Only the header is consumed: the reader never allocates the body.
	r := bytes.NewReader(append([]byte{0, 0x20, 0, 0}, bytes.Repeat([]byte("x"), 10)...))
	_, err := ReadFrame(r)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("error %v", err)
	}
	if r.Len() != 10 {
		t.Fatalf("read %d bytes of the body", 10-r.Len())
	}
}

func TestWriteRefusesAMessageOverTheLimit(t *testing.T) {
	var buf bytes.Buffer
	err := Write(&buf, NewRequest(Add, nil, bytes.Repeat([]byte("x"), MaxMessage)))
	if !errors.Is(err, ErrTooLarge) || buf.Len() != 0 {
		t.Fatalf("error %v, wrote %d bytes", err, buf.Len())
	}
}

func TestMessagesNameTheirTypeAndVersion(t *testing.T) {
	for _, tc := range []struct {
		v    any
		typ  string
		into any
	}{
		{Receipt(), TypeReceived, &Received{}},
		{Serve(), TypeAck, &Ack{}},
		{Decline("busy"), TypeAck, &Ack{}},
		{Go(), TypeGo, &GoAhead{}},
		{NewAnswer([]byte("{}"), nil, &Error{Code: 11, Msg: "m"}), TypeAnswer, &Answer{}},
	} {
		var buf bytes.Buffer
		if err := Write(&buf, tc.v); err != nil {
			t.Fatal(err)
		}
		body, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := Decode(body, tc.typ, tc.into); err != nil {
			t.Fatalf("%T: %v", tc.v, err)
		}
		if err := Decode(body, TypeRequest, &Request{}); err == nil {
			t.Fatalf("%T decoded as a request", tc.v)
		}
	}
}

func TestReadFrameReadsOneFrameAtATime(t *testing.T) {
	var buf bytes.Buffer
	_ = Write(&buf, Go())
	_ = Write(&buf, Receipt())
	_ = Write(&buf, Serve())
	for _, typ := range []string{TypeGo, TypeReceived, TypeAck} {
		body, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := ReadHeader(body)
		if h.Type != typ {
			t.Fatalf("type %q, want %q", h.Type, typ)
		}
	}
	if _, err := ReadFrame(&buf); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

// FuzzReadRequest: whatever arrives, the decoder returns a valid request or
// an error, never panics, and reads no more than one frame.
func FuzzReadRequest(f *testing.F) {
	var buf bytes.Buffer
	_ = Write(&buf, NewRequest(Add, map[string]string{EnvContainerID: "c"}, []byte(`{"name":"n"}`)))
	f.Add(buf.Bytes())
	f.Add(frame(`{"type":"request","version":1,"command":"DEL","env":{"CNI_IFNAME":"x"}}`))
	f.Add(frame(`{"type":"request","version":2}`))
	f.Add(frame(`{"type":"request","version":3,"command":"ADD"}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 1, '{'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		req, err := ReadRequest(r)
		if err != nil {
			return
		}
		if req.Validate() != nil || !Speaks(req.Version) || req.Type != TypeRequest {
			t.Fatalf("accepted an invalid request %+v", req)
		}
		// What was accepted is written back as a request that reads the same.
		var out bytes.Buffer
		if err := Write(&out, req); err != nil {
			t.Fatalf("accepted a request it cannot write: %v", err)
		}
		again, err := ReadRequest(&out)
		if err != nil || again.Command != req.Command || !bytes.Equal(again.Config, req.Config) || len(again.Env) != len(req.Env) {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}
