package conf

import (
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
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
