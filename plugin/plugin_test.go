package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/plugin/delegate"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/shim/fake"
)

const (
	poolName = "192.168.50.0-24"
	podArgs  = "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-a"
)

type alloc = whereaboutsv1alpha1.IPAllocation

// rig is a plugin over an in-memory API server and a model of whereabouts
// (shim/fake) as its delegate.
type rig struct {
	t     *testing.T
	api   *fake.API
	wb    *fake.Whereabouts
	del   *fake.Delegate
	p     *Plugin
	out   bytes.Buffer
	log   bytes.Buffer
	cpDir string
	flat  string
	// down fails every request, as an unreachable API server does.
	down bool
}

func newRig(t *testing.T, objs ...any) *rig {
	dir := t.TempDir()
	kc := filepath.Join(dir, "whereabouts.kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t0ken}}]
contexts: [{name: w, context: {cluster: c, user: u}}]
current-context: w
`), 0o600))
	r := &rig{t: t, api: fake.New(), cpDir: filepath.Join(dir, "checkpoints"), flat: filepath.Join(dir, "whereabouts.conf")}
	r.api.Put(objs...)
	r.api.Hook = func(*fake.Call) error {
		if r.down {
			return errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return nil
	}
	require.NoError(t, os.WriteFile(r.flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"`+kc+`"}}`), 0o600))
	opts := shim.Options{Backoff: shim.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 2}}
	r.wb = &fake.Whereabouts{API: r.api, Version: fake.V093, Namespace: "kube-system", Options: opts}
	r.del = &fake.Delegate{WB: r.wb}
	r.p = &Plugin{
		Exec: r.del,
		// A kubeconfig that looks half-written is read again without pausing.
		Sleep: func(time.Duration) {},
		NewStore: func(path string) (*shim.Store, error) {
			kube, err := conf.LoadKubeconfig(path, r.p.Sleep)
			if err != nil {
				return nil, err
			}
			return shim.New(r.api, kube.Namespace, opts), nil
		},
		Stdout: &r.out,
		Stderr: &r.log,
		// The node's settings file: none unless a test writes it.
		NodeConfig: filepath.Join(dir, "harvester-ipam.conf"),
	}
	return r
}

func (r *rig) calls() []string { return r.del.Calls }

// config is the storage network's config; ipamExtra is added to its ipam.
func (r *rig) config(version, ipamExtra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"storagenetwork","type":"bridge","bridge":"mgmt-br",
		"ipam":{"type":"harvester-ipam","range":"192.168.50.0/24","exclude":["192.168.50.1/32"],
		"configuration_path":%q,"harvester_ipam":{"checkpoint_dir":%q}%s}}`, version, r.flat, r.cpDir, ipamExtra))
}

// goneConfig is what is left when the NAD is deleted: no range, and no
// whereabouts flat file found either.
func (r *rig) goneConfig() []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"storagenetwork","ipam":{"type":"harvester-ipam","configuration_path":"/nonexistent","harvester_ipam":{"checkpoint_dir":%q}}}`, r.cpDir))
}

// rangelessConfig has the flat file, so a kubeconfig, but no range.
func (r *rig) rangelessConfig() []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"storagenetwork","ipam":{"type":"harvester-ipam","configuration_path":%q,"harvester_ipam":{"checkpoint_dir":%q}}}`, r.flat, r.cpDir))
}

// args are a verb's arguments; the environment is set too, as the runtime
// sets it, since a delegate inherits it from there.
func args(t *testing.T, id, ifname, cniArgs string, stdin []byte) *skel.CmdArgs {
	for k, v := range map[string]string{"CNI_CONTAINERID": id, "CNI_IFNAME": ifname, "CNI_ARGS": cniArgs, "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin"} {
		t.Setenv(k, v)
	}
	return &skel.CmdArgs{ContainerID: id, IfName: ifname, Netns: "/var/run/netns/x", Args: cniArgs, Path: "/opt/cni/bin", StdinData: stdin}
}

func (r *rig) pool() map[string]alloc {
	p := r.api.Pool("kube-system", poolName)
	require.NotNil(r.t, p)
	if p.Spec.Allocations == nil {
		return map[string]alloc{}
	}
	return p.Spec.Allocations
}

func (r *rig) orips() []string {
	var names []string
	for _, o := range r.api.AllReservations("kube-system") {
		names = append(names, o.Name+"="+o.Spec.PodRef)
	}
	sort.Strings(names)
	return names
}

func (r *rig) kubeconfig() string {
	var f struct{ Kubernetes struct{ Kubeconfig string } }
	b, err := os.ReadFile(r.flat)
	require.NoError(r.t, err)
	require.NoError(r.t, json.Unmarshal(b, &f))
	return f.Kubernetes.Kubeconfig
}

func (r *rig) record(t *testing.T, id string, ips ...string) {
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: id, IfName: "lhnet1", Network: "storagenetwork",
		PodRef: "longhorn-system/im-a", Kubeconfig: r.kubeconfig(), Namespace: "kube-system",
		Pools: []checkpoint.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, IPs: ips}))
}

func ipamPool(allocs map[string]alloc) *shim.Pool {
	return fake.NewPool(poolName, "192.168.50.0/24", allocs)
}

func crashLoopedPool() []any {
	return []any{
		ipamPool(map[string]alloc{
			"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"},
			"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
		}),
		fake.NewReservation("192.168.50.2", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.3", "longhorn-system/im-a"),
		fake.NewReservation("192.168.50.4", "longhorn-system/im-b"),
	}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	require.Error(t, err)
	var ce *cnitypes.Error
	require.True(t, errors.As(err, &ce), "a CNI error, not %T: %v", err, err)
	return ce.Code
}

func withPrevResult(c []byte, ip string) []byte {
	return append(c[:len(c)-1], []byte(`,"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"`+ip+`/24"}]}}`)...)
}

