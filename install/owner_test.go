package install

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// chartDaemonSet is the installer's DaemonSet as the chart renders it:
// standing in for name (none when ""), the bin dir at hostDir.
func chartDaemonSet(name, hostDir string) *appsv1.DaemonSet {
	args := []string{"--source=/usr/bin/harvester-ipam", "--cni-bin-dir=/host/opt/cni/bin", "--interval=1m"}
	if name != "" {
		args = append(args, "--stand-in="+name, "--daemonset=harvester-ipam")
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "harvester-ipam"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
			Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "install", Command: []string{"/usr/bin/harvester-ipam-install"}, Args: args,
				VolumeMounts: []corev1.VolumeMount{{Name: "cni-bin", MountPath: "/host/opt/cni/bin"}, {Name: "cni-conf", MountPath: "/host/etc/cni/net.d"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "cni-bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir}}},
				{Name: "cni-conf", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d"}}},
			},
		}}},
	}
}

func linuxNode(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	l := map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/hostname": name}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: corev1.NodeSpec{Taints: taints}}
}

var here = Place{Name: "whereabouts", HostDir: "/opt/cni/bin", Node: "node-1"}

// The chart stands in on this node exactly while its DaemonSet's newest
// revision runs an installer standing in at this name, in this dir, on
// this node, and neither it nor its namespace is being deleted.
func TestJudge(t *testing.T) {
	deleted := &metav1.Time{Time: time.Unix(1e9, 0)}
	with := func(f func(ds *appsv1.DaemonSet)) *appsv1.DaemonSet {
		ds := chartDaemonSet("whereabouts", "/opt/cni/bin")
		f(ds)
		return ds
	}
	affinity := func(terms ...corev1.NodeSelectorTerm) func(ds *appsv1.DaemonSet) {
		return func(ds *appsv1.DaemonSet) {
			ds.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
		}
	}
	expr := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}
	}
	node := linuxNode("node-1", map[string]string{"storage": "yes", "cores": "8"})
	noExecute := func(key string) corev1.Taint {
		return corev1.Taint{Key: key, Value: "x", Effect: corev1.TaintEffectNoExecute}
	}
	tests := []struct {
		name     string
		ds       *appsv1.DaemonSet
		ns       *corev1.Namespace
		node     *corev1.Node
		standsIn bool
		why      string
	}{
		{"in place", chartDaemonSet("whereabouts", "/opt/cni/bin"), nil, node, true, "still stands in for whereabouts here"},
		{"node and namespace not read", chartDaemonSet("whereabouts", "/opt/cni/bin"), nil, nil, true, "still stands in"},
		{"gone", nil, nil, node, false, "its DaemonSet is gone"},
		{"being deleted", with(func(ds *appsv1.DaemonSet) { ds.DeletionTimestamp = deleted }), nil, node, false, "is being deleted"},
		{"its namespace being deleted", chartDaemonSet("whereabouts", "/opt/cni/bin"),
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", DeletionTimestamp: deleted}}, node, false, "its namespace kube-system is being deleted"},
		{"its namespace in place", chartDaemonSet("whereabouts", "/opt/cni/bin"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}, node, true, ""},
		{"the stand-in turned off", chartDaemonSet("", "/opt/cni/bin"), nil, node, false, "no longer stands in (its installer runs without --stand-in)"},
		{"another name", chartDaemonSet("whereabouts-v2", "/opt/cni/bin"), nil, node, false, "stands in for whereabouts-v2 now, not whereabouts"},
		{"another bin dir", chartDaemonSet("whereabouts", "/var/lib/rancher/rke2/data/cni/bin"), nil, node, false, "stands in in /var/lib/rancher/rke2/data/cni/bin now, not /opt/cni/bin"},
		{"the same bin dir, spelt otherwise", chartDaemonSet("whereabouts", "/opt/cni/bin/"), nil, node, true, ""},
		{"nodeSelector no longer matches", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["storage"] = "no" }), nil, node, false, "no longer runs on node node-1 (nodeSelector storage=no)"},
		{"nodeSelector on a label the node lacks", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["gpu"] = "" }), nil, node, false, "nodeSelector gpu="},
		{"nodeSelector matches", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["storage"] = "yes" }), nil, node, true, ""},
		{"bound to another node", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeName = "node-2" }), nil, node, false, "bound to node node-2"},
		{"bound to this node", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeName = "node-1" }), nil, node, true, ""},
		{"affinity In, matching", with(affinity(expr("storage", corev1.NodeSelectorOpIn, "yes", "maybe"))), nil, node, true, ""},
		{"affinity In, not matching", with(affinity(expr("storage", corev1.NodeSelectorOpIn, "no"))), nil, node, false, "required node affinity"},
		{"affinity NotIn", with(affinity(expr("storage", corev1.NodeSelectorOpNotIn, "yes"))), nil, node, false, "required node affinity"},
		{"affinity Exists", with(affinity(expr("storage", corev1.NodeSelectorOpExists))), nil, node, true, ""},
		{"affinity DoesNotExist", with(affinity(expr("storage", corev1.NodeSelectorOpDoesNotExist))), nil, node, false, "required node affinity"},
		{"affinity Gt", with(affinity(expr("cores", corev1.NodeSelectorOpGt, "4"))), nil, node, true, ""},
		{"affinity Lt", with(affinity(expr("cores", corev1.NodeSelectorOpLt, "4"))), nil, node, false, "required node affinity"},
		{"affinity, an unknown operator", with(affinity(expr("storage", "Near", "yes"))), nil, node, false, "required node affinity"},
		{"affinity terms are ORed", with(affinity(expr("storage", corev1.NodeSelectorOpIn, "no"), expr("cores", corev1.NodeSelectorOpIn, "8"))), nil, node, true, ""},
		{"an empty term matches no node", with(affinity(corev1.NodeSelectorTerm{})), nil, node, false, "required node affinity"},
		{"affinity on the node's name", with(affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-1"}}}})), nil, node, false, "required node affinity"},
		{"affinity on another node's name", with(affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}}})), nil, node, true, ""},
		{"an untolerated NoExecute taint", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.Tolerations = nil }),
			nil, linuxNode("node-1", nil, noExecute("maintenance")), false, "taint maintenance=x:NoExecute is not tolerated"},
		{"a NoSchedule taint keeps a pod that runs", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.Tolerations = nil }),
			nil, linuxNode("node-1", nil, corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoSchedule}), true, ""},
		{"not ready: every daemon pod tolerates it", with(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.Tolerations = nil }),
			nil, linuxNode("node-1", nil, noExecute(corev1.TaintNodeNotReady), noExecute(corev1.TaintNodeUnreachable)), true, ""},
		{"a tolerated NoExecute taint (the chart tolerates all)", chartDaemonSet("whereabouts", "/opt/cni/bin"), nil, linuxNode("node-1", nil, noExecute("maintenance")), true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Judge(tt.ds, tt.ns, tt.node, here)
			assert.Equal(t, tt.standsIn, v.StandsIn, v.Why)
			assert.Contains(t, v.Why, tt.why)
		})
	}
	// The installer's own --host-cni-bin-dir spelt otherwise is the same dir.
	spelt := here
	spelt.HostDir = "/opt//cni/bin/"
	assert.True(t, Judge(chartDaemonSet("whereabouts", "/opt/cni/bin"), nil, node, spelt).StandsIn)
}

