package testcni

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAtLeast(t *testing.T) {
	for _, tt := range []struct {
		v, min string
		want   bool
	}{
		{V094, V094, true},
		{V093, V094, false},
		{V070, V093, false},
		{"v0.10.0", V094, true}, // not a string comparison
		{"not-a-version", V070, false},
	} {
		if got := AtLeast(tt.v, tt.min); got != tt.want {
			t.Errorf("AtLeast(%q, %q) = %v, want %v", tt.v, tt.min, got, tt.want)
		}
	}
}

// The root a part runs in holds what its container sees: the binary at the
// image's path, the service account, the host's flat file and kubeconfig
// (with the CA inside: the rig's CA file is outside the root), the cron.
func TestPartRoot(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "apiserver.crt")
	if err := os.WriteFile(ca, []byte("CA PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ip-control-loop-v0.9.3")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Rig{cluster: &cluster{apiPort: 6443, token: "tok", caFile: ca}}
	root := filepath.Join(dir, "root")
	opt := PartsOptions{Version: V093, Node: "n1", Tenant: &Tenant{Name: "t1", PoolNamespace: "pools-t1"}, Cron: "* * * * *"}
	if err := r.partRoot(root, bin, "/ip-control-loop", opt); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"ip-control-loop": "#!binary",
		"var/run/secrets/kubernetes.io/serviceaccount/token":     "tok",
		"var/run/secrets/kubernetes.io/serviceaccount/ca.crt":    "CA PEM",
		"var/run/secrets/kubernetes.io/serviceaccount/namespace": "pools-t1",
		"cron-schedule/config":                                   "* * * * *\n",
	} {
		if got := read(p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "ip-control-loop")); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("the binary is not executable: %v %v", st, err)
	}
	var flat struct {
		Datastore  string            `json:"datastore"`
		Kubernetes map[string]string `json:"kubernetes"`
		Cron       string            `json:"reconciler_cron_expression"`
	}
	if err := json.Unmarshal([]byte(read("host/etc/cni/net.d/whereabouts.d/whereabouts.conf")), &flat); err != nil {
		t.Fatal(err)
	}
	if flat.Datastore != "kubernetes" || flat.Kubernetes["kubeconfig"] != "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig" || flat.Cron != "* * * * *" {
		t.Errorf("flat file: %+v", flat)
	}
	kc := read("host/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig")
	if !strings.Contains(kc, "certificate-authority-data: "+base64.StdEncoding.EncodeToString([]byte("CA PEM"))) || strings.Contains(kc, "certificate-authority: ") {
		t.Errorf("kubeconfig does not carry the CA inline:\n%s", kc)
	}
	if !strings.Contains(kc, "namespace: pools-t1") || !strings.Contains(kc, "server: https://127.0.0.1:6443") {
		t.Errorf("kubeconfig:\n%s", kc)
	}
}
