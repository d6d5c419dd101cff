package conf

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	wbkube "github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"
)

// flatFile writes a whereabouts flat file like the one its installer writes.
func flatFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "whereabouts.conf")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// nad is Harvester's storage-network config with the given ipam object.
func nad(ipam string) []byte {
	return []byte(`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":50,"ipam":` + ipam + `}`)
}

func TestLoad(t *testing.T) {
	flat := flatFile(t, `{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},"log_level":"debug"}`)
	noKube := flatFile(t, `{"datastore":"kubernetes"}`)
	cp := `"configuration_path":"` + flat + `"`
	tests := []struct {
		name      string
		stdin     []byte
		wantCode  uint   // 0: no error
		wantMsg   string // part of the error's message or details
		wantPools []Pool
		wantOpts  Options
		check     func(t *testing.T, c *Config)
	}{{
		name:      "storage network",
		stdin:     nad(`{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2/32"],` + cp + `}`),
		wantPools: []Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}},
		wantOpts:  Options{Delegate: "whereabouts", CheckpointDir: DefaultCheckpointDir},
		check: func(t *testing.T, c *Config) {
			assert.NoError(t, c.RequirePools(), "one range is all ADD and CHECK need")
			assert.Equal(t, "0.3.1", c.CNIVersion)
			assert.Equal(t, "storagenetwork-sg8d8", c.Network)
			assert.Equal(t, "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig", c.Kubeconfig(), "from the flat file")
			assert.Equal(t, "debug", c.LogLevel(), "from the flat file")
			var d map[string]any
			require.NoError(t, json.Unmarshal(c.Delegated, &d))
			ipam := d["ipam"].(map[string]any)
			assert.Equal(t, "whereabouts", ipam["type"], "the delegate sees its own type")
			assert.Equal(t, []any{"192.168.50.1/32", "192.168.50.2/32"}, ipam["exclude"], "everything else passes through")
			assert.Equal(t, "mgmt-br", d["bridge"])
			assert.EqualValues(t, 50, d["vlan"])
		},
	}, {
		name:      "network_name and ipRanges, a range_start-range_end range, IPv6",
		stdin:     nad(`{"type":"harvester-ipam","network_name":"blue","range":"10.1.0.10-10.1.0.20/24","ipRanges":[{"range":"fd00:10::/64"}],` + cp + `}`),
		wantPools: []Pool{{Name: "blue-10.1.0.0-24", Range: "10.1.0.0/24"}, {Name: "blue-fd00-10---64", Range: "fd00:10::/64"}},
		wantOpts:  Options{Delegate: "whereabouts", CheckpointDir: DefaultCheckpointDir},
	}, {
		name:      "options of our own",
		stdin:     nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegate":"whereabouts-v0.7.0","checkpoint_dir":"/run/hipam/"},` + cp + `}`),
		wantPools: []Pool{{Name: "10.0.0.0-24", Range: "10.0.0.0/24"}},
		wantOpts:  Options{Delegate: "whereabouts-v0.7.0", CheckpointDir: "/run/hipam"},
		check: func(t *testing.T, c *Config) {
			var d struct{ IPAM struct{ Type string } }
			require.NoError(t, json.Unmarshal(c.Delegated, &d))
			assert.Equal(t, "whereabouts-v0.7.0", d.IPAM.Type)
		},
	}, {
		name:     "the NAD is gone: only the type is left",
		stdin:    []byte(`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","ipam":{"type":"harvester-ipam","configuration_path":"` + flat + `"}}`),
		wantOpts: Options{Delegate: "whereabouts", CheckpointDir: DefaultCheckpointDir},
		check: func(t *testing.T, c *Config) {
			err := c.RequirePools()
			require.Error(t, err)
			assert.Equal(t, cnitypes.ErrInvalidNetworkConfig, err.(*cnitypes.Error).Code)
		},
	}, {
		name:     "malformed JSON",
		stdin:    []byte(`{"cniVersion":"0.3.1","name":"x","ipam":{"type":`),
		wantCode: cnitypes.ErrDecodingFailure, wantMsg: "not valid JSON",
	}, {
		name:     "ipam is not an object",
		stdin:    nad(`"harvester-ipam"`),
		wantCode: cnitypes.ErrDecodingFailure, wantMsg: "ipam must be a JSON object",
	}, {
		name:     "no ipam",
		stdin:    []byte(`{"cniVersion":"0.3.1","name":"x","type":"bridge"}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "no ipam object",
	}, {
		name:     "an unknown option of ours",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegat":"whereabouts"},` + cp + `}`),
		wantCode: cnitypes.ErrUnsupportedField, wantMsg: `ipam.harvester_ipam: unknown field "delegat"`,
	}, {
		name:     "a delegate that is a path",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegate":"../../bin/sh"},` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "is not a plugin name",
	}, {
		name:     "delegating to ourselves",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegate":"harvester-ipam"},` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "must not be harvester-ipam itself",
	}, {
		name:     "a relative checkpoint dir",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"checkpoint_dir":"var/lib"},` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "is not an absolute path",
	}, {
		name:     "a bad CIDR",
		stdin:    nad(`{"type":"harvester-ipam","range":"192.168.50.0/33",` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "invalid CIDR 192.168.50.0/33",
	}, {
		name:     "a bad exclude",
		stdin:    nad(`{"type":"harvester-ipam","range":"192.168.50.0/24","ipRanges":[{"range":"10.0.0.0/24","exclude":["10.0.0.300/32"]}],` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `exclude "10.0.0.300/32" of range 10.0.0.0/24 is neither a CIDR nor an IP`,
	}, {
		// Found by FuzzLoad: whereabouts can never create these pools.
		name:     "a range whose pool Kubernetes cannot name",
		stdin:    nad(`{"type":"harvester-ipam","ipRanges":[{"range":"0::/0"}],` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `range ::/0 makes the IPPool name "---0", which Kubernetes refuses`,
	}, {
		name:     "a network_name Kubernetes cannot take",
		stdin:    nad(`{"type":"harvester-ipam","network_name":"Storage/Net","range":"192.168.50.0/24",` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: `makes the IPPool name "Storage/Net-192.168.50.0-24"`,
	}, {
		name:     "a network_name too long for a name",
		stdin:    nad(`{"type":"harvester-ipam","network_name":"` + strings.Repeat("n", 240) + `","range":"192.168.50.0/24",` + cp + `}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "which Kubernetes refuses",
	}, {
		name:      "excludes as CIDRs and as plain IPs",
		stdin:     nad(`{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2"],` + cp + `}`),
		wantPools: []Pool{{Name: "192.168.50.0-24", Range: "192.168.50.0/24"}},
		wantOpts:  Options{Delegate: "whereabouts", CheckpointDir: DefaultCheckpointDir},
	}, {
		name:     "a range of the wrong type",
		stdin:    nad(`{"type":"harvester-ipam","range":5,` + cp + `}`),
		wantCode: cnitypes.ErrDecodingFailure, wantMsg: "does not parse as whereabouts config",
	}, {
		name:     "no flat file",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"/nonexistent/whereabouts.conf"}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "ipam.configuration_path",
	}, {
		name:     "no kubeconfig anywhere",
		stdin:    nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + noKube + `"}`),
		wantCode: cnitypes.ErrInvalidNetworkConfig, wantMsg: "set ipam.kubernetes.kubeconfig",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.stdin)
			if tt.wantCode != 0 {
				require.Error(t, err)
				ce, ok := err.(*cnitypes.Error)
				require.True(t, ok, "a CNI error, not %T", err)
				assert.Equal(t, tt.wantCode, ce.Code, "%s: %s", ce.Msg, ce.Details)
				assert.Contains(t, ce.Msg+" "+ce.Details, tt.wantMsg)
				assert.NotContains(t, ce.Msg+ce.Details, "/ bytes:", "the input is not echoed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantPools, c.Pools)
			assert.Equal(t, tt.wantOpts, c.Options)
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestLoadKeepsAConfigForDEL(t *testing.T) {
	// DEL goes on from the checkpoint when the whereabouts part is unusable.
	c, err := Load([]byte(`{"cniVersion":"1.1.0","name":"sn","ipam":{"type":"harvester-ipam","harvester_ipam":{"checkpoint_dir":"/x"},"configuration_path":"/nonexistent"}}`))
	require.Error(t, err)
	require.NotNil(t, c)
	assert.Equal(t, "/x", c.Options.CheckpointDir)
	assert.Equal(t, "sn", c.Network)
	assert.Empty(t, c.Pools)
	assert.Empty(t, c.Kubeconfig())
}

func TestLoadValidAttachments(t *testing.T) {
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"}}`)
	c, err := Load([]byte(`{"cniVersion":"1.1.0","name":"sn","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `"},
		"cni.dev/valid-attachments":[{"containerID":"a","ifname":"lhnet1"}]}`))
	require.NoError(t, err)
	assert.Equal(t, []cnitypes.GCAttachment{{ContainerID: "a", IfName: "lhnet1"}}, c.ValidAttachments)
}

func TestLoadOpensNoLogFile(t *testing.T) {
	dir := t.TempDir()
	flatLog := filepath.Join(dir, "flat.log")
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"},"log_file":"`+flatLog+`"}`)
	nadLog := filepath.Join(dir, "sub", "nad.log")
	require.NoError(t, os.MkdirAll(filepath.Dir(nadLog), 0o700))
	for _, tt := range []struct {
		name, ipam, wantLog string
		wantErr             bool
	}{
		{"the NAD's log_file wins over the flat file's", `"log_file":"` + nadLog + `","range":"10.0.0.0/24"`, nadLog, false},
		{"the flat file's when the NAD names none", `"range":"10.0.0.0/24"`, flatLog, false},
		{"a refused config opens nothing", `"log_file":"` + nadLog + `","range":"10.0.0.0/33"`, "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(nad(`{"type":"harvester-ipam","configuration_path":"` + flat + `",` + tt.ipam + `}`))
			if tt.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tt.wantLog, c.LogFile())
			}
			_, statErr := os.Stat(nadLog)
			assert.True(t, os.IsNotExist(statErr), "Load created the NAD's log_file %s: only the plugin's logger opens it", nadLog)
		})
	}
}

