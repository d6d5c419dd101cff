package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester-ipam/testcni"
)

const chartDir = "install/chart/harvester-ipam"

// render runs `helm template` on the chart as a user would.
func render(t *testing.T, release, namespace string, set ...string) []byte {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := rig.Helm(ctx(t), args...)
	require.NoError(t, err)
	return out
}

func objects(t *testing.T, manifest []byte) []unstructured.Unstructured {
	t.Helper()
	var out []unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var o unstructured.Unstructured
		err := dec.Decode(&o.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if len(o.Object) > 0 {
			out = append(out, o)
		}
	}
}

func kinds(objs []unstructured.Unstructured) map[string]int {
	k := map[string]int{}
	for _, o := range objs {
		k[o.GetKind()]++
	}
	return k
}

func typed[T any](t *testing.T, objs []unstructured.Unstructured, kind string) *T {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			var v T
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &v))
			return &v
		}
	}
	t.Fatalf("no %s rendered", kind)
	return nil
}

// The chart lints, renders with each kind of values, and the real API server
// accepts every object it renders (server-side apply, dry run); values that
// make no sense are refused by helm with a message naming them.
func TestChartRendersObjectsTheServerAccepts(t *testing.T) {
	_, err := rig.Helm(ctx(t), "lint", "--strict", chartDir)
	require.NoError(t, err)

	for _, tt := range []struct {
		name, namespace string
		set             []string
		want            map[string]int
		check           func(t *testing.T, objs []unstructured.Unstructured)
	}{
		{
			name: "defaults", namespace: "kube-system",
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
				assert.Equal(t, "rancher/harvester-ipam:v0.1.0", ds.Spec.Template.Spec.Containers[0].Image)
				assert.Contains(t, string(mustJSON(t, objs, "CronJob")), `"--interval=0"`)
			},
		},
		{
			name: "reconciler as a deployment, dry run", namespace: "harvester-system",
			set:  []string{"reconciler.mode=deployment", "reconciler.dryRun=true", "reconciler.grace=30m", "image.tag=v9.9.9"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "Deployment": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				d := typed[appsv1.Deployment](t, objs, "Deployment")
				c := d.Spec.Template.Spec.Containers[0]
				assert.Equal(t, "rancher/harvester-ipam:v9.9.9", c.Image)
				assert.Equal(t, []string{"--namespace=kube-system", "--grace=30m", "--daemonset=harvester-ipam", "--dry-run", "--interval=1m", "--metrics-addr=:9420"}, c.Args, "--daemonset: the audit's next commands name this release's DaemonSet")
				assert.Equal(t, int32(9420), c.Ports[0].ContainerPort)
			},
		},
		{
			name: "deleting orphaned pools", namespace: "kube-system",
			set:  []string{"reconciler.deleteOrphanedPools=true"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				assert.Contains(t, string(mustJSON(t, objs, "CronJob")), `"--delete-orphaned-pools"`)
				for _, o := range objs {
					if o.GetKind() != "Role" || !strings.HasSuffix(o.GetName(), "-reconciler") {
						continue
					}
					role := typed[rbacv1.Role](t, []unstructured.Unstructured{o}, "Role")
					assert.Equal(t, []string{"get", "list", "watch", "update", "patch", "delete"}, role.Rules[0].Verbs, "ippools delete, for the flag only (watch: the audit's informer)")
				}
			},
		},
		{
			name: "the node agent", namespace: "harvester-system",
			set:  []string{"agent.socketPath=/run/hi/a.sock", "hostPaths.cniConfDir=/var/lib/rancher/cni/net.d"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				var ds *appsv1.DaemonSet
				for _, o := range objs {
					if o.GetKind() == "DaemonSet" && o.GetName() == "harvester-ipam-agent" {
						ds = typed[appsv1.DaemonSet](t, []unstructured.Unstructured{o}, "DaemonSet")
					}
				}
				require.NotNil(t, ds, "the agent's DaemonSet")
				spec := ds.Spec.Template.Spec
				assert.Equal(t, "harvester-ipam-agent", spec.ServiceAccountName, "an identity of its own")
				assert.True(t, spec.HostNetwork)
				assert.Equal(t, int32(0), ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntVal, "a new agent starts beside the old one")
				require.Len(t, spec.Containers, 1)
				c := spec.Containers[0]
				assert.Equal(t, []string{"/usr/bin/harvester-ipam-agent"}, c.Command)
				assert.Equal(t, []string{"--socket=/run/hi/a.sock", "--node-file=/var/lib/rancher/cni/net.d/harvester-ipam.d/agent.conf",
					"--namespace=kube-system", "--checkpoint-dir=/var/lib/cni/harvester-ipam", "--metrics-addr=127.0.0.1:9422",
					"--max-in-flight=256", "--log-requests=true", "--grace=25s"}, c.Args)
				assert.Equal(t, []string{"/usr/bin/harvester-ipam-agent", "probe", "--socket=/run/hi/a.sock"}, c.ReadinessProbe.Exec.Command)
				assert.Equal(t, int64(0), *c.SecurityContext.RunAsUser)
				assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
				assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
				// Every host path at its own path, read-only but what it writes.
				hostPaths := map[string]string{}
				for _, v := range spec.Volumes {
					hostPaths[v.Name] = v.HostPath.Path
				}
				mounts := map[string]string{}
				for _, m := range c.VolumeMounts {
					assert.Equal(t, hostPaths[m.Name], m.MountPath, "%s at its host path", m.Name)
					mounts[m.MountPath] = map[bool]string{true: "ro", false: "rw"}[m.ReadOnly]
				}
				assert.Equal(t, map[string]string{"/run/hi": "rw", "/var/lib/rancher/cni/net.d": "ro", "/var/lib/rancher/cni/net.d/harvester-ipam.d": "rw",
					"/var/lib/cni/harvester-ipam": "rw", "/opt/cni/bin": "ro"}, mounts)
				for _, o := range objs {
					if o.GetKind() == "Role" && o.GetName() == "harvester-ipam-agent" {
						assert.Equal(t, "kube-system", o.GetNamespace(), "beside the pools")
					}
				}
			},
		},
		{
			name: "no node agent", namespace: "kube-system",
			set:  []string{"agent.enabled=false"},
			want: map[string]int{"ServiceAccount": 2, "Role": 3, "RoleBinding": 3, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 1, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				for _, o := range objs {
					assert.NotContains(t, o.GetName(), "agent", "%s %s", o.GetKind(), o.GetName())
				}
			},
		},
		{
			name: "installer only", namespace: "kube-system",
			set:  []string{"reconciler.enabled=false", "rbac.plugin=false", "agent.enabled=false"},
			want: map[string]int{"ServiceAccount": 1, "DaemonSet": 1, "Role": 1, "RoleBinding": 1, "ClusterRole": 1, "ClusterRoleBinding": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				// Standing in, the installer reads and watches its own
				// DaemonSet, its namespace and its node, with its own token,
				// and nothing else; it knows its pod and node by name.
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
				assert.True(t, *ds.Spec.Template.Spec.AutomountServiceAccountToken)
				c := ds.Spec.Template.Spec.Containers[0]
				assert.Contains(t, c.Args, "--daemonset=harvester-ipam")
				assert.Contains(t, c.Args, "--host-cni-bin-dir=/opt/cni/bin")
				assert.Contains(t, c.StartupProbe.Exec.Command, "--daemonset=harvester-ipam", "the probe knows its release: another's stand-in is no failure")
				env := map[string]string{}
				for _, e := range c.Env {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
				assert.Equal(t, map[string]string{"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "NODE_NAME": "spec.nodeName"}, env)
				role := typed[rbacv1.Role](t, objs, "Role")
				assert.Equal(t, "kube-system", role.Namespace)
				assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{"harvester-ipam"}, Verbs: []string{"get", "list", "watch"}}}, role.Rules)
				cr := typed[rbacv1.ClusterRole](t, objs, "ClusterRole")
				assert.Equal(t, []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get", "list", "watch"}},
					{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
				}, cr.Rules)
			},
		},
		{
			name: "the DaemonSet without the reconciler's permissions", namespace: "kube-system",
			set:  []string{"rbac.diagnostics=false"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				for _, o := range objs {
					if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" || !strings.HasSuffix(o.GetName(), "-reconciler") {
						continue
					}
					b, _ := json.Marshal(o.Object["subjects"])
					assert.NotContains(t, string(b), "harvester-ipam-installer", "%s %s binds only the reconciler", o.GetKind(), o.GetName())
				}
			},
		},
		{
			name: "plugin log settings", namespace: "kube-system",
			set:  []string{"plugin.logLevel=debug", "plugin.logFile=/var/log/harvester-ipam.log"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
				assert.Subset(t, ds.Spec.Template.Spec.Containers[0].Args, []string{
					"--node-config=/host/etc/cni/net.d/harvester-ipam.d/harvester-ipam.conf", "--log-level=debug", "--log-file=/var/log/harvester-ipam.log"})
			},
		},
		{
			name: "installer only, not standing in", namespace: "kube-system",
			set:  []string{"reconciler.enabled=false", "rbac.plugin=false", "standIn.enabled=false", "agent.enabled=false"},
			want: map[string]int{"ServiceAccount": 1, "DaemonSet": 1, "Role": 1, "RoleBinding": 1, "ClusterRole": 1, "ClusterRoleBinding": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
				assert.False(t, *ds.Spec.Template.Spec.AutomountServiceAccountToken, "no API access, no token")
				// Its DaemonSet named, to give back what a revision before
				// took; its Role kept, for that revision's pods to read
				// through while they stop.
				assert.Contains(t, ds.Spec.Template.Spec.Containers[0].Args, "--daemonset=harvester-ipam")
				assert.NotContains(t, strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), "--stand-in")
				// harvester-ipam a release from before the stand-in's records
				// left at the name goes back too.
				assert.Contains(t, ds.Spec.Template.Spec.Containers[0].Args, "--not-stand-in=whereabouts")
			},
		},
		{
			name: "other host paths and pool namespace", namespace: "kube-system",
			set: []string{"hostPaths.cniBinDir=/var/lib/rancher/rke2/data/cni/bin", "hostPaths.cniConfDir=/var/lib/rancher/cni/net.d",
				"whereabouts.poolNamespace=whereabouts-pools", "whereabouts.serviceAccount.name=wb", "whereabouts.serviceAccount.namespace=whereabouts-system"},
			want: map[string]int{"ServiceAccount": 3, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2, "DaemonSet": 2, "CronJob": 1},
			check: func(t *testing.T, objs []unstructured.Unstructured) {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
				paths := map[string]string{}
				for _, v := range ds.Spec.Template.Spec.Volumes {
					paths[v.Name] = v.HostPath.Path
				}
				assert.Equal(t, map[string]string{"cni-bin": "/var/lib/rancher/rke2/data/cni/bin", "cni-conf": "/var/lib/rancher/cni/net.d",
					"node-config": "/var/lib/rancher/cni/net.d/harvester-ipam.d"}, paths)
				assert.Contains(t, ds.Spec.Template.Spec.Containers[0].Args, "--host-cni-bin-dir=/var/lib/rancher/rke2/data/cni/bin")
				for _, o := range objs {
					switch {
					case o.GetName() == "harvester-ipam-installer" && (o.GetKind() == "Role" || o.GetKind() == "RoleBinding"):
						assert.Equal(t, "kube-system", o.GetNamespace(), "%s %s lives beside its DaemonSet", o.GetKind(), o.GetName())
					case o.GetKind() == "Role" || o.GetKind() == "RoleBinding":
						assert.Equal(t, "whereabouts-pools", o.GetNamespace(), "%s %s lives beside the pools", o.GetKind(), o.GetName())
					}
				}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			manifest := render(t, "harvester-ipam", tt.namespace, tt.set...)
			objs := objects(t, manifest)
			assert.Equal(t, tt.want, kinds(objs))
			if tt.check != nil {
				tt.check(t, objs)
			}
			for _, o := range objs {
				if ns := o.GetNamespace(); ns != "" {
					require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
				}
			}
			require.NoError(t, rig.Apply(ctx(t), manifest, true), "server-side dry run of what the chart renders")
		})
	}

	// The dry run is not vacuous: an object the server rejects fails it.
	bad := bytes.Replace(render(t, "harvester-ipam", "kube-system"), []byte("type: Directory"), []byte("type: Folder"), 1)
	err = rig.Apply(ctx(t), bad, true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DaemonSet kube-system/harvester-ipam")
	assert.Contains(t, err.Error(), `Unsupported value: "Folder"`)

	for set, msg := range map[string]string{
		"reconciler.mode=sometimes": "reconciler.mode must be one of the following",
		"reconciler.grace=10":       "reconciler.grace: Invalid type",
		"reconciler.gracePeriod=1h": "Additional property gracePeriod is not allowed",
		"hostPaths.cniBinDir=opt":   "hostPaths.cniBinDir: Does not match pattern",
	} {
		_, err := rig.Helm(ctx(t), "template", "x", chartDir, "--set", set)
		require.Error(t, err, "--set %s", set)
		assert.Contains(t, err.Error(), msg)
	}
}