// What a template stands in for, and where on the host, however its flags
// are spelt and its volumes mounted.
func TestStandsInAt(t *testing.T) {
	spec := func(args []string, mounts []corev1.VolumeMount, hostPath string) corev1.PodSpec {
		return corev1.PodSpec{
			Containers: []corev1.Container{{Name: "other", Args: []string{"--stand-in=nothing"}},
				{Name: "install", Command: []string{"/usr/bin/harvester-ipam-install"}, Args: args, VolumeMounts: mounts}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostPath}}},
				{Name: "empty", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		}
	}
	tests := []struct {
		name          string
		spec          corev1.PodSpec
		stand, hostAt string
	}{
		{"the chart's", spec([]string{"--cni-bin-dir=/host/opt/cni/bin", "--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt/cni/bin"}}, "/opt/cni/bin"), "whereabouts", "/opt/cni/bin"},
		{"flags with one dash, values apart", spec([]string{"-cni-bin-dir", "/host/opt/cni/bin", "-stand-in", "whereabouts"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt/cni/bin"}}, "/opt/cni/bin"), "whereabouts", "/opt/cni/bin"},
		{"the last flag wins", spec([]string{"--stand-in=a", "--stand-in=b"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt/cni/bin"}}, "/opt/cni/bin"), "b", "/opt/cni/bin"},
		{"the default bin dir, the host's /opt mounted", spec([]string{"--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt"}}, "/opt"), "whereabouts", "/opt/cni/bin"},
		{"the deeper mount wins", spec([]string{"--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "empty", MountPath: "/host"}, {Name: "host", MountPath: "/host/opt/cni/bin"}}, "/srv/bin"), "whereabouts", "/srv/bin"},
		{"the deeper mount wins, listed first", spec([]string{"--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt/cni/bin/"}, {Name: "empty", MountPath: "/host"}}, "/srv/bin"), "whereabouts", "/srv/bin"},
		{"a mount beside it, not above it", spec([]string{"--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "empty", MountPath: "/host/opt/cni/bin2"}, {Name: "host", MountPath: "/host/opt"}}, "/opt"), "whereabouts", "/opt/cni/bin"},
		{"not a hostPath", spec([]string{"--stand-in=whereabouts"}, []corev1.VolumeMount{{Name: "empty", MountPath: "/host/opt/cni/bin"}}, "/opt/cni/bin"), "whereabouts", ""},
		{"no stand-in", spec([]string{"--cni-bin-dir=/host/opt/cni/bin"}, []corev1.VolumeMount{{Name: "host", MountPath: "/host/opt/cni/bin"}}, "/opt/cni/bin"), "", "/opt/cni/bin"},
		{"no installer", corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Args: []string{"--stand-in=whereabouts"}}}}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, dir := StandsInAt(tt.spec)
			assert.Equal(t, tt.stand, name)
			assert.Equal(t, tt.hostAt, dir)
		})
	}
}

// watching fakes what the watches last saw (nil: gone); a key missing is a
// watch that has not listed yet.
func watching(o *Owner, seen map[string]any) {
	o.watches = map[string]*watched{}
	for what, obj := range seen {
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		if obj != nil {
			_ = store.Add(obj)
		}
		o.watches[what] = &watched{store: store, synced: func() bool { return true }}
	}
}

// A stop gives the name back only when the chart no longer stands in here,
// as read now or, when a read is refused (a force-deleted pod's token, an
// uninstall's deleted account or role), as the watches last saw it. A
// restart, a rollout, a shutdown, a force-deleted pod, or a chart that
// cannot be read at all keeps it.
func TestRemoving(t *testing.T) {
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	present := chartDaemonSet("whereabouts", "/opt/cni/bin")
	deleting := chartDaemonSet("whereabouts", "/opt/cni/bin")
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1e9, 0)}
	off := chartDaemonSet("", "/opt/cni/bin")
	notFound := apierrors.NewNotFound(gr, "harvester-ipam")
	unauthorized := apierrors.NewUnauthorized("token refused")
	forbidden := apierrors.NewForbidden(gr, "harvester-ipam", errors.New("no role"))
	refused := errors.New("dial tcp 10.43.0.1:443: connect: connection refused")
	terminating := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", DeletionTimestamp: &metav1.Time{Time: time.Unix(1e9, 0)}}}
	type answer struct {
		ds  *appsv1.DaemonSet
		err error
	}
	tests := []struct {
		name     string
		answers  []answer
		ns       *corev1.Namespace
		node     *corev1.Node
		seen     map[string]any
		laterDS  bool // the watch sees the DaemonSet deleted after a while
		giveBack bool
		reads    int
		why      string
	}{
		{"in place: a rollout, a restart, a shutdown", []answer{{present, nil}}, nil, linuxNode("node-1", nil), nil, false, false, 1, "is in place and stands in here"},
		{"gone", []answer{{nil, notFound}}, nil, nil, nil, false, true, 1, "DaemonSet kube-system/harvester-ipam is gone"},
		{"being deleted (foreground)", []answer{{deleting, nil}}, nil, nil, nil, false, true, 1, "is being deleted"},
		{"its namespace being deleted", []answer{{present, nil}}, terminating, nil, nil, false, true, 1, "its namespace kube-system is being deleted"},
		{"its namespace being deleted, as watched (the namespace's read refused)", []answer{{present, nil}}, nil, nil, map[string]any{"namespace": terminating}, false, true, 1, "its namespace kube-system is being deleted"},
		{"turned off", []answer{{off, nil}}, nil, nil, nil, false, true, 1, "no longer stands in"},
		{"the node no longer selected", []answer{{present, nil}}, nil, linuxNode("node-1", map[string]string{"kubernetes.io/os": "windows"}), nil, false, true, 1, "no longer runs on node node-1"},
		{"unreachable, then in place", []answer{{nil, refused}, {present, nil}}, nil, nil, nil, false, false, 2, "is in place"},
		{"unreachable, and never watched", []answer{{nil, refused}}, nil, nil, nil, false, false, 3, "could not be read (dial tcp"},
		{"no answer", []answer{{nil, context.DeadlineExceeded}}, nil, nil, nil, false, false, 3, "no answer"},
		{"its token refused, never watched", []answer{{nil, unauthorized}}, nil, nil, nil, false, false, 1, "no watch saw it, so this may be a restart"},
		{"force-deleted: its token refused, watched in place", []answer{{nil, unauthorized}}, nil, nil, map[string]any{"daemonset": present}, false, false, 1, "as last seen, it stands in here (a force-deleted pod"},
		{"uninstalled: its token refused, watched gone", []answer{{nil, unauthorized}}, nil, nil, map[string]any{"daemonset": nil}, false, true, 1, "as last seen, its DaemonSet is gone"},
		{"uninstalled: its role gone, the watch sees the deletion a moment later", []answer{{nil, forbidden}}, nil, nil, map[string]any{"daemonset": present}, true, true, 1, "as last seen, its DaemonSet is gone"},
		{"turned off, its role gone (an older chart), as watched", []answer{{nil, forbidden}}, nil, nil, map[string]any{"daemonset": off}, false, true, 1, "no longer stands in"},
		{"the node deselected, its token refused, as watched", []answer{{nil, unauthorized}}, nil, nil,
			map[string]any{"daemonset": present, "node": linuxNode("node-1", map[string]string{"kubernetes.io/os": "windows"})}, false, true, 1, "no longer runs on node node-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads, slept := 0, time.Duration(0)
			o := &Owner{Namespace: "kube-system", Name: "harvester-ipam", Place: here,
				Get: func(context.Context) (*appsv1.DaemonSet, error) {
					a := tt.answers[min(reads, len(tt.answers)-1)]
					reads++
					return a.ds, a.err
				},
				GetNamespace: func(context.Context) (*corev1.Namespace, error) {
					if tt.ns == nil {
						return nil, forbidden
					}
					return tt.ns, nil
				},
				GetNode: func(context.Context) (*corev1.Node, error) {
					if tt.node == nil {
						return nil, forbidden
					}
					return tt.node, nil
				},
			}
			if tt.seen != nil {
				watching(o, tt.seen)
			}
			r := o.Removing(context.Background(), func(d time.Duration) {
				slept += d
				if tt.laterDS && slept >= time.Second {
					_ = o.watches["daemonset"].store.Delete(present)
				}
			})
			assert.Equal(t, tt.giveBack, r.GiveBack, r.Why)
			assert.Equal(t, tt.reads, reads, "reads of the DaemonSet")
			assert.Contains(t, r.Why, tt.why)
			assert.LessOrEqual(t, slept, 2*removalPause+watchWait, "a stop's reads are bounded")
		})
	}
}

// While it runs, the installer takes the name only while the chart, as
// watched, still stands in here; unwatched, it does.
func TestStillStandsIn(t *testing.T) {
	o := &Owner{Namespace: "kube-system", Name: "harvester-ipam", Place: here}
	ok, _ := o.StillStandsIn()
	assert.True(t, ok, "nothing watched yet")
	watching(o, map[string]any{"daemonset": chartDaemonSet("whereabouts", "/opt/cni/bin")})
	ok, _ = o.StillStandsIn()
	assert.True(t, ok)
	watching(o, map[string]any{"daemonset": chartDaemonSet("", "/opt/cni/bin")})
	ok, why := o.StillStandsIn()
	assert.False(t, ok)
	assert.Contains(t, why, "no longer stands in")
}

// NewOwner reads and watches the DaemonSet named (and its namespace and
// node), through the kubeconfig given (the pod's service account when none
// is), each read bounded; the watches keep what they saw when reads are
// refused afterwards.
func TestNewOwnerReadsAndWatchesItsDaemonSet(t *testing.T) {
	var gone, refuse atomic.Bool
	ds := `{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"harvester-ipam","namespace":"kube-system","resourceVersion":"1"},"spec":{"template":{"spec":{"containers":[{"name":"install","command":["/usr/bin/harvester-ipam-install"],"args":["--stand-in=whereabouts"]}]}}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		status := func(code int, reason string) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"` + reason + `","code":` + map[int]string{401: "401", 404: "404"}[code] + `}`))
		}
		switch {
		case refuse.Load():
			status(http.StatusUnauthorized, "Unauthorized")
		case r.URL.Path == "/apis/apps/v1/namespaces/kube-system/daemonsets/harvester-ipam" && !gone.Load():
			_, _ = w.Write([]byte(ds))
		case r.URL.Path == "/apis/apps/v1/namespaces/kube-system/daemonsets" && r.URL.Query().Get("fieldSelector") == "metadata.name=harvester-ipam" && r.URL.Query().Get("watch") == "":
			_, _ = w.Write([]byte(`{"kind":"DaemonSetList","apiVersion":"apps/v1","metadata":{"resourceVersion":"1"},"items":[` + ds + `]}`))
		case r.URL.Query().Get("watch") != "":
			// A watch that stays open and says nothing.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			status(http.StatusNotFound, "NotFound")
		}
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600))

	_, err := NewOwner(kc, "", "harvester-ipam", here)
	assert.ErrorContains(t, err, "needs a namespace and a name")
	_, err = NewOwner(filepath.Join(t.TempDir(), "missing"), "kube-system", "harvester-ipam", here)
	assert.ErrorContains(t, err, "a client to read DaemonSet kube-system/harvester-ipam")

	o, err := NewOwner(kc, "kube-system", "harvester-ipam", Place{Name: "whereabouts"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Watch(ctx)
	require.Eventually(t, func() bool { _, ok := o.Seen(); return ok }, 10*time.Second, 10*time.Millisecond, "the watch lists the DaemonSet")
	nosleep := func(time.Duration) {}
	r := o.Removing(ctx, nosleep)
	assert.False(t, r.GiveBack, r.Why)
	assert.Contains(t, r.Why, "DaemonSet kube-system/harvester-ipam is in place")
	refuse.Store(true) // the pod force-deleted: its token refused
	r = o.Removing(ctx, nosleep)
	assert.False(t, r.GiveBack, r.Why)
	assert.Contains(t, r.Why, "as last seen, it stands in here")
	refuse.Store(false)
	gone.Store(true)
	r = o.Removing(ctx, nosleep)
	assert.True(t, r.GiveBack, r.Why)
	assert.Contains(t, r.Why, "is gone")
}
