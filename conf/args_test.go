package conf

import (
	"strings"
	"testing"
	"unicode/utf8"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		want    Pod
		wantMsg string
	}{
		{"multus", "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=instance-manager-6b77;K8S_POD_INFRA_CONTAINER_ID=517151fa;K8S_POD_UID=5597ce22", Pod{"longhorn-system", "instance-manager-6b77"}, ""},
		{"unknown keys without IgnoreUnknown", "FOO=bar;K8S_POD_NAME=a;K8S_POD_NAMESPACE=b", Pod{"b", "a"}, ""},
		{"empty values are missing", "K8S_POD_NAME=;K8S_POD_NAMESPACE=b", Pod{}, "CNI_ARGS lacks K8S_POD_NAME"},
		{"nothing", "", Pod{}, "CNI_ARGS lacks K8S_POD_NAMESPACE and K8S_POD_NAME"},
		{"not KEY=VALUE", "K8S_POD_NAME", Pod{}, `CNI_ARGS entry "K8S_POD_NAME" is not KEY=VALUE`},
		{"a slash in the name", "K8S_POD_NAME=a/b;K8S_POD_NAMESPACE=c", Pod{}, "is not a Kubernetes namespace and name"},
		{"a name that is not UTF-8 (found by FuzzParseArgs)", "K8S_POD_NAMESPACE=0;K8S_POD_NAME=0\x910", Pod{}, `pod "0/0\x910" is not a Kubernetes namespace and name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.args)
			if tt.wantMsg != "" {
				require.Error(t, err)
				ce := err.(*cnitypes.Error)
				assert.Equal(t, cnitypes.ErrInvalidEnvironmentVariables, ce.Code)
				assert.Contains(t, ce.Msg, tt.wantMsg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.want.Namespace+"/"+tt.want.Name, got.Ref())
		})
	}
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