func mustJSON(t *testing.T, objs []unstructured.Unstructured, kind string) []byte {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			b, err := o.MarshalJSON()
			require.NoError(t, err)
			return b
		}
	}
	t.Fatalf("no %s rendered", kind)
	return nil
}

// The chart's RBAC, applied for real: each identity may do what its part
// needs and nothing else (asked as `kubectl auth can-i --as` asks), and the
// plugin, logged in as whereabouts' identity with only this chart's Role,
// really releases an allocation; without it, it cannot. The agent's Role is
// enough for every verb it serves: every test's agent runs under it (a
// tenant's AgentKubeconfig), and every test's plugin under whereabouts'
// ClusterRole and this chart's plugin Role (its WhereaboutsKubeconfig).
func TestChartRBACIsLeastPrivilegeAndEnough(t *testing.T) {
	const release, ns, wbSA = "rbac-check", "harvester-ipam-rbac", "rbac-check-whereabouts"
	require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
	require.NoError(t, rig.Apply(ctx(t), render(t, release, ns, "whereabouts.serviceAccount.name="+wbSA), false))

	plugin := "system:serviceaccount:kube-system:" + wbSA
	reconciler := "system:serviceaccount:" + ns + ":" + release + "-harvester-ipam-reconciler"
	installer := "system:serviceaccount:" + ns + ":" + release + "-harvester-ipam-installer"
	agent := "system:serviceaccount:" + ns + ":" + release + "-harvester-ipam-agent"
	type q struct{ user, verb, group, resource, namespace string }
	wb, core := "whereabouts.cni.cncf.io", ""
	allowed := []q{
		{plugin, "get", wb, "ippools", "kube-system"}, {plugin, "list", wb, "ippools", "kube-system"},
		{plugin, "update", wb, "ippools", "kube-system"}, {plugin, "patch", wb, "ippools", "kube-system"},
		{plugin, "get", wb, "overlappingrangeipreservations", "kube-system"},
		{plugin, "list", wb, "overlappingrangeipreservations", "kube-system"},
		{plugin, "delete", wb, "overlappingrangeipreservations", "kube-system"},
		{plugin, "get", "coordination.k8s.io", "leases", "kube-system"}, {plugin, "create", "coordination.k8s.io", "leases", "kube-system"},
		{reconciler, "get", "coordination.k8s.io", "leases", "kube-system"}, {reconciler, "create", "coordination.k8s.io", "leases", "kube-system"},
		{plugin, "create", core, "events", "kube-system"},
		{reconciler, "get", wb, "ippools", "kube-system"}, {reconciler, "list", wb, "ippools", "kube-system"},
		{reconciler, "update", wb, "ippools", "kube-system"}, {reconciler, "patch", wb, "ippools", "kube-system"},
		{reconciler, "get", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "list", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "patch", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "delete", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "create", core, "events", "kube-system"}, {reconciler, "patch", core, "events", "kube-system"},
		{reconciler, "get", core, "pods", "longhorn-system"}, {reconciler, "list", core, "pods", "longhorn-system"},
		{reconciler, "list", core, "pods", ""}, {reconciler, "get", core, "nodes", ""}, {reconciler, "list", core, "nodes", ""},
		{reconciler, "watch", core, "pods", ""}, {reconciler, "watch", core, "nodes", ""}, // the loop's informers
		{reconciler, "get", "k8s.cni.cncf.io", "network-attachment-definitions", "harvester-system"},
		{reconciler, "list", "k8s.cni.cncf.io", "network-attachment-definitions", ""},
		// The audit (docs/audit.md): informers of pools, reservations and
		// NADs, and a Warning Event on the pod of each finding, wherever it runs.
		{reconciler, "watch", wb, "ippools", "kube-system"}, {reconciler, "watch", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "watch", "k8s.cni.cncf.io", "network-attachment-definitions", ""},
		{reconciler, "create", core, "events", "longhorn-system"},
		// The installer reads and watches its own DaemonSet, its namespace
		// and its node (does the chart still stand in here?).
		{installer, "get", "apps", "daemonsets", ns}, {installer, "watch", "apps", "daemonsets", ns},
		{installer, "get", core, "namespaces", ""}, {installer, "watch", core, "namespaces", ""},
		{installer, "get", core, "nodes", ""}, {installer, "list", core, "nodes", ""}, {installer, "watch", core, "nodes", ""},
		// The node agent, as itself: pools and reservations (read, watched,
		// written by guarded patches, created), whereabouts' Lease.
		{agent, "get", wb, "ippools", "kube-system"}, {agent, "list", wb, "ippools", "kube-system"},
		{agent, "watch", wb, "ippools", "kube-system"}, {agent, "create", wb, "ippools", "kube-system"},
		{agent, "patch", wb, "ippools", "kube-system"},
		{agent, "get", wb, "overlappingrangeipreservations", "kube-system"}, {agent, "list", wb, "overlappingrangeipreservations", "kube-system"},
		{agent, "watch", wb, "overlappingrangeipreservations", "kube-system"}, {agent, "create", wb, "overlappingrangeipreservations", "kube-system"},
		{agent, "patch", wb, "overlappingrangeipreservations", "kube-system"}, {agent, "delete", wb, "overlappingrangeipreservations", "kube-system"},
		{agent, "get", "coordination.k8s.io", "leases", "kube-system"}, {agent, "update", "coordination.k8s.io", "leases", "kube-system"},
		{agent, "create", "coordination.k8s.io", "leases", "kube-system"},
		// rbac.diagnostics: the DaemonSet's pods run the reconciler for an
		// operator's kubectl exec, with the reconciler's permissions.
		{installer, "get", core, "pods", ns}, {installer, "list", core, "pods", ""}, {installer, "list", core, "nodes", ""},
		{installer, "get", wb, "ippools", "kube-system"}, {installer, "patch", wb, "ippools", "kube-system"},
		{installer, "delete", wb, "overlappingrangeipreservations", "kube-system"},
		{installer, "list", "k8s.cni.cncf.io", "network-attachment-definitions", ""},
		{installer, "create", core, "events", "kube-system"},
	}
	denied := []q{
		{plugin, "create", wb, "ippools", "kube-system"}, {plugin, "delete", wb, "ippools", "kube-system"},
		{plugin, "get", wb, "ippools", "default"}, {plugin, "delete", "coordination.k8s.io", "leases", "kube-system"},
		{plugin, "get", "coordination.k8s.io", "leases", "default"},
		{plugin, "create", wb, "overlappingrangeipreservations", "kube-system"}, {plugin, "list", core, "pods", ""},
		{plugin, "get", core, "secrets", "kube-system"},
		{reconciler, "create", wb, "ippools", "kube-system"}, {reconciler, "delete", wb, "ippools", "kube-system"}, // reconciler.deleteOrphanedPools=false
		{reconciler, "create", wb, "overlappingrangeipreservations", "kube-system"},
		{reconciler, "update", "k8s.cni.cncf.io", "network-attachment-definitions", "harvester-system"}, // no NAD is ever edited
		{reconciler, "delete", core, "pods", "longhorn-system"}, {reconciler, "update", core, "nodes", ""},
		{reconciler, "get", core, "secrets", "kube-system"}, {reconciler, "list", core, "secrets", ""},
		{reconciler, "update", core, "events", "longhorn-system"}, {reconciler, "delete", core, "events", "longhorn-system"},
		{installer, "list", core, "secrets", ns}, {installer, "delete", wb, "ippools", "kube-system"},
		{installer, "delete", core, "pods", ns},
		{installer, "list", "apps", "daemonsets", ns}, {installer, "delete", "apps", "daemonsets", ns},
		{installer, "get", "apps", "daemonsets", "kube-system"},
		{agent, "delete", wb, "ippools", "kube-system"}, {agent, "update", wb, "ippools", "kube-system"},
		{agent, "get", wb, "ippools", "default"}, {agent, "delete", "coordination.k8s.io", "leases", "kube-system"},
		{agent, "list", core, "pods", ""}, {agent, "get", core, "secrets", "kube-system"}, {agent, "get", "apps", "daemonsets", ns},
		{installer, "update", core, "nodes", ""}, {installer, "delete", core, "namespaces", ""},
		{installer, "get", core, "namespaces", "other"},
	}
	can := func(x q) bool {
		user := strings.Split(x.user, ":")
		name := ""
		if x.resource == "leases" && x.verb != "create" {
			name = "whereabouts" // the one Lease the Roles name
		}
		if x.resource == "daemonsets" && x.verb != "list" {
			name = release + "-harvester-ipam" // the installer's own, the one its Role names
		}
		if x.resource == "namespaces" {
			name = ns // the installer's own, the one its ClusterRole names
			if x.namespace != "" {
				name = x.namespace // another
			}
			x.namespace = ""
		}
		sar, err := rig.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx(t), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   x.user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + user[2], "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: x.verb, Group: x.group, Resource: x.resource, Namespace: x.namespace, Name: name,
				},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		return sar.Status.Allowed
	}
	// The API server's RBAC authorizer sees new bindings through its
	// informers, moments after they are stored: wait as one would re-run
	// `kubectl auth can-i`. The denials are asked once all grants are seen.
	for _, x := range allowed {
		assert.Eventually(t, func() bool { return can(x) }, 10*time.Second, 50*time.Millisecond,
			"%s may %s %s in %q", x.user, x.verb, x.resource, x.namespace)
	}
	for _, x := range denied {
		assert.False(t, can(x), "%s may not %s %s in %q", x.user, x.verb, x.resource, x.namespace)
	}

	// The plugin for real: ADD as admin (whereabouts needs more than this
	// chart grants: leases, creating pools), then the NAD is gone and DEL runs
	// logged in as whereabouts' identity: harvester-ipam itself releases.
	for _, tt := range []struct {
		sa     string
		bound  bool
		expect string
	}{
		{wbSA, true, ""},
		{"rbac-check-nobody", false, `"system:serviceaccount:kube-system:rbac-check-nobody" cannot get`},
	} {
		t.Run(tt.sa, func(t *testing.T) {
			kc := filepath.Join(t.TempDir(), "whereabouts.kubeconfig")
			admin, err := os.ReadFile(rig.Kubeconfig)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(kc, admin, 0o600))
			n, err := rig.AddNetworkWithFlatFile(nextNetwork(), kc)
			require.NoError(t, err)
			pod := testcni.Pod{Namespace: "longhorn-system", Name: "instance-manager-" + tt.sa}
			s := add(t, n, pod)

			as, err := rig.ServiceAccountKubeconfig(ctx(t), "kube-system", tt.sa)
			require.NoError(t, err)
			loggedIn(t, as)
			require.NoError(t, os.WriteFile(kc, as, 0o600))
			require.NoError(t, n.ForgetIPAM())
			err = s.Del(ctx(t))
			if tt.bound {
				require.NoError(t, err, "DEL as %s with this chart's Role", tt.sa)
				assert.Empty(t, testcni.Of(mustAllocs(t, n), pod.Ref()), "released")
				assert.Empty(t, oripsOf(t, n, pod.Ref()), "its reservation too")
				return
			}
			var ce *testcni.CNIError
			require.ErrorAs(t, err, &ce, "DEL as %s without this chart's Role", tt.sa)
			assert.Equal(t, 1, ce.Exit)
			assert.Contains(t, ce.Stderr, tt.expect)
			assert.Contains(t, ce.Stderr, `cannot get resource "ippools"`)
			assert.Contains(t, ce.Stderr, "the runtime retries")
			assert.Len(t, testcni.Of(mustAllocs(t, n), pod.Ref()), 1, "nothing released")
		})
	}
}

