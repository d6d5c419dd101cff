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
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf"
	"github.com/harvester/harvester-ipam/plugin/checkpoint"
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
		NewStore: func(path string) (*shim.Store, error) {
			kube, err := conf.LoadKubeconfig(path)
			if err != nil {
				return nil, err
			}
			return shim.New(r.api, kube.Namespace, opts), nil
		},
		Stdout: &r.out,
		Stderr: &r.log,
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
	return &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: "kube-system"},
		Spec: whereaboutsv1alpha1.IPPoolSpec{Range: "192.168.50.0/24", Allocations: allocs}}
}

func crashLoopedPool() []any {
	return []any{
		ipamPool(map[string]alloc{
			"2": {ContainerID: "old1", PodRef: "longhorn-system/im-a", IfName: "lhnet1"},
			"3": {ContainerID: "old2", PodRef: "longhorn-system/im-a"},
			"4": {ContainerID: "b1", PodRef: "longhorn-system/im-b", IfName: "lhnet1"},
		}),
		oripObj("192.168.50.2", "longhorn-system/im-a"),
		oripObj("192.168.50.3", "longhorn-system/im-a"),
		oripObj("192.168.50.4", "longhorn-system/im-b"),
	}
}

func oripObj(name, podRef string) *shim.Reservation {
	return &shim.Reservation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
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
