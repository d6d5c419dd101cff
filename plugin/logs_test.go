package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

// The log goes to whereabouts' log_file when the config names one, at its
// log_level; to stderr when it names none, or one that cannot be opened.
func TestTheLogGoesWhereTheConfigSays(t *testing.T) {
	for _, tt := range []struct {
		name       string
		ipam       func(dir string) string
		wantFile   bool   // the log is in the file
		wantStderr string // and this is on stderr
	}{
		{"no log_file: stderr", func(string) string { return "" }, false, "released 192.168.50.2 from pool"},
		{"a log_file", func(dir string) string { return `,"log_file":"` + filepath.Join(dir, "wb.log") + `"` }, true, ""},
		{"a log_file that cannot be opened: stderr, saying so", func(dir string) string { return `,"log_file":"` + dir + `"` }, false,
			"harvester-ipam: cannot open log_file "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			dir := t.TempDir()
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", tt.ipam(dir)))))
			b, _ := os.ReadFile(filepath.Join(dir, "wb.log"))
			if tt.wantFile {
				assert.Contains(t, string(b), "[verbose] harvester-ipam ADD new: released 192.168.50.2 from pool")
				assert.Empty(t, r.log.String(), "nothing on stderr")
				return
			}
			assert.Empty(t, b)
			assert.Contains(t, r.log.String(), tt.wantStderr)
			if tt.wantStderr != "released 192.168.50.2 from pool" {
				assert.Contains(t, r.log.String(), "released 192.168.50.2 from pool", "the log itself, on stderr")
			}
		})
	}
}

// The debug log times each step, to 10 µs.
func TestPhasesAreRoundedTo10Microseconds(t *testing.T) {
	start := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	at := start
	ph := &phases{last: start, now: func() time.Time { return at }}
	for _, tt := range []struct {
		step string
		took time.Duration
		want string
	}{
		{"config", 1234567 * time.Nanosecond, "config 1.23ms"},
		{"client", 4 * time.Microsecond, "config 1.23ms, client 0s"},
		{"checkpoint", 15 * time.Microsecond, "config 1.23ms, client 0s, checkpoint 20µs"},
		{"whereabouts", 88235 * time.Microsecond, "config 1.23ms, client 0s, checkpoint 20µs, whereabouts 88.24ms"},
	} {
		at = at.Add(tt.took)
		ph.mark(tt.step)
		assert.Equal(t, tt.want, ph.String())
	}
}

// Writes retried after conflicts are counted in the log; none, no line.
func TestRetriedWritesAreLogged(t *testing.T) {
	for _, conflicts := range []int{0, 1} {
		r := newRig(t, crashLoopedPool()...)
		n := 0
		r.api.Hook = func(c *fake.Call) error {
			if c.Verb == "patch" && c.Resource == fake.Pools && n < conflicts {
				n++
				return apierrors.NewConflict(schema.GroupResource{Resource: "ippools"}, poolName, errors.New("modified"))
			}
			return nil
		}
		require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))
		if conflicts == 0 {
			assert.NotContains(t, r.log.String(), "retried")
		} else {
			assert.Contains(t, r.log.String(), "1 writes retried after conflicts")
		}
	}
}

// deadlineAPI is the fake API server, and how long each pool read was given.
type deadlineAPI struct {
	*fake.API
	left []time.Duration
}

func (d *deadlineAPI) GetPool(ctx context.Context, ns, name string, from shim.Source) (*shim.Pool, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(time.Hour)
	}
	d.left = append(d.left, time.Until(dl))
	return d.API.GetPool(ctx, ns, name, from)
}

// A verb is bounded by Plugin.Timeout, by DefaultTimeout when it is zero;
// each request by the store's own 10 s within that.
func TestAVerbIsBoundedByItsTimeout(t *testing.T) {
	for _, tt := range []struct {
		timeout  time.Duration
		min, max time.Duration
	}{
		{0, 9 * time.Second, 10 * time.Second},
		{2 * time.Second, time.Second, 2 * time.Second},
	} {
		r := newRig(t, crashLoopedPool()...)
		spy := &deadlineAPI{API: r.api}
		r.p.NewStore = func(path string) (*shim.Store, error) {
			kube, err := conf.LoadKubeconfig(path)
			if err != nil {
				return nil, err
			}
			return shim.New(spy, kube.Namespace, shim.Options{}), nil
		}
		r.p.Timeout = tt.timeout
		require.NoError(t, r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(r.config("1.0.0", ""), "192.168.50.2"))))
		require.NotEmpty(t, spy.left)
		for _, left := range spy.left {
			assert.Greater(t, left, tt.min, "timeout %s", tt.timeout)
			assert.LessOrEqual(t, left, tt.max, "timeout %s", tt.timeout)
		}
	}
	assert.Equal(t, 150*time.Second, DefaultTimeout)
}

// CHECK with the store down fails so that the runtime asks again.
func TestCheckWithTheStoreDown(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.storeDown()
	err := r.p.Check(args(t, "old1", "lhnet1", podArgs, withPrevResult(r.config("1.0.0", ""), "192.168.50.2")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.True(t, strings.HasPrefix(err.(*cnitypes.Error).Msg, "read pool 192.168.50.0-24: get pool kube-system/192.168.50.0-24: dial tcp"), err.Error())
}