// node_slice_size (whereabouts' fast IPAM) is read so that ADD can refuse it
// with a message that says what to do, and DEL can hand it to whereabouts.
func TestNodeSliceSize(t *testing.T) {
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"}}`)
	for _, tt := range []struct {
		name      string
		field     string
		wantLoad  uint // the CNI code of Load's error; 0: none
		wantSlice string
		wantADD   uint // the CNI code of RefuseNodeSlices; 0: none
		wantMsg   string
	}{
		{"absent", ``, 0, "", 0, ""},
		{"null", `,"node_slice_size":null`, 0, "", 0, ""},
		{"set", `,"node_slice_size":"/26"`, 0, "/26", cnitypes.ErrUnsupportedField,
			`ipam.node_slice_size "/26" is not supported by harvester-ipam`},
		{"not a string", `,"node_slice_size":26`, cnitypes.ErrDecodingFailure, "", 0, "ipam.node_slice_size must be a string"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `"` + tt.field + `}`))
			if tt.wantLoad != 0 {
				require.Error(t, err)
				assert.Equal(t, tt.wantLoad, err.(*cnitypes.Error).Code)
				assert.Contains(t, err.Error(), tt.wantMsg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantSlice, c.NodeSliceSize)
			err = c.RefuseNodeSlices()
			if tt.wantADD == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			ce := err.(*cnitypes.Error)
			assert.Equal(t, tt.wantADD, ce.Code)
			assert.Equal(t, tt.wantMsg, ce.Msg)
			assert.Contains(t, ce.Details, "remove node_slice_size")
		})
	}
}

