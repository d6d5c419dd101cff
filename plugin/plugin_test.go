package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/client/clientset/versioned/fake"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
	"github.com/harvester/harvester-ipam/shim"
)

const (
	poolName = "192.168.50.0-24"
	podArgs  = "IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=im-a"
)

type alloc = whereaboutsv1alpha1.IPAllocation

// rig is a plugin over a fake store and a delegate that acts like
// whereabouts on that store (or, with swallow, like a whereabouts DEL whose
// storage error was swallowed).
type rig struct {
	t       *testing.T
	cs      *fake.Clientset
	p       *Plugin
	out     bytes.Buffer
	log     bytes.Buffer
	cpDir   string
	flat    string
	calls   []string
	swallow bool
}

func newRig(t *testing.T, objs ...runtime.Object) *rig {
	dir := t.TempDir()
	kc := filepath.Join(dir, "whereabouts.kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t0ken}}]
contexts: [{name: w, context: {cluster: c, user: u}}]
current-context: w
`), 0o600))
	r := &rig{t: t, cs: fake.NewSimpleClientset(objs...), cpDir: filepath.Join(dir, "checkpoints"), flat: filepath.Join(dir, "whereabouts.conf")}
	require.NoError(t, os.WriteFile(r.flat, []byte(`{"datastore":"kubernetes","kubernetes":{"kubeconfig":"`+kc+`"}}`), 0o600))
	r.p = &Plugin{
		Exec:     r,
		NewStore: func(k *conf.Kube) (*shim.Store, error) { return shim.New(r.cs.WhereaboutsV1alpha1(), k.Namespace), nil },
		Stdout:   &r.out,
		Stderr:   &r.log,
	}
	return r
}

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

// The delegate: invoke.Exec.
func (r *rig) FindInPath(plugin string, _ []string) (string, error) {
	return "/opt/cni/bin/" + plugin, nil
}
func (r *rig) Decode(b []byte) (version.PluginInfo, error) {
	return version.PluginSupports("0.3.1", "1.1.0"), nil
}
func (r *rig) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		IPAM       struct{ Type string }
	}
	require.NoError(r.t, json.Unmarshal(stdin, &conf))
	cmd := env["CNI_COMMAND"]
	r.calls = append(r.calls, cmd+" "+filepath.Base(path)+" type="+conf.IPAM.Type)
	pools := r.cs.WhereaboutsV1alpha1().IPPools("kube-system")
	switch cmd {
	case "ADD":
		p, err := pools.Get(ctx, poolName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		pod, _ := conf2pod(env["CNI_ARGS"])
		for off := 2; off < 255; off++ {
			if _, used := p.Spec.Allocations[fmt.Sprint(off)]; !used {
				p.Spec.Allocations[fmt.Sprint(off)] = alloc{ContainerID: env["CNI_CONTAINERID"], PodRef: pod, IfName: env["CNI_IFNAME"]}
				if _, err := pools.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					return nil, err
				}
				return []byte(fmt.Sprintf(`{"cniVersion":%q,"ips":[{"version":"4","address":"192.168.50.%d/24"}]}`, conf.CNIVersion, off)), nil
			}
		}
		return nil, &cnitypes.Error{Code: 11, Msg: "Could not allocate IP in range"}
	case "DEL":
		if r.swallow {
			return nil, nil
		}
		p, err := pools.Get(ctx, poolName, metav1.GetOptions{})
		if err != nil {
			return nil, nil // whereabouts swallows it
		}
		for off, a := range p.Spec.Allocations {
			if a.ContainerID == env["CNI_CONTAINERID"] {
				delete(p.Spec.Allocations, off)
				_, _ = pools.Update(ctx, p, metav1.UpdateOptions{})
				break
			}
		}
	}
	return nil, nil
}

func conf2pod(cniArgs string) (string, error) {
	p, err := conf.ParseArgs(cniArgs)
	return p.Ref(), err
}

func (r *rig) pool() map[string]alloc {
	p, err := r.cs.WhereaboutsV1alpha1().IPPools("kube-system").Get(context.Background(), poolName, metav1.GetOptions{})
	require.NoError(r.t, err)
	require.NotNil(r.t, p.Spec.Allocations)
	return p.Spec.Allocations
}

func (r *rig) orips() []string {
	l, err := r.cs.WhereaboutsV1alpha1().OverlappingRangeIPReservations("kube-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(r.t, err)
	var names []string
	for _, o := range l.Items {
		names = append(names, o.Name+"="+o.Spec.PodRef)
	}
	sort.Strings(names)
	return names
}

func crashLoopedPool() []runtime.Object {
	return []runtime.Object{
		&whereaboutsv1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: "kube-system", ResourceVersion: "7"},
			Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24", Allocations: map[string]alloc{
				"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
				"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"},
				"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
			}},
		},
		oripObj("192.168.50.2", "longhorn-system/im-a"),
		oripObj("192.168.50.3", "longhorn-system/im-a"),
		oripObj("192.168.50.4", "longhorn-system/im-b"),
	}
}

func oripObj(name, podRef string) *whereaboutsv1alpha1.OverlappingRangeIPReservation {
	return &whereaboutsv1alpha1.OverlappingRangeIPReservation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: "u-" + "1", ResourceVersion: "1"},
		Spec:       whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: podRef},
	}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	require.Error(t, err)
	var ce *cnitypes.Error
	require.True(t, errors.As(err, &ce), "a CNI error, not %T: %v", err, err)
	return ce.Code
}

func TestAddReclaimsEarlierSandboxesThenDelegates(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", ""))))

	assert.Equal(t, []string{"ADD whereabouts type=whereabouts"}, r.calls)
	assert.Equal(t, map[string]alloc{
		"2": {ContainerID: "new", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool(), "one allocation for the pod; the other pod's untouched")
	assert.Equal(t, []string{"192.168.50.4=longhorn-system/im-b"}, r.orips())
	assert.JSONEq(t, `{"cniVersion":"0.3.1","ips":[{"version":"4","address":"192.168.50.2/24"}],"dns":{}}`, r.out.String())

	rec, ok, err := checkpoint.Dir(r.cpDir).Read("new", "lhnet1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}, rec.Pools)
	assert.Equal(t, []string{"192.168.50.2/24"}, rec.IPs)
	assert.Equal(t, "longhorn-system/im-a", rec.PodRef)

	for _, want := range []string{"released 192.168.50.2 from pool 192.168.50.0-24", "was container old1, pod longhorn-system/im-a", "released 192.168.50.3", "reservation 192.168.50.3 deleted"} {
		assert.Contains(t, r.log.String(), want)
	}
	assert.NotContains(t, r.log.String(), "t0ken")
}

func TestAddRefusesBadInputAndLosesNothing(t *testing.T) {
	tests := []struct {
		name     string
		id, ifn  string
		cniArgs  string
		stdin    func(r *rig) []byte
		wantCode uint
		wantMsg  string
	}{
		{"no pod identity", "new", "lhnet1", "IgnoreUnknown=true", nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_ARGS lacks K8S_POD_NAMESPACE and K8S_POD_NAME"},
		{"a container ID that escapes", "../../etc", "lhnet1", podArgs, nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID"},
		{"an ifname that escapes", "new", "../x", podArgs, nil, cnitypes.ErrInvalidEnvironmentVariables, "CNI_IFNAME"},
		{"no range", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.rangelessConfig() }, cnitypes.ErrInvalidNetworkConfig, "ipam config has no range"},
		{"no flat file", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.goneConfig() }, cnitypes.ErrInvalidNetworkConfig, "whereabouts flat file not found"},
		{"an unknown option", "new", "lhnet1", podArgs, func(r *rig) []byte { return r.config("0.3.1", `,"harvester_ipam":{"bogus":1}`) }, cnitypes.ErrUnsupportedField, `unknown field "bogus"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			stdin := r.config("0.3.1", "")
			if tt.stdin != nil {
				stdin = tt.stdin(r)
			}
			err := r.p.Add(args(t, tt.id, tt.ifn, tt.cniArgs, stdin))
			assert.Equal(t, tt.wantCode, cniCode(t, err), "%v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Empty(t, r.calls, "nothing delegated")
			assert.Len(t, r.pool(), 3, "nothing released")
			assert.Empty(t, r.out.String(), "no result on stdout")
		})
	}
}

