package follow

import (
	"errors"
	"strings"
	"testing"
)

// harvester is the storage network's NAD config exactly as Harvester's
// bridge template writes it, with the IPAM type as a placeholder.
const harvester = `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":50,"ipam":{"type":"%s","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2/32"]}}`

func with(tmpl, ipamType string) string { return strings.Replace(tmpl, "%s", ipamType, 1) }

func TestSetIPAMType(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		// want is the expected output; empty means the input, unchanged.
		want      string
		found     string
		outcome   Outcome
		notSwitch string // the refusal's text, for configs that cannot be switched
	}{
		{name: "Harvester's template", in: with(harvester, "whereabouts"), want: with(harvester, "harvester-ipam"), found: "whereabouts", outcome: Switched},
		{
			name: "odd whitespace and key order kept",
			in: "\n\t{ \"ipam\" :\r\n  {\n \"exclude\" : [ \"192.168.50.1/32\" ] ,\n\t\"type\"\t:\t\"whereabouts\"  ,\"range\":\"192.168.50.0/24\"} ,\n" +
				"  \"type\" : \"bridge\", \"cniVersion\":\"0.3.1\"  }  \n",
			want: "\n\t{ \"ipam\" :\r\n  {\n \"exclude\" : [ \"192.168.50.1/32\" ] ,\n\t\"type\"\t:\t\"harvester-ipam\"  ,\"range\":\"192.168.50.0/24\"} ,\n" +
				"  \"type\" : \"bridge\", \"cniVersion\":\"0.3.1\"  }  \n",
			found: "whereabouts", outcome: Switched,
		},
		{
			name:  "escaped type value and escaped strings elsewhere",
			in:    `{"name":"a\"b\\c\u00e9","type":"bridge","ipam":{"type":"where\u0061bouts","log_file":"C:\\tmp\\wb.log","range":"10.0.0.0/24"}}`,
			want:  `{"name":"a\"b\\c\u00e9","type":"bridge","ipam":{"type":"harvester-ipam","log_file":"C:\\tmp\\wb.log","range":"10.0.0.0/24"}}`,
			found: "whereabouts", outcome: Switched,
		},
		{
			name:  "escaped key",
			in:    `{"type":"bridge","\u0069pam":{"\u0074ype":"whereabouts"}}`,
			want:  `{"type":"bridge","\u0069pam":{"\u0074ype":"harvester-ipam"}}`,
			found: "whereabouts", outcome: Switched,
		},
		{
			name: "nested types elsewhere untouched",
			in: `{"type":"whereabouts","args":{"ipam":{"type":"whereabouts"}},"plugins":[{"type":"whereabouts"}],` +
				`"ipam":{"routes":[{"dst":"0.0.0.0/0","type":"whereabouts"}],"nested":{"type":"whereabouts"},"type":"whereabouts"},"x":{"type":"whereabouts"}}`,
			want: `{"type":"whereabouts","args":{"ipam":{"type":"whereabouts"}},"plugins":[{"type":"whereabouts"}],` +
				`"ipam":{"routes":[{"dst":"0.0.0.0/0","type":"whereabouts"}],"nested":{"type":"whereabouts"},"type":"harvester-ipam"},"x":{"type":"whereabouts"}}`,
			found: "whereabouts", outcome: Switched,
		},
		{
			name:  "numbers kept as written",
			in:    `{"vlan":50.000,"mtu":1e3,"ipam":{"type":"whereabouts","big":123456789012345678901234567890}}`,
			want:  `{"vlan":50.000,"mtu":1e3,"ipam":{"type":"harvester-ipam","big":123456789012345678901234567890}}`,
			found: "whereabouts", outcome: Switched,
		},
		{name: "already harvester-ipam", in: with(harvester, "harvester-ipam"), found: "harvester-ipam", outcome: AlreadySet},
		{name: "another IPAM", in: `{"type":"bridge","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`, found: "host-local", outcome: OtherType},
		{name: "case matters", in: `{"type":"bridge","ipam":{"type":"Whereabouts"}}`, found: "Whereabouts", outcome: OtherType},
		{name: "no ipam", in: `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br"}`, notSwitch: `no "ipam"`},
		{name: "ipam not an object", in: `{"type":"bridge","ipam":"whereabouts"}`, notSwitch: `"ipam" is not an object`},
		{name: "ipam without type", in: `{"type":"bridge","ipam":{"range":"10.0.0.0/24"}}`, notSwitch: `"ipam" has no "type"`},
		{name: "type not a string", in: `{"type":"bridge","ipam":{"type":7}}`, notSwitch: `not a string`},
		{name: "ipam twice", in: `{"ipam":{"type":"host-local"},"ipam":{"type":"whereabouts"}}`, notSwitch: `"ipam" appears twice`},
		{name: "type twice", in: `{"ipam":{"type":"whereabouts","type":"whereabouts"}}`, notSwitch: `"type" twice`},
		{name: "a conflist has no top-level ipam", in: `{"cniVersion":"0.3.1","name":"n","plugins":[{"type":"bridge","ipam":{"type":"whereabouts"}}]}`, notSwitch: `no "ipam"`},
		{name: "not JSON", in: `cniVersion: 0.3.1`, notSwitch: "not JSON"},
		{name: "empty", in: ``, notSwitch: "not JSON"},
		{name: "an array", in: `[{"ipam":{"type":"whereabouts"}}]`, notSwitch: "not a JSON object"},
		{name: "truncated", in: with(harvester, "whereabouts")[:60], notSwitch: "not JSON"},
		{name: "trailing comma", in: `{"ipam":{"type":"whereabouts",}}`, notSwitch: "not JSON"},
		{name: "two documents", in: with(harvester, "whereabouts") + `{}`, notSwitch: "text after the JSON object"},
		{name: "garbage after", in: with(harvester, "whereabouts") + `x`, notSwitch: "text after the JSON object"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, found, o, err := SetIPAMType([]byte(tt.in), Whereabouts, HarvesterIPAM)
			if tt.notSwitch != "" {
				if !errors.Is(err, ErrNotSwitchable) || !strings.Contains(err.Error(), tt.notSwitch) {
					t.Fatalf("err = %v, want ErrNotSwitchable saying %q", err, tt.notSwitch)
				}
				if string(out) != tt.in {
					t.Fatalf("a refused config came back changed: %q", out)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if want == "" {
				want = tt.in
			}
			if string(out) != want {
				t.Fatalf("got\n  %s\nwant\n  %s", out, want)
			}
			if found != tt.found || o != tt.outcome {
				t.Fatalf("found %q %v, want %q %v", found, o, tt.found, tt.outcome)
			}
			if got, err := IPAMType(out); err != nil || (o == Switched && got != HarvesterIPAM) {
				t.Fatalf("IPAMType of the result: %q, %v", got, err)
			}
			// And back: byte for byte what came in, but for an escaped
			// original value (the way back writes the plain word).
			back, _, o2, err := SetIPAMType(out, HarvesterIPAM, Whereabouts)
			if err != nil {
				t.Fatal(err)
			}
			if o == Switched && !strings.Contains(tt.in, `\u0061`) && string(back) != tt.in {
				t.Fatalf("the way back differs:\n  %s\nwant\n  %s", back, tt.in)
			}
			if o == Switched && o2 != Switched {
				t.Fatalf("the way back: %v", o2)
			}
		})
	}
}

// Every config the switch accepts, it changes in the one token only: the
// bytes before and after are the input's.
func FuzzSetIPAMType(f *testing.F) {
	f.Add([]byte(with(harvester, "whereabouts")))
	f.Add([]byte(`{"ipam":{"type":"where\u0061bouts"}}`))
	f.Add([]byte(`{"a":[1,{"type":"x"}],"ipam":{"b":{},"type":"whereabouts"}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _, o, err := SetIPAMType(in, Whereabouts, HarvesterIPAM)
		if err != nil || o != Switched {
			if string(out) != string(in) {
				t.Fatalf("unswitched config changed")
			}
			return
		}
		// The changed span is one token; around it, all bytes are kept.
		i := 0
		for i < len(in) && i < len(out) && in[i] == out[i] {
			i++
		}
		j := 0
		for j < len(in)-i && j < len(out)-i && in[len(in)-1-j] == out[len(out)-1-j] {
			j++
		}
		if got := string(out[i : len(out)-j]); !strings.Contains(`"harvester-ipam"`, got) {
			t.Fatalf("changed more than the token: %q", got)
		}
		if typ, err := IPAMType(out); err != nil || typ != HarvesterIPAM {
			t.Fatalf("result's type %q, %v", typ, err)
		}
	})
}