// Secrets that live only in the files the fuzz test writes: no input carries
// them, so no message may either.
const (
	fuzzToken      = "kubeconfig-bearer-Zq81xT0ken"
	fuzzFlatSecret = "flat-file-etcd-pa55w0rd"
)

// loadSeeds are real NADs (Harvester's storage network, the KB's ipvlan one,
// whereabouts' own examples), as the ipam object a NAD has once it names
// harvester-ipam. @FLAT@, @KUBECONFIG@ and @DIR@ stand for the files the fuzz
// test writes in its temp dir, so that results do not depend on the host.
var loadSeeds = []string{
	// Harvester's storage network.
	`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":50,"ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2/32"],"configuration_path":"@FLAT@"}}`,
	// ... with secrets beside it: none may come back in a message.
	`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","type":"bridge","bridge":"mgmt-br","ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","etcd_password":"s3cret","etcd_username":"root","kubernetes":{"kubeconfig":"@KUBECONFIG@","token":"eyJhbGciOiJSUzI1NiJ9.s3cretT0ken"},"configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"192.168.50.0/33","etcd_password":"s3cret","configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["s3cret"],"etcd_password":"s3cret","configuration_path":"@FLAT@"}}`,
	// The kubeconfig (YAML, with its bearer token) named as the flat file.
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","configuration_path":"@KUBECONFIG@"}}`,
	// The KB's ipvlan NAD: range_start, range_end, routes.
	`{ "cniVersion": "0.3.1", "name": "test", "type": "ipvlan", "master": "Net2", "mode": "l2", "ipam": { "type": "harvester-ipam", "range": "172.16.10.192/27", "range_start": "172.16.10.196", "range_end": "172.16.10.200", "routes": [ { "dst": "172.16.20.110/32", "gw": "172.16.10.194" }, { "dst": "10.10.10.235/32", "gw": "172.16.10.194" } ], "configuration_path":"@FLAT@" } }`,
	// ipRanges with IPv6, network_name, the first-last/prefix form, a gateway, dns.
	`{"cniVersion":"1.1.0","name":"dual","ipam":{"type":"harvester-ipam","network_name":"blue","range":"10.1.0.10-10.1.0.20/24","ipRanges":[{"range":"fd00:10::/64","exclude":["fd00:10::1/128"]},{"range":"2001:db8::/120"}],"gateway":"10.1.0.1","dns":{"nameservers":["10.1.0.2"]},"configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","network_name":"storage","ipRanges":[{"range":"fd00:10::/64","range_start":"fd00:10::10"}],"enable_overlapping_ranges":false,"leader_lease_duration":1500,"sleep_for_race":1,"configuration_path":"@FLAT@"}}`,
	// The NAD is gone: only the type is left.
	`{"type":"harvester-ipam"}`,
	`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","ipam":{"type":"harvester-ipam"}}`,
	`{"cniVersion":"0.3.1","name":"storagenetwork-sg8d8","ipam":{"type":"harvester-ipam","configuration_path":"@FLAT@"}}`,
	// Our options, good and bad.
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegate":"whereabouts-v0.7.0","checkpoint_dir":"@DIR@/cp/"},"configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"delegate":"../../bin/sh","checkpoint_dir":"relative"},"configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24","harvester_ipam":{"s3cret":1},"configuration_path":"@FLAT@"}}`,
	// whereabouts' log settings, kept inside the temp dir.
	`{"cniVersion":"0.3.1","name":"sn","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24","log_file":"@DIR@/whereabouts.log","log_level":"debug","configuration_path":"@FLAT@"}}`,
	// A config list, wrong types, duplicate and case-folded keys.
	`{"cniVersion":"0.4.0","name":"l","plugins":[{"type":"bridge","ipam":{"type":"harvester-ipam","range":"10.0.0.0/24"}}]}`,
	`{"cniVersion":1,"name":"sn","ipam":{"type":"harvester-ipam","range":5,"configuration_path":"@FLAT@"}}`,
	`{"cniVersion":"0.3.1","name":"sn","IPAM":{"Type":"x"},"ipam":{"TYPE":"x","type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"@FLAT@"},"cni.dev/valid-attachments":[{"containerID":"a","ifname":"lhnet1"}],"prevResult":{"ips":[]}}`,
	`{"ipam":null}`,
	`[]`,
	``,
}

// secretKey is a key whose value is a credential.
var secretKey = regexp.MustCompile(`(?i)pass|token|secret|credential`)

// FuzzLoad: conf.Load never panics; it fails only with a CNI error of a known
// code and a message, never echoing a credential; what it accepts names pools
// as whereabouts does, and hands the delegate a config of its own type.
func FuzzLoad(f *testing.F) {
	dir := f.TempDir()
	kc := filepath.Join(dir, "whereabouts.kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: `+fuzzToken+`}}]
contexts: [{name: w, context: {cluster: c, user: u}}]
current-context: w
`), 0o600); err != nil {
		f.Fatal(err)
	}
	flat := filepath.Join(dir, "whereabouts.conf")
	if err := os.WriteFile(flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"`+kc+`"},"etcd_password":"`+fuzzFlatSecret+`"}`), 0o600); err != nil {
		f.Fatal(err)
	}
	// whereabouts' loader complains of an unknown log_level on the process's
	// stderr; keep the fuzzer's output (also on stderr) readable.
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { devnull.Close() })
	for _, s := range loadSeeds {
		f.Add([]byte(s))
	}
	repl := strings.NewReplacer("@FLAT@", flat, "@KUBECONFIG@", kc, "@DIR@", dir)
	f.Fuzz(func(t *testing.T, in []byte) {
		stdin := []byte(repl.Replace(string(in)))
		stderr := os.Stderr
		os.Stderr = devnull
		cfg, err := Load(stdin)
		os.Stderr = stderr
		if err != nil {
			checkLoadError(t, stdin, dir, err)
		}
		if cfg == nil {
			if err == nil {
				t.Fatal("Load returned neither a config nor an error")
			}
			return
		}
		checkOptions(t, cfg.Options)
		if cfg.Delegated != nil || err == nil {
			checkDelegated(t, cfg.Delegated, cfg.Options.Delegate)
		}
		if err != nil {
			return
		}
		if cfg.IPAM == nil {
			t.Fatal("success without whereabouts' reading of the ipam object")
		}
		if len(cfg.Pools) != len(cfg.IPAM.IPRanges) {
			t.Fatalf("%d pools for %d ranges", len(cfg.Pools), len(cfg.IPAM.IPRanges))
		}
		for _, p := range cfg.Pools {
			if want := wbkube.IPPoolName(wbkube.PoolIdentifier{IpRange: p.Range, NetworkName: cfg.IPAM.NetworkName}); p.Name != want {
				t.Fatalf("pool %q of range %q: whereabouts names it %q", p.Name, p.Range, want)
			}
			_, ipnet, err := net.ParseCIDR(p.Range)
			if err != nil {
				t.Fatalf("pool %q has range %q: %v", p.Name, p.Range, err)
			}
			if ipnet.String() != p.Range {
				t.Fatalf("pool %q: range %q is not canonical (%s)", p.Name, p.Range, ipnet)
			}
			// A name the API server takes for an object, so one the store and
			// the checkpoint can use.
			if errs := validation.IsDNS1123Subdomain(p.Name); len(errs) > 0 {
				t.Fatalf("pool %q is no Kubernetes name: %v", p.Name, errs)
			}
		}
	})
}