func TestAddWithTheStoreDownFailsBeforeDelegating(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.cs.PrependReactor("get", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err))
	assert.Contains(t, err.Error(), "release earlier sandboxes of longhorn-system/im-a from pool 192.168.50.0-24")
	assert.Contains(t, err.Error(), "connection refused")
	assert.Empty(t, r.calls)
}

func TestAddPassesTheDelegatesErrorOn(t *testing.T) {
	full := map[string]alloc{}
	for i := 0; i < 256; i++ {
		full[fmt.Sprint(i)] = alloc{ContainerID: fmt.Sprint("c", i), PodRef: fmt.Sprint("ns/p", i)}
	}
	r := newRig(t, &whereaboutsv1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24", Allocations: full}})
	err := r.p.Add(args(t, "new", "lhnet1", podArgs, r.config("0.3.1", "")))
	assert.Equal(t, uint(11), cniCode(t, err))
	assert.Contains(t, err.Error(), "whereabouts ADD: Could not allocate IP in range")
}

func TestDel(t *testing.T) {
	tests := []struct {
		name    string
		objs    []runtime.Object
		prepare func(r *rig)
		stdin   func(r *rig) []byte
		times   int
		want    map[string]alloc
		calls   []string
	}{{
		name:  "the delegate released it",
		objs:  crashLoopedPool(),
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		want:  map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
		calls: []string{"DEL whereabouts type=whereabouts"},
	}, {
		name:    "the delegate swallowed its storage error",
		objs:    crashLoopedPool(),
		prepare: func(r *rig) { r.swallow = true },
		stdin:   func(r *rig) []byte { return r.config("0.3.1", "") },
		want:    map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
		calls:   []string{"DEL whereabouts type=whereabouts"},
	}, {
		name: "the NAD is gone: the checkpoint names the pool",
		objs: crashLoopedPool(),
		prepare: func(r *rig) {
			kc := r.kubeconfig()
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
				Kubeconfig: kc, Namespace: "kube-system", Pools: []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
		},
		stdin: func(r *rig) []byte { return r.goneConfig() },
		times: 2,
		want:  map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
	}, {
		name: "a config of only the type, with the flat file: the checkpoint names the pool",
		objs: crashLoopedPool(),
		prepare: func(r *rig) {
			require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
				Kubeconfig: "/elsewhere", Namespace: "kube-system", Pools: []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
		},
		stdin: func(r *rig) []byte { return r.rangelessConfig() },
		want:  map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
	}, {
		name:  "the NAD is gone and nothing was recorded",
		objs:  crashLoopedPool(),
		stdin: func(r *rig) []byte { return r.goneConfig() },
		want:  crashLoopedPool()[0].(*whereaboutsv1alpha1.IPPool).Spec.Allocations,
	}, {
		name:  "the pool was deleted",
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		times: 2,
		calls: nil, // nothing held: nothing to delegate
	}, {
		name:  "twice in a row",
		objs:  crashLoopedPool(),
		stdin: func(r *rig) []byte { return r.config("0.3.1", "") },
		times: 2,
		want:  map[string]alloc{"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"}, "4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"}},
		calls: []string{"DEL whereabouts type=whereabouts"}, // the second finds nothing held
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.objs...)
			if tt.prepare != nil {
				tt.prepare(r)
			}
			times := max(tt.times, 1)
			for i := 0; i < times; i++ {
				require.NoError(t, r.p.Del(args(t, "old1", "lhnet1", "", tt.stdin(r))), "DEL #%d", i+1)
			}
			assert.Equal(t, tt.calls, r.calls)
			if tt.want != nil {
				assert.Equal(t, tt.want, r.pool())
			}
			_, ok, err := checkpoint.Dir(r.cpDir).Read("old1", "lhnet1")
			require.NoError(t, err)
			assert.False(t, ok, "the checkpoint is gone")
		})
	}
}

