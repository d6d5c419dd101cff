package conf

import (
	"bytes"
	"encoding/json"
	wbkube "github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

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

// FuzzParseArgs: ParseArgs never panics; it yields a pod with a namespace and
// a name, neither with '/', or a CNI error 4; and it reads the pod as
// whereabouts (types.LoadArgs) does whenever both read one.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{
		"IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=instance-manager-6b77;K8S_POD_INFRA_CONTAINER_ID=517151fa;K8S_POD_UID=5597ce22",
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=backing-image-ds-default-image-lhnet1;K8S_POD_INFRA_CONTAINER_ID=517151fa292bdcf9522e24fb05f1a99bb96db0a37fb647edb5a146c72b1a5017;K8S_POD_UID=5597ce22-1b5c-4d5e-9f0a-3c2b1a0f9e8d",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-a;IP=192.168.50.9/24;GATEWAY=192.168.50.1",
		"K8S_POD_NAME=a;K8S_POD_NAME=b;K8S_POD_NAMESPACE=ns;",
		"K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=c",
		"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a=b",
		"K8S_POD_NAMESPACE=;K8S_POD_NAME=x",
		"IgnoreUnknown=true",
		"K8S_POD_NAME",
		";;",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cniArgs string) {
		pod, err := ParseArgs(cniArgs)
		if err != nil {
			ce, ok := err.(*cnitypes.Error)
			if !ok {
				t.Fatalf("not a *types.Error but %T: %v", err, err)
			}
			if ce.Code != cnitypes.ErrInvalidEnvironmentVariables || ce.Msg == "" {
				t.Fatalf("want code 4 with a message, got %d %q", ce.Code, ce.Msg)
			}
			if pod != (Pod{}) {
				t.Fatalf("a pod %+v beside an error", pod)
			}
			return
		}
		if pod.Namespace == "" || pod.Name == "" || strings.Contains(pod.Namespace, "/") || strings.Contains(pod.Name, "/") {
			t.Fatalf("pod %+v from %q", pod, cniArgs)
		}
		// The podref is compared with, and recorded as, JSON strings.
		if !utf8.ValidString(pod.Ref()) {
			t.Fatalf("podref %q is not UTF-8", pod.Ref())
		}
		if strings.Count(pod.Ref(), "/") != 1 {
			t.Fatalf("podref %q", pod.Ref())
		}
		var wb wbtypes.IPAMEnvArgs
		if cnitypes.LoadArgs(cniArgs, &wb) == nil {
			if string(wb.K8S_POD_NAMESPACE) != pod.Namespace || string(wb.K8S_POD_NAME) != pod.Name {
				t.Fatalf("whereabouts reads pod %s/%s, we read %s", wb.K8S_POD_NAMESPACE, wb.K8S_POD_NAME, pod.Ref())
			}
		}
	})
}