// checkLoadError holds an error of Load to its contract.
func checkLoadError(t *testing.T, stdin []byte, dir string, err error) {
	t.Helper()
	ce, ok := err.(*cnitypes.Error)
	if !ok {
		t.Fatalf("not a *types.Error but %T: %v", err, err)
	}
	switch ce.Code {
	case cnitypes.ErrUnsupportedField, cnitypes.ErrDecodingFailure, cnitypes.ErrInvalidNetworkConfig, cnitypes.ErrInternal:
	default:
		t.Fatalf("CNI code %d is none of Load's (2, 6, 7, 999): %s: %s", ce.Code, ce.Msg, ce.Details)
	}
	if strings.TrimSpace(ce.Msg) == "" {
		t.Fatalf("code %d without a message (details %q)", ce.Code, ce.Details)
	}
	text := ce.Msg + "\n" + ce.Details
	for _, s := range []string{fuzzToken, fuzzFlatSecret} {
		if strings.Contains(text, s) && !bytes.Contains(stdin, []byte(s)) {
			t.Fatalf("the message echoes a secret from a file: %q", text)
		}
	}
	if strings.Contains(text, " / bytes:") {
		t.Fatalf("the message echoes whereabouts' input: %q", text)
	}
	for _, s := range inputSecrets(stdin, dir) {
		if strings.Contains(text, s) {
			t.Fatalf("the message echoes the secret %q: %q", s, text)
		}
	}
}

