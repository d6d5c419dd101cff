// Package follow keeps Harvester's storage-network (and RWX-network) NADs on
// harvester-ipam: it switches a matching NAD's "ipam.type" from whereabouts to
// harvester-ipam as Harvester creates it, and switches them all back on
// uninstall. It changes nothing else: the config's other bytes stay exactly
// as Harvester wrote them.
package follow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The IPAM types the follower switches between.
const (
	Whereabouts   = "whereabouts"
	HarvesterIPAM = "harvester-ipam"
)

// Outcome is what SetIPAMType found.
type Outcome int

const (
	// Switched: ipam.type was from and is now to. (The zero Outcome is none:
	// a refused config, or a NAD never looked at.)
	Switched Outcome = iota + 1
	// AlreadySet: ipam.type already is to; nothing changed.
	AlreadySet
	// OtherType: ipam.type is neither from nor to (another IPAM): not ours to touch.
	OtherType
)

func (o Outcome) String() string {
	switch o {
	case Switched:
		return "switched"
	case AlreadySet:
		return "already set"
	case OtherType:
		return "another IPAM"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ErrNotSwitchable says that a config cannot be switched at all: it is not a
// JSON object, has no "ipam" object, or its ipam has no string "type". Such a
// NAD is left alone.
var ErrNotSwitchable = errors.New("config cannot be switched")

// SetIPAMType returns config with the value of its top-level "ipam"'s "type"
// replaced by to, when that value is from, and the type it found. Every byte
// outside that one JSON string token stays as it was: the document is read
// with a tokenizer to find the token's offsets and never re-marshalled, so
// Harvester's key order, whitespace and escapes survive, and so does any
// other "type" key (the plugin's own, or one nested deeper).
//
// A config that is not one valid JSON object, that has no ipam object, whose
// ipam has no string type, or that holds "ipam" or its "type" twice (which
// parsers resolve differently) is refused with an error wrapping
// ErrNotSwitchable; config is then returned unchanged.
func SetIPAMType(config []byte, from, to string) (out []byte, found string, o Outcome, err error) {
	start, end, found, err := ipamTypeToken(config)
	if err != nil {
		return config, "", 0, fmt.Errorf("%w: %v", ErrNotSwitchable, err)
	}
	switch found {
	case to:
		return config, found, AlreadySet, nil
	case from:
	default:
		return config, found, OtherType, nil
	}
	// The new token: a JSON string as encoding/json writes it (to is a plain
	// word, so this is just the quoted name).
	tok, err := json.Marshal(to)
	if err != nil {
		return config, found, 0, err
	}
	out = make([]byte, 0, len(config)-(end-start)+len(tok))
	out = append(out, config[:start]...)
	out = append(out, tok...)
	out = append(out, config[end:]...)
	return out, found, Switched, nil
}

// IPAMType is the decoded value of the config's ipam.type, with the same
// refusals as SetIPAMType.
func IPAMType(config []byte) (string, error) {
	_, _, t, err := ipamTypeToken(config)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotSwitchable, err)
	}
	return t, nil
}

// ipamTypeToken walks the whole document once and returns the byte offsets
// [start, end) of the string token that is the value of the top-level
// object's "ipam" member's "type" member, and its decoded value.
func ipamTypeToken(config []byte) (start, end int, value string, err error) {
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.UseNumber() // numbers are only skipped; never parse them as floats
	t, err := dec.Token()
	if err != nil {
		return 0, 0, "", fmt.Errorf("not JSON: %v", err)
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return 0, 0, "", errors.New("not a JSON object")
	}
	start, end = -1, -1
	ipamSeen := false
	// Members of the top-level object.
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return 0, 0, "", err
		}
		if key != "ipam" {
			if err := skipValue(dec); err != nil {
				return 0, 0, "", err
			}
			continue
		}
		if ipamSeen {
			return 0, 0, "", errors.New(`"ipam" appears twice`)
		}
		ipamSeen = true
		t, err := dec.Token()
		if err != nil {
			return 0, 0, "", fmt.Errorf("not JSON: %v", err)
		}
		if d, ok := t.(json.Delim); !ok || d != '{' {
			return 0, 0, "", errors.New(`"ipam" is not an object`)
		}
		typeSeen := false
		for dec.More() {
			key, err := objectKey(dec)
			if err != nil {
				return 0, 0, "", err
			}
			if key != "type" {
				if err := skipValue(dec); err != nil {
					return 0, 0, "", err
				}
				continue
			}
			if typeSeen {
				return 0, 0, "", errors.New(`"ipam" has "type" twice`)
			}
			typeSeen = true
			// InputOffset is now just past the key; the value starts after the
			// colon and any whitespace, and ends where the decoder stops.
			from := int(dec.InputOffset())
			t, err := dec.Token()
			if err != nil {
				return 0, 0, "", fmt.Errorf("not JSON: %v", err)
			}
			s, ok := t.(string)
			if !ok {
				return 0, 0, "", fmt.Errorf(`"ipam"."type" is %v, not a string`, t)
			}
			end = int(dec.InputOffset())
			start = valueStart(config, from)
			// The bytes found must be that very token: belt and braces, since
			// a wrong offset would corrupt the NAD.
			var check string
			if start < 0 || start >= end || json.Unmarshal(config[start:end], &check) != nil || check != s {
				return 0, 0, "", fmt.Errorf(`cannot locate "ipam"."type" in the text (offsets %d..%d)`, start, end)
			}
			value = s
		}
		if _, err := dec.Token(); err != nil { // the ipam object's '}'
			return 0, 0, "", fmt.Errorf("not JSON: %v", err)
		}
		if !typeSeen {
			return 0, 0, "", errors.New(`"ipam" has no "type"`)
		}
	}
	if _, err := dec.Token(); err != nil { // the top-level '}'
		return 0, 0, "", fmt.Errorf("not JSON: %v", err)
	}
	// Nothing but whitespace may follow: a second document would make the
	// config mean something else to another parser.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return 0, 0, "", errors.New("text after the JSON object")
	}
	if !ipamSeen {
		return 0, 0, "", errors.New(`no "ipam"`)
	}
	return start, end, value, nil
}

// objectKey reads one member name.
func objectKey(dec *json.Decoder) (string, error) {
	t, err := dec.Token()
	if err != nil {
		return "", fmt.Errorf("not JSON: %v", err)
	}
	k, ok := t.(string)
	if !ok {
		return "", fmt.Errorf("not JSON: unexpected %v", t)
	}
	return k, nil
}

// skipValue reads one whole value (scalar, object or array), checking its syntax.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not JSON: %v", err)
		}
		if d, ok := t.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

// valueStart is the offset of the first byte of a member's value, given the
// decoder's offset just past its key: past whitespace, the colon (unless the
// decoder already consumed it), whitespace.
func valueStart(b []byte, i int) int {
	colon := false
	for ; i < len(b); i++ {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
		case ':':
			if colon {
				return -1
			}
			colon = true
		default:
			return i
		}
	}
	return -1
}