// loggedIn waits until the API server accepts a kubeconfig's token: a new
// ServiceAccount's token is refused (401) until the authenticator's informer
// has seen the account.
func loggedIn(t *testing.T, kubeconfig []byte) {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	require.NoError(t, err)
	kc, err := kubernetes.NewForConfig(rc)
	require.NoError(t, err)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx(t), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "the token is not accepted after 10 s: %v", err)
	}
}

// nextNetwork is a network with a /24 of its own, not yet added.
func nextNetwork() testcni.Network {
	i := subnet.Add(1)
	return testcni.Network{Name: fmt.Sprintf("sn%d", i), Range: fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250)}
}

// container runs what the rendered DaemonSet's container runs, with its
// hostPath volumes under a host root of the test's own and its image's
// /usr/bin in a dir of the test's own.
type container struct {
	image, host string
	mounts      map[string]string // mountPath -> hostPath
	command     []string
	args        []string
	probe       []string
	env         []string // what the chart's downward API gives the container (its probes too)
}

func (c *container) path(p string) string {
	if rest, ok := strings.CutPrefix(p, "/usr/bin/"); ok {
		return filepath.Join(c.image, rest)
	}
	for mount, hostPath := range c.mounts {
		if rest, ok := strings.CutPrefix(p, mount); ok {
			return filepath.Join(c.host, hostPath, rest)
		}
	}
	return p
}