func checkOptions(t *testing.T, o Options) {
	t.Helper()
	if o.Delegate == "" || o.Delegate == PluginType || strings.ContainsAny(o.Delegate, "/\x00") || o.Delegate == "." || o.Delegate == ".." {
		t.Fatalf("delegate %q is not a plugin name", o.Delegate)
	}
	if !filepath.IsAbs(o.CheckpointDir) || filepath.Clean(o.CheckpointDir) != o.CheckpointDir || strings.ContainsRune(o.CheckpointDir, 0) {
		t.Fatalf("checkpoint_dir %q is not a clean absolute path", o.CheckpointDir)
	}
}

// checkDelegated: the delegate's config is JSON whose ipam.type names the
// delegate, read both as a map and as a delegate reads it (into a struct,
// whose keys encoding/json matches case-insensitively).
func checkDelegated(t *testing.T, delegated []byte, delegate string) {
	t.Helper()
	if !json.Valid(delegated) {
		t.Fatalf("Delegated is not JSON: %q", delegated)
	}
	var m struct {
		IPAM map[string]json.RawMessage `json:"ipam"`
	}
	if err := json.Unmarshal(delegated, &m); err != nil {
		t.Fatalf("Delegated: %v", err)
	}
	var typ string
	if err := json.Unmarshal(m.IPAM["type"], &typ); err != nil || typ != delegate {
		t.Fatalf("Delegated's ipam.type is %s, not %q", m.IPAM["type"], delegate)
	}
	var n wbtypes.Net
	if err := json.Unmarshal(delegated, &n); err == nil && n.IPAM != nil && n.IPAM.Type != delegate {
		t.Fatalf("the delegate reads ipam.type %q, not %q", n.IPAM.Type, delegate)
	}
}

// inputSecrets are the token-like values of credential keys in stdin that no
// other part of the input (a key, another value, the test's paths) contains,
// so that an error quoting that other part is no leak.
func inputSecrets(stdin []byte, dir string) []string {
	var doc any
	if json.Unmarshal(stdin, &doc) != nil {
		return nil
	}
	var secrets, others []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				others = append(others, k)
				walk(k, e)
			}
		case []any:
			for _, e := range v {
				walk(key, e)
			}
		case string:
			if secretKey.MatchString(key) {
				secrets = append(secrets, v)
			} else {
				others = append(others, v)
			}
		}
	}
	walk("", doc)
	others = append(others, dir)
	var out []string
next:
	for _, s := range secrets {
		if !tokenLike(s) {
			continue
		}
		for _, o := range others {
			if strings.Contains(o, s) {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// tokenLike: at least 6 bytes, letters and digits both; shorter or plainer
// strings can appear in any message by chance.
func tokenLike(s string) bool {
	if len(s) < 6 || !utf8.ValidString(s) {
		return false
	}
	return strings.ContainsAny(s, "0123456789") && strings.IndexFunc(s, func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}) >= 0
}