func (r *rig) fillPool(t *testing.T) {
	p := r.api.Pool("kube-system", poolName)
	for i := 0; i < 256; i++ {
		if _, ok := p.Spec.Allocations[fmt.Sprint(i)]; !ok {
			p.Spec.Allocations[fmt.Sprint(i)] = alloc{ContainerID: fmt.Sprint("c", i), PodRef: fmt.Sprint("ns/p", i)}
		}
	}
	_, err := r.api.UpdatePool("kube-system", p)
	require.NoError(t, err)
}

func (r *rig) storeDown() { r.down = true }

// breakKubeconfig leaves the token in a kubeconfig that no longer parses.
func (r *rig) breakKubeconfig(t *testing.T) {
	require.NoError(t, os.WriteFile(r.kubeconfig(), []byte("apiVersion: v1\nusers: [{name: u, user: {token: "+bearer+"}}]\ncontexts: [\n"), 0o600))
}

var ctxBg = context.Background()

// Every verb on every CNI version the plugin says it supports, as
// host-local's tests loop over the spec's versions.
func TestVerbsOnEverySpecVersion(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config(v, ""))))
			res, err := version.NewResult(v, r.out.Bytes())
			require.NoError(t, err, "a %s result: %s", v, r.out.String())
			assert.Equal(t, v, res.Version())
			cur, err := current.NewResultFromResult(res)
			require.NoError(t, err)
			require.Len(t, cur.IPs, 1)
			assert.Equal(t, "192.168.50.2/24", cur.IPs[0].Address.String())

			if v != "0.3.1" { // CHECK came with 0.4.0
				prev := append(r.config(v, "")[:len(r.config(v, ""))-1], []byte(`,"prevResult":`+strings.TrimSpace(r.out.String())+`}`)...)
				require.NoError(t, r.p.Check(args(t, "new", "lhnet1", podArgs, prev)))
			}
			if v == "1.1.0" { // STATUS and GC came with 1.1.0
				require.NoError(t, r.p.Status(args(t, "", "", "", r.config(v, ""))))
				c := r.config(v, "")
				require.NoError(t, r.p.GC(args(t, "", "", "", append(c[:len(c)-1], []byte(`,"cni.dev/valid-attachments":[{"containerID":"new","ifname":"lhnet1"}]}`)...))))
				assert.Len(t, r.pool(), 2, "GC keeps the valid attachment")
			}
			require.NoError(t, r.p.Del(args(t, "new", "lhnet1", podArgs, r.config(v, ""))))
			assert.Equal(t, map[string]alloc{"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}}, r.pool())
		})
	}
}

func TestDelegateErrorsKeepTheirCode(t *testing.T) {
	err := delegateError("whereabouts", "ADD", &cnitypes.Error{Code: 11, Msg: "busy", Details: "d"})
	assert.Equal(t, uint(11), cniCode(t, err))
	assert.Equal(t, "whereabouts ADD: busy", err.(*cnitypes.Error).Msg)
	err = delegateError("whereabouts", "ADD", fmt.Errorf("exec: not found"))
	assert.Equal(t, uint(cnitypes.ErrInternal), cniCode(t, err))
	assert.Contains(t, err.(*cnitypes.Error).Details, "ipam.harvester_ipam.delegate")
}

// hostileAttachments are CNI_CONTAINERID / CNI_IFNAME pairs a checkpoint path
// could be built from that leaves the checkpoint dir, or that no file name
// can hold.
var hostileAttachments = []struct {
	name, id, ifname, want string
}{
	{"container ID climbs out", "../../etc/cron.d/x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID climbs to the parent", "..", "lhnet1", "CNI_CONTAINERID"},
	{"container ID climbs out behind a prefix", "abc/../../x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID is absolute", "/etc/passwd", "lhnet1", "CNI_CONTAINERID"},
	{"container ID with NUL", "abc\x00../../x", "lhnet1", "CNI_CONTAINERID"},
	{"container ID too long", strings.Repeat("f", 201), "lhnet1", "at most 200"},
	{"container ID empty", "", "lhnet1", "CNI_CONTAINERID is empty"},
	{"ifname climbs out", "new", "../../x", "CNI_IFNAME"},
	{"ifname is ..", "new", "..", "CNI_IFNAME"},
	{"ifname with a slash", "new", "a/b", "CNI_IFNAME"},
	{"ifname with NUL", "new", "lh\x00net1", "CNI_IFNAME"},
	{"ifname too long", "new", "lhnet1-lhnet1-lh", "longer than 15 bytes"},
	{"ifname not UTF-8", "new", "lh\x93", "not valid UTF-8"},
}