// cmd maps every absolute path in argv (and in --flag=value) into the test's dirs.
func (c *container) cmd(argv []string, extra ...string) *exec.Cmd {
	var out []string
	for _, a := range append(append([]string{}, argv...), extra...) {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			out = append(out, k+"="+c.path(v))
		} else {
			out = append(out, c.path(a))
		}
	}
	cmd := exec.Command(out[0], out[1:]...)
	cmd.Env = append(os.Environ(), c.env...)
	return cmd
}

type run struct {
	exit           int
	stdout, stderr string
}

func (c *container) run(t *testing.T, argv []string, extra ...string) run {
	t.Helper()
	cmd := c.cmd(argv, extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := run{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.exit = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return r
}

func daemonSetContainer(t *testing.T, objs []unstructured.Unstructured) *container {
	t.Helper()
	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
	spec := ds.Spec.Template.Spec
	// The installer, and (rbac.diagnostics) the idle container an operator
	// runs the reconciler in, which mounts nothing of the host.
	require.NotEmpty(t, spec.Containers)
	ctr := spec.Containers[0]
	require.Equal(t, "install", ctr.Name)
	for _, other := range spec.Containers[1:] {
		require.Equal(t, "diagnostics", other.Name)
		require.Empty(t, other.VolumeMounts)
	}
	c := &container{image: t.TempDir(), host: t.TempDir(), mounts: map[string]string{},
		command: ctr.Command, args: ctr.Args, probe: ctr.ReadinessProbe.Exec.Command}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range ctr.VolumeMounts {
		v, ok := vols[m.Name]
		require.True(t, ok && v.HostPath != nil, "mount %s is a hostPath volume", m.Name)
		c.mounts[m.MountPath] = v.HostPath.Path
		require.NoError(t, os.MkdirAll(filepath.Join(c.host, v.HostPath.Path), 0o755))
	}
	return c
}

func sha(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return sha256.Sum256(b)
}

// inoOr0 is the inode at p, 0 when there is none (a name being replaced).
func inoOr0(p string) uint64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	require.NoError(t, os.WriteFile(dst, b, 0o755))
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The DaemonSet's container, run as the chart renders it, against a host's
// CNI dirs whereabouts' own install step (its install-cni.sh) set up: it
// installs harvester-ipam beside whereabouts and stands in at whereabouts'
// name, becomes ready, and the binary it installed serves a real ADD and DEL
// through both names. whereabouts' install step run again (its pod
// restarted, then an upgrade to v0.9.4) is undone within a second; SIGTERM
// gives the name back byte for byte. Run again it changes nothing; with a new
// image it upgrades; with a broken image, or a full disk, it fails loudly and
// the node keeps the old, working binary.
//
// Not through the node agent: its subject is the binaries at their names;
// the ADD and DEL only show that what it installed runs (the agent's are
// the matrix's, onEach).
func TestInstallerAsTheDaemonSetRunsIt(t *testing.T) {
	// The DaemonSet, its installer's account, Role and binding, stored for
	// real (no kubelet runs it here): the container reads its DaemonSet with
	// that account's token when it stops.
	const ns = "installer-e2e"
	require.NoError(t, rig.EnsureNamespace(ctx(t), ns))
	objs := objects(t, render(t, "harvester-ipam", ns))
	var own []byte
	for _, o := range objs {
		if o.GetName() == "harvester-ipam" && o.GetKind() == "DaemonSet" || o.GetName() == "harvester-ipam-installer" {
			b, err := o.MarshalJSON()
			require.NoError(t, err)
			own = append(append(own, b...), '\n')
		}
	}
	require.NoError(t, rig.Apply(ctx(t), own, false))
	kc, err := rig.ServiceAccountKubeconfig(ctx(t), ns, "harvester-ipam-installer")
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "installer.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, kc, 0o600))
	c := daemonSetContainer(t, objs)
	c.env = []string{"POD_NAMESPACE=" + ns, "POD_NAME=harvester-ipam-e2e"} // the chart's downward API (no node here)
	require.NoError(t, rig.BuildCommand(ctx(t), "./cmd/harvester-ipam-install", c.path("/usr/bin/harvester-ipam-install"), "-s -w"))
	copyFile(t, rig.PluginBinary(), c.path("/usr/bin/harvester-ipam"))
	binDir := c.path("/host/opt/cni/bin")
	require.Equal(t, filepath.Join(c.host, "opt/cni/bin"), binDir, "the chart mounts the host's /opt/cni/bin at /host/opt/cni/bin")
	installed := filepath.Join(binDir, "harvester-ipam")
	// The host as whereabouts' own DaemonSet leaves it: its install step run.
	target, err := filepath.EvalSymlinks(filepath.Join(rig.CNIDir(testcni.V093), "bridge"))
	require.NoError(t, err)
	copyFile(t, target, filepath.Join(binDir, "bridge"))
	out, err := rig.RunWhereaboutsInstall(ctx(t), testcni.V093, binDir, c.path("/host/etc/cni/net.d"))
	require.NoError(t, err, out)
	v093 := sha(t, rig.Tools["whereabouts-v0.9.3"])
	require.Equal(t, v093, sha(t, filepath.Join(binDir, "whereabouts")), "whereabouts' install step put its binary at its name")
	copyFile(t, rig.FlatFile, c.path("/host/etc/cni/net.d/whereabouts.d/whereabouts.conf"))
	name, aside := filepath.Join(binDir, "whereabouts"), filepath.Join(binDir, "whereabouts.real")

	// Not ready before it ran.
	r := c.run(t, c.probe)
	assert.Equal(t, 1, r.exit, "readiness before install: %s", r.stderr)

	// The container's main loop: ready once installed; SIGTERM ends it, the
	// binary stays; the stand-in's name is given back only on an uninstall.
	start := func(kubeconfig string) (stop func() string, logsNow func() string) {
		cmd := c.cmd(append(c.command, c.args...), "--kubeconfig="+kubeconfig)
		var logs syncBuffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		began := time.Now()
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		for {
			if r := c.run(t, c.probe); r.exit == 0 {
				assert.Contains(t, r.stdout, installed+" is installed and runs: harvester-ipam")
				assert.Contains(t, r.stdout, "harvester-ipam stands in at "+filepath.Join(binDir, "whereabouts"))
				break
			}
			select {
			case err := <-done:
				t.Fatalf("the installer exited before it was ready: %v\n%s", err, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
			require.Less(t, time.Since(began), 30*time.Second, "not ready after 30 s:\n%s", logs.String())
		}
		return func() string {
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case err := <-done:
				require.NoError(t, err, "exit status on SIGTERM:\n%s", logs.String())
			case <-time.After(30 * time.Second): // terminationGracePeriodSeconds
				_ = cmd.Process.Kill()
				t.Fatalf("no exit within the grace period:\n%s", logs.String())
			}
			return logs.String()
		}, logs.String
	}
	stop, _ := start(kubeconfig)
	self := sha(t, rig.PluginBinary())
	assert.Equal(t, self, sha(t, name), "harvester-ipam stands in at whereabouts' name")
	assert.Equal(t, v093, sha(t, aside), "the real whereabouts aside, byte for byte")

	// What it installed serves the runtime, from the host's bin dir: a NAD
	// naming whereabouts, as Harvester writes it, and one naming harvester-ipam.
	for _, ipam := range []string{testcni.StandIn, testcni.Named} {
		n := network(t, testcni.Network{IPAM: ipam})
		pod := testcni.Pod{Namespace: "longhorn-system", Name: "instance-manager-installed-" + ipam}
		var last *testcni.Sandbox
		for i := 0; i < 3; i++ { // a crash loop: each sandbox dies without DEL
			if last != nil {
				require.NoError(t, last.Kill())
			}
			s, err := rig.NewSandbox(n, pod, "lhnet1")
			require.NoError(t, err)
			s.Env = []string{"CNI_PATH=" + binDir}
			require.NoError(t, s.Add(ctx(t)), "ADD through the installed binary (%s)", ipam)
			last = s
		}
		require.Len(t, testcni.Of(mustAllocs(t, n), pod.Ref()), 1, "%s: one address after a crash loop", ipam)
		require.NoError(t, last.Del(ctx(t)))
		require.Empty(t, testcni.Of(mustAllocs(t, n), pod.Ref()))
	}

	// whereabouts' pod restarts (its install step runs again), then an
	// upgrade to v0.9.4: each time harvester-ipam stands in again at once.
	for _, v := range []string{testcni.V093, testcni.V094} {
		// whereabouts' cp writes into the file at the name (or replaces
		// it); standing in again puts another file there, harvester-ipam.
		standing, checked := [2]uint64{ino(t, name), ino(t, aside)}, [2]uint64{}
		out, err := rig.RunWhereaboutsInstall(ctx(t), v, binDir, c.path("/host/etc/cni/net.d"))
		require.NoError(t, err, out)
		wrote, want := time.Now(), sha(t, rig.Tools["whereabouts-"+v])
		// Standing in again is the name harvester-ipam and the binary the
		// install step wrote aside (two stats a poll; the bytes only when a
		// name holds another file). How long it took is logged, not
		// asserted.
		for {
			if cur := [2]uint64{inoOr0(name), inoOr0(aside)}; cur != standing && cur != checked {
				if checked = cur; sha(t, name) == self && sha(t, aside) == want {
					break
				}
			}
			require.Less(t, time.Since(wrote), 30*time.Second, "harvester-ipam does not stand in again after whereabouts %s's install step", v)
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(wrote)
		assert.Equal(t, self, sha(t, name), "harvester-ipam at the name again")
		assert.Equal(t, sha(t, rig.Tools["whereabouts-"+v]), sha(t, aside), "whereabouts %s aside", v)
		t.Logf("whereabouts %s's install step run again: harvester-ipam stands in again after %s", v, took.Round(time.Millisecond))
	}
	n := network(t, testcni.Network{})
	pod := testcni.Pod{Namespace: "longhorn-system", Name: "instance-manager-upgraded"}
	s1, err := rig.NewSandbox(n, pod, "lhnet1")
	require.NoError(t, err)
	s1.Env = []string{"CNI_PATH=" + binDir}
	require.NoError(t, s1.Add(ctx(t)))
	require.NoError(t, s1.Kill())
	s2, err := rig.NewSandbox(n, pod, "lhnet1")
	require.NoError(t, err)
	s2.Env = []string{"CNI_PATH=" + binDir}
	require.NoError(t, s2.Add(ctx(t)), "ADD through harvester-ipam -> whereabouts v0.9.4")
	require.Len(t, testcni.Of(mustAllocs(t, n), pod.Ref()), 1, "the next ADD reclaims")
	require.NoError(t, s2.Del(ctx(t)))
	poolsBefore := mustAllocs(t, n)

	v094 := sha(t, rig.Tools["whereabouts-v0.9.4"])
	// The stand-in's record (which release took the name) and the release's
	// lock (an installer of it runs here), beside the binaries.
	const record, alive = ".harvester-ipam.owner.whereabouts", ".harvester-ipam.alive.installer-e2e.harvester-ipam"
	standsIn := func(when string) {
		t.Helper()
		assert.Equal(t, self, sha(t, name), "%s: harvester-ipam stands in", when)
		assert.Equal(t, v094, sha(t, aside), "%s: the real whereabouts aside", when)
		assert.Equal(t, []string{alive, record, "bridge", "harvester-ipam", "whereabouts", "whereabouts.real"}, dirNames(t, binDir), "%s: no temporary file left", when)
	}

	// A restart, a rollout or a node's shutdown: its DaemonSet is in place.
	logs := stop()
	t.Logf("the DaemonSet's container, stopped with its DaemonSet in place:\n%s", logs)
	assert.Contains(t, logs, "installed "+installed)
	assert.Contains(t, logs, "stays installed")
	assert.Contains(t, logs, "DaemonSet installer-e2e/harvester-ipam is in place and stands in here (a restart, an upgrade, a node's shutdown or a force-deleted pod): harvester-ipam keeps standing in at "+name)
	assert.NotContains(t, logs, "gave ")
	assert.NotContains(t, logs, "warning", "whereabouts and its flat file are in place")
	standsIn("stopped with its DaemonSet in place")

	// The API server cannot be reached when it stops: it cannot tell, so it keeps.
	unreachable := filepath.Join(t.TempDir(), "unreachable.kubeconfig")
	cfg, err := clientcmd.Load(kc)
	require.NoError(t, err)
	for _, cl := range cfg.Clusters {
		cl.Server = "https://127.0.0.1:1" // nothing listens there
	}
	require.NoError(t, clientcmd.WriteToFile(*cfg, unreachable))
	stopUnreachable, _ := start(unreachable)
	logs = stopUnreachable()
	assert.Contains(t, logs, "DaemonSet installer-e2e/harvester-ipam could not be read")
	assert.Contains(t, logs, "so this may be a restart: harvester-ipam keeps standing in at "+name)
	standsIn("stopped with the API server unreachable")

	// Its reads refused when it stops (a force-deleted pod's token, an
	// uninstall's deleted role): what its watch saw decides. Here its
	// binding goes (every read of it is refused from then on) while its
	// watch, opened before, runs on.
	unbind := func() {
		require.NoError(t, rig.Kube.RbacV1().RoleBindings(ns).Delete(ctx(t), "harvester-ipam-installer", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool {
			sar, err := rig.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx(t), &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "system:serviceaccount:" + ns + ":harvester-ipam-installer", Groups: []string{"system:serviceaccounts"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Group: "apps", Resource: "daemonsets", Namespace: ns, Name: "harvester-ipam"}}}, metav1.CreateOptions{})
			return err == nil && !sar.Status.Allowed
		}, 10*time.Second, 50*time.Millisecond, "the API server sees the binding gone")
	}
	watching := func(logs func() string) {
		require.Eventually(t, func() bool { return strings.Contains(logs(), "watching DaemonSet installer-e2e/harvester-ipam") },
			30*time.Second, 50*time.Millisecond, "the installer watches its DaemonSet")
	}
	stop, logsNow := start(kubeconfig)
	watching(logsNow)
	unbind()
	logs = stop()
	t.Logf("the DaemonSet's container, stopped with its reads refused, its DaemonSet in place:\n%s", logs)
	assert.Contains(t, logs, "DaemonSet installer-e2e/harvester-ipam could not be read now")
	assert.Contains(t, logs, "as last seen, it stands in here (a force-deleted pod, a restart): harvester-ipam keeps standing in at "+name)
	standsIn("stopped with its reads refused, its DaemonSet in place")
	require.NoError(t, rig.Apply(ctx(t), own, false))

	// helm uninstall as it goes: the DaemonSet deleted, its role and account
	// after it, and only then its pods stopped. The reads are refused; the
	// watch saw the DaemonSet go.
	stop, logsNow = start(kubeconfig)
	watching(logsNow)
	require.NoError(t, rig.Kube.AppsV1().DaemonSets(ns).Delete(ctx(t), "harvester-ipam", metav1.DeleteOptions{}))
	unbind()
	logs = stop()
	t.Logf("the DaemonSet's container, stopped with its DaemonSet deleted and its reads refused:\n%s", logs)
	assert.Contains(t, logs, "DaemonSet installer-e2e/harvester-ipam could not be read now")
	assert.Contains(t, logs, "as last seen, its DaemonSet is gone: the chart no longer stands in here, so "+name+" goes back to the real binary")
	assert.Contains(t, logs, "gave "+name+" back to the real binary")
	assert.Equal(t, v094, sha(t, name), "uninstalled: the real whereabouts at its name, byte for byte")
	assert.Equal(t, []string{"bridge", "harvester-ipam", "whereabouts"}, dirNames(t, binDir), "no aside, record, lock or temporary file left")

	// helm uninstall, read as it is: the DaemonSet is gone when its pods stop.
	require.NoError(t, rig.Apply(ctx(t), own, false))
	stop, _ = start(kubeconfig)
	standsIn("standing in again")
	require.NoError(t, rig.Kube.AppsV1().DaemonSets(ns).Delete(ctx(t), "harvester-ipam", metav1.DeleteOptions{}))
	logs = stop()
	t.Logf("the DaemonSet's container, stopped with its DaemonSet deleted:\n%s", logs)
	assert.Contains(t, logs, "DaemonSet installer-e2e/harvester-ipam is gone: the chart no longer stands in here, so "+name+" goes back to the real binary")
	assert.Contains(t, logs, "gave "+name+" back to the real binary")
	assert.Equal(t, sha(t, rig.PluginBinary()), sha(t, installed))
	assert.Equal(t, v094, sha(t, name), "uninstalled: the real whereabouts at its name, byte for byte")
	assert.Equal(t, []string{"bridge", "harvester-ipam", "whereabouts"}, dirNames(t, binDir), "no aside, record, lock or temporary file left")
	assert.Equal(t, poolsBefore, mustAllocs(t, n), "the pool as it was")

	once := func(extra ...string) run {
		return c.run(t, append(c.command, c.args...), append([]string{"--interval=0"}, extra...)...)
	}

	// Again: nothing to do, the very same file.
	before := ino(t, installed)
	r = once()
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stderr, installed+" is up to date")
	assert.Equal(t, before, ino(t, installed))

	// A new image: replaced by rename.
	require.NoError(t, rig.BuildCommand(ctx(t), "./cmd/harvester-ipam", c.path("/usr/bin/harvester-ipam"), "-s -w -X main.Version=v9.9.9-test"))
	r = once()
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stderr, "installed "+installed+" (harvester-ipam v9.9.9-test: ")
	assert.NotEqual(t, before, ino(t, installed))
	good := sha(t, installed)
	require.Equal(t, 0, c.run(t, c.probe).exit)

	// A broken image (a truncated binary): refused, the old binary stays.
	img, err := os.ReadFile(c.path("/usr/bin/harvester-ipam"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(c.path("/usr/bin/harvester-ipam"), img[:len(img)/3], 0o755))
	r = once()
	assert.Equal(t, 1, r.exit)
	assert.Contains(t, r.stderr, "the new binary does not run")
	assert.Contains(t, r.stderr, installed+" left as it was")
	assert.Equal(t, good, sha(t, installed))
	assert.Equal(t, []string{record, "bridge", "harvester-ipam", "whereabouts", "whereabouts.real"}, dirNames(t, binDir), "no temporary file left")
	r = c.run(t, c.probe)
	assert.Equal(t, 1, r.exit, "not ready with a broken image")
	assert.Contains(t, r.stderr, "is not the image's")
	require.NoError(t, os.WriteFile(c.path("/usr/bin/harvester-ipam"), img, 0o755))

	// A full disk: the host's bin dir on a tmpfs with room for the old binary only.
	full := filepath.Join(t.TempDir(), "full")
	require.NoError(t, os.MkdirAll(full, 0o755))
	old, err := os.ReadFile(rig.PluginBinary())
	require.NoError(t, err)
	require.NoError(t, syscall.Mount("tmpfs", full, "tmpfs", 0, fmt.Sprintf("size=%d", len(old)+256<<10)))
	t.Cleanup(func() { _ = syscall.Unmount(full, 0) })
	require.NoError(t, os.WriteFile(filepath.Join(full, "harvester-ipam"), old, 0o755))
	r = once("--cni-bin-dir=" + full)
	assert.Equal(t, 1, r.exit)
	assert.Contains(t, r.stderr, "no space left on device")
	assert.Contains(t, r.stderr, filepath.Join(full, "harvester-ipam")+" left as it was")
	assert.Equal(t, sha256.Sum256(old), sha(t, filepath.Join(full, "harvester-ipam")))
	assert.Equal(t, []string{"harvester-ipam"}, dirNames(t, full), "no temporary file left")

	// whereabouts missing on a node: installed all the same, with a warning.
	empty := t.TempDir()
	r = once("--cni-bin-dir="+empty, "--flat-file="+filepath.Join(empty, "whereabouts.conf"))
	require.Equal(t, 0, r.exit, r.stderr)
	assert.Contains(t, r.stderr, "warning: no executable whereabouts in "+empty)
	assert.Contains(t, r.stderr, "warning: no whereabouts flat file")
}
