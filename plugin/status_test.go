package plugin

import (
	"errors"
	"testing"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatus(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Status(args(t, "", "", "", r.config("1.1.0", ""))))
	assert.Equal(t, []string{"STATUS whereabouts"}, r.calls())

	r.storeDown()
	err := r.p.Status(args(t, "", "", "", r.config("1.1.0", "")))
	assert.Equal(t, uint(50), cniCode(t, err))
	assert.Contains(t, err.Error(), "IPPool store unreachable")

	err = r.p.Status(args(t, "", "", "", r.goneConfig()))
	assert.Equal(t, uint(50), cniCode(t, err))
}

func TestErrText(t *testing.T) {
	assert.Equal(t, "m: d", errText(&cnitypes.Error{Msg: "m", Details: "d"}))
	assert.Equal(t, "m", errText(&cnitypes.Error{Msg: "m"}))
	assert.Equal(t, "x", errText(errors.New("x")))
}
