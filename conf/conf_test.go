package conf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func TestLoadRefusesFilesThatAreNotFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, make([]byte, maxFileSize+1), 0o600))
	for _, tt := range []struct{ path, want string }{
		{fifo, "is not a regular file"},
		{"/dev/zero", "is not a regular file"},
		{dir, "is not a regular file"},
		{big, "at most 1048576 are read"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := Load(nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + tt.path + `"}`))
			done <- err
		}()
		select {
		case err := <-done:
			require.Error(t, err, tt.path)
			assert.Equal(t, cnitypes.ErrInvalidNetworkConfig, err.(*cnitypes.Error).Code)
			assert.Contains(t, err.Error(), tt.want)
		case <-time.After(5 * time.Second):
			t.Fatalf("Load blocked on %s", tt.path)
		}
		done2 := make(chan error, 1)
		go func() { _, err := LoadKubeconfig(tt.path); done2 <- err }()
		select {
		case err := <-done2:
			require.Error(t, err, tt.path)
			assert.Contains(t, err.Error(), tt.want)
		case <-time.After(5 * time.Second):
			t.Fatalf("LoadKubeconfig blocked on %s", tt.path)
		}
	}
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