// hostileArgs are args() without the environment, which cannot hold NUL:
// nothing may be delegated anyway.
func hostileArgs(id, ifname, cniArgs string, stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: id, IfName: ifname, Netns: "/var/run/netns/x", Args: cniArgs, Path: "/opt/cni/bin", StdinData: stdin}
}

// tree lists every path under dir.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Strings(paths)
	return paths
}

func TestHostileAttachmentsAreRefused(t *testing.T) {
	for _, verb := range []string{"ADD", "DEL"} {
		for _, tt := range hostileAttachments {
			t.Run(verb+" "+tt.name, func(t *testing.T) {
				// The pool holds an allocation of exactly this attachment and
				// earlier sandboxes of the pod: a DEL or ADD that went on would
				// release one or the other.
				objs := crashLoopedPool()
				pool := objs[0].(*shim.Pool)
				pool.Spec.Allocations["9"] = alloc{ContainerID: tt.id, PodRef: "longhorn-system/im-a", IfName: tt.ifname}
				r := newRig(t, objs...)
				want := r.pool() // as the API server stores it
				dir := filepath.Dir(r.cpDir)
				before := tree(t, dir)

				a := hostileArgs(tt.id, tt.ifname, podArgs, r.config("0.3.1", ""))
				var err error
				if verb == "ADD" {
					err = r.p.Add(a)
				} else {
					err = r.p.Del(a)
				}

				assert.Equal(t, cnitypes.ErrInvalidEnvironmentVariables, cniCode(t, err), "%v", err)
				ce := err.(*cnitypes.Error)
				assert.Contains(t, ce.Msg, tt.want)
				assert.NotEmpty(t, ce.Details, "the error says what to fix")
				assert.Empty(t, r.calls(), "nothing delegated")
				assert.Equal(t, want, r.pool(), "nothing released")
				assert.Len(t, r.orips(), 3, "no reservation deleted")
				assert.Empty(t, r.out.String(), "no result")
				assert.Equal(t, before, tree(t, dir), "nothing created or removed")
			})
		}
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
		// The shortest timeout is a timeout too, not the default.
		{time.Nanosecond, -time.Hour, time.Nanosecond},
	} {
		r := newRig(t, crashLoopedPool()...)
		spy := &deadlineAPI{API: r.api}
		r.p.NewStore = func(path string) (*shim.Store, error) {
			kube, err := conf.LoadKubeconfig(path, r.p.Sleep)
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

// heldBy are the container IDs of the pod's entries, and their addresses,
// in offset order.
func (r *rig) heldBy(podRef string) (ids, ips []string) {
	pool := r.pool()
	offs := make([]string, 0, len(pool))
	for off := range pool {
		offs = append(offs, off)
	}
	sort.Slice(offs, func(i, j int) bool {
		return len(offs[i]) < len(offs[j]) || len(offs[i]) == len(offs[j]) && offs[i] < offs[j]
	})
	for _, off := range offs {
		if a := pool[off]; a.PodRef == podRef {
			ids = append(ids, a.ContainerID)
			ips = append(ips, "192.168.50."+off)
		}
	}
	return ids, ips
}

// A harvester-ipam started as a delegate (its environment carries the guard
// plugin/delegate sets) refuses every verb at once, touching nothing: run
// again as its own delegate, it would start itself without end. Without the
// guard, the same verbs do their work.
func TestStartedAsItsOwnDelegateEveryVerbRefuses(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard %v", guarded), func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			if guarded {
				t.Setenv(delegate.GuardEnv, "1")
			}
			f := r.p.Funcs()
			stdin := r.config("1.1.0", "")
			verbs := []struct {
				name string
				run  func(*skel.CmdArgs) error
			}{{"ADD", f.Add}, {"CHECK", f.Check}, {"DEL", f.Del}, {"STATUS", f.Status}, {"GC", f.GC}}
			for _, v := range verbs {
				err := v.run(args(t, "new", "lhnet1", podArgs, stdin))
				if !guarded {
					if v.name == "ADD" {
						require.NoError(t, err, "ADD without the guard")
					}
					continue
				}
				assert.Equal(t, uint(cnitypes.ErrTryAgainLater), cniCode(t, err), "%s: %v", v.name, err)
				assert.Contains(t, err.Error(), "was started as the delegate of harvester-ipam", v.name)
			}
			if guarded {
				assert.Empty(t, r.calls(), "nothing delegated")
				assert.Len(t, r.pool(), 3, "nothing released, nothing allocated")
				_, statErr := os.Stat(r.cpDir)
				assert.True(t, os.IsNotExist(statErr), "no checkpoint written")
				return
			}
			assert.Contains(t, r.calls(), "ADD whereabouts")
		})
	}
}