func (r *rig) kubeconfig() string {
	var f struct{ Kubernetes struct{ Kubeconfig string } }
	b, err := os.ReadFile(r.flat)
	require.NoError(r.t, err)
	require.NoError(r.t, json.Unmarshal(b, &f))
	return f.Kubernetes.Kubeconfig
}

func TestDelWithTheStoreDownIsAnError(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	r.cs.PrependReactor("get", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	require.NoError(t, checkpoint.Dir(r.cpDir).Write(checkpoint.Record{ContainerID: "old1", IfName: "lhnet1", Network: "storagenetwork",
		Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
	err := r.p.Del(args(t, "old1", "lhnet1", "", r.config("0.3.1", "")))
	assert.Equal(t, cnitypes.ErrTryAgainLater, cniCode(t, err), "the runtime must retry")
	assert.Contains(t, err.Error(), "read pool kube-system/192.168.50.0-24")
	assert.Empty(t, r.calls, "no delegate that would wait for a lease it cannot get")
	_, ok, _ := checkpoint.Dir(r.cpDir).Read("old1", "lhnet1")
	assert.True(t, ok, "the checkpoint stays for the retry")
}

func TestCheck(t *testing.T) {
	prev := func(ip string) string {
		return `,"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"` + ip + `/24"}]}`
	}
	withPrev := func(r *rig, ip string) []byte {
		c := r.config("1.0.0", "")
		return append(c[:len(c)-1], []byte(prev(ip)+"}")...)
	}
	tests := []struct {
		name    string
		id      string
		ip      string
		wantErr string
	}{
		{"the allocation is there", "old1", "192.168.50.2", ""},
		{"a legacy allocation without ifname", "old2", "192.168.50.3", ""},
		{"another address", "old1", "192.168.50.9", "192.168.50.9 is not allocated to container old1 ifname lhnet1 in pool 192.168.50.0-24 (it holds 192.168.50.2)"},
		{"nothing held", "gone", "192.168.50.2", "pool 192.168.50.0-24 holds nothing for container gone ifname lhnet1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, crashLoopedPool()...)
			err := r.p.Check(args(t, tt.id, "lhnet1", podArgs, withPrev(r, tt.ip)))
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestGCReleasesOnlyWhatIsNotValid(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	cp := checkpoint.Dir(r.cpDir)
	for _, id := range []string{"old1", "old2"} {
		require.NoError(t, cp.Write(checkpoint.Record{ContainerID: id, IfName: "lhnet1", Network: "storagenetwork",
			Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
	}
	// Another network's record is not this GC's business.
	require.NoError(t, cp.Write(checkpoint.Record{ContainerID: "b1", IfName: "lhnet1", Network: "othernet",
		Kubeconfig: r.kubeconfig(), Namespace: "kube-system", Pools: []conf.Pool{{Name: poolName, Range: "192.168.50.0/24"}}}))
	c := r.config("1.1.0", "")
	stdin := append(c[:len(c)-1], []byte(`,"cni.dev/valid-attachments":[{"containerID":"old1","ifname":"lhnet1"}]}`)...)
	require.NoError(t, r.p.GC(args(t, "", "", "", stdin)))

	assert.Equal(t, map[string]alloc{
		"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
		"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
	}, r.pool())
	assert.Equal(t, []string{"GC whereabouts type=whereabouts"}, r.calls)
	recs, _ := cp.List()
	var left []string
	for _, rec := range recs {
		left = append(left, rec.ContainerID)
	}
	assert.ElementsMatch(t, []string{"old1", "b1"}, left)
}

func TestStatus(t *testing.T) {
	r := newRig(t, crashLoopedPool()...)
	require.NoError(t, r.p.Status(args(t, "", "", "", r.config("1.1.0", ""))))
	assert.Equal(t, []string{"STATUS whereabouts type=whereabouts"}, r.calls)

	r.cs.PrependReactor("list", "ippools", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	err := r.p.Status(args(t, "", "", "", r.config("1.1.0", "")))
	assert.Equal(t, uint(50), cniCode(t, err))
	assert.Contains(t, err.Error(), "IPPool store unreachable")

	err = r.p.Status(args(t, "", "", "", r.goneConfig()))
	assert.Equal(t, uint(50), cniCode(t, err))
}
