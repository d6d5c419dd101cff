package checkpoint

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The IDs a runtime may pass, at the edges the CNI spec and Linux draw: what
// is refused says why, and what is allowed is the longest allowed.
func TestValidateContainerID(t *testing.T) {
	for _, tt := range []struct {
		id, wantErr string
	}{
		{"a", ""},
		{"0123abc_.-x", ""},
		{strings.Repeat("a", 200), ""},
		{"", "CNI_CONTAINERID is empty"},
		{strings.Repeat("a", 201), "CNI_CONTAINERID is 201 bytes long; at most 200 are allowed"},
		{"-a", `may contain only letters, digits, '_', '.' and '-', and must start with a letter or digit`},
		{"a/b", `CNI_CONTAINERID "a/b" may contain only`},
		{"..", `CNI_CONTAINERID ".." may contain only`},
	} {
		err := ValidateContainerID(tt.id)
		if tt.wantErr == "" {
			assert.NoError(t, err, "%q", tt.id)
			continue
		}
		if assert.Error(t, err, "%q", tt.id) {
			assert.Contains(t, err.Error(), tt.wantErr)
		}
	}
}

func TestValidateIfName(t *testing.T) {
	for _, tt := range []struct {
		name, wantErr string
	}{
		{"lhnet1", ""},
		{"e", ""},
		{"...", ""},
		{strings.Repeat("i", 15), ""},
		{"", "CNI_IFNAME is empty"},
		{strings.Repeat("i", 16), `CNI_IFNAME "iiiiiiiiiiiiiiii" is longer than 15 bytes`},
		{".", `CNI_IFNAME "." is not an interface name`},
		{"..", `CNI_IFNAME ".." is not an interface name`},
		{"a\xffb", "is not valid UTF-8"},
		{"a/b", `CNI_IFNAME "a/b"`},
		{"a:b", `CNI_IFNAME "a:b"`},
		{"a b", `CNI_IFNAME "a b"`},
		{"a\x00b", `CNI_IFNAME "a\x00b"`},
		{"a\u200bb", `CNI_IFNAME`},
	} {
		err := ValidateIfName(tt.name)
		if tt.wantErr == "" {
			assert.NoError(t, err, "%q", tt.name)
			continue
		}
		if assert.Error(t, err, "%q", tt.name) {
			assert.Contains(t, err.Error(), tt.wantErr)
		}
	}
}
