package follow

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func nad(name string, lbls map[string]string, config string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": name, "namespace": "harvester-system", "uid": "uid-" + name},
		"spec":     map[string]any{"config": config},
	}}
	u.SetLabels(lbls)
	return u
}

func fakes(t *testing.T, objs ...runtime.Object) (*Follower, *dynamicfake.FakeDynamicClient, *kubefake.Clientset) {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{NADResource: "NetworkAttachmentDefinitionList"})
	// Created through the resource: the fake's guess from the kind would
	// be "networkattachmentdefinitions".
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		if _, err := dyn.Resource(NADResource).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dyn.ClearActions()
	kube := kubefake.NewSimpleClientset()
	f, err := New(Config{Client: dyn, Events: kube.CoreV1(), Namespace: "harvester-system", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return f, dyn, kube
}

func config(t *testing.T, dyn *dynamicfake.FakeDynamicClient, name string) string {
	t.Helper()
	o, err := dyn.Resource(NADResource).Namespace("harvester-system").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := unstructured.NestedString(o.Object, "spec", "config")
	return c
}

func events(t *testing.T, kube *kubefake.Clientset) []corev1.Event {
	t.Helper()
	l, err := kube.CoreV1().Events("harvester-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

var storage = map[string]string{StorageNetworkLabel: "0123abcd"}

func TestSwitch(t *testing.T) {
	for _, tt := range []struct {
		name       string
		labels     map[string]string
		config     string
		from, to   string
		wantConfig string
		wantReason string
		check      func(t *testing.T, r Result)
	}{
		{name: "storage network", labels: storage, config: with(harvester, "whereabouts"), from: Whereabouts, to: HarvesterIPAM,
			wantConfig: with(harvester, "harvester-ipam"), wantReason: ReasonSwitchedToHarvesterIPAM},
		{name: "RWX network", labels: map[string]string{RWXNetworkLabel: "x"}, config: with(harvester, "whereabouts"), from: Whereabouts, to: HarvesterIPAM,
			wantConfig: with(harvester, "harvester-ipam"), wantReason: ReasonSwitchedToHarvesterIPAM},
		{name: "back", labels: storage, config: with(harvester, "harvester-ipam"), from: HarvesterIPAM, to: Whereabouts,
			wantConfig: with(harvester, "whereabouts"), wantReason: ReasonSwitchedToWhereabouts},
		{name: "already switched", labels: storage, config: with(harvester, "harvester-ipam"), from: Whereabouts, to: HarvesterIPAM,
			check: func(t *testing.T, r Result) {
				if r.Outcome != AlreadySet {
					t.Errorf("outcome %v", r.Outcome)
				}
			}},
		{name: "another network", labels: map[string]string{"app": "vm-net"}, config: with(harvester, "whereabouts"), from: Whereabouts, to: HarvesterIPAM,
			check: func(t *testing.T, r Result) {
				if !r.Gone {
					t.Errorf("not left alone: %v", r)
				}
			}},
		{name: "not JSON", labels: storage, config: "{oops", from: Whereabouts, to: HarvesterIPAM, wantReason: ReasonNotSwitched,
			check: func(t *testing.T, r Result) {
				if !errors.Is(r.Unswitchable, ErrNotSwitchable) {
					t.Errorf("unswitchable: %v", r.Unswitchable)
				}
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, dyn, kube := fakes(t, nad("n", tt.labels, tt.config))
			r := f.Switch(context.Background(), "harvester-system", "n", tt.from, tt.to)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			want := tt.wantConfig
			if want == "" {
				want = tt.config
			}
			if got := config(t, dyn, "n"); got != want {
				t.Errorf("config\n  %s\nwant\n  %s", got, want)
			}
			evs := events(t, kube)
			if tt.wantReason == "" {
				if len(evs) != 0 {
					t.Errorf("events: %+v", evs)
				}
				if updates(dyn) != 0 {
					t.Errorf("%d updates of a NAD left alone", updates(dyn))
				}
			} else {
				if len(evs) != 1 || evs[0].Reason != tt.wantReason || evs[0].InvolvedObject.Name != "n" ||
					evs[0].InvolvedObject.Kind != "NetworkAttachmentDefinition" {
					t.Fatalf("events: %+v", evs)
				}
				if tt.wantReason != ReasonNotSwitched && !strings.Contains(evs[0].Message, `"`+tt.from+`" -> "`+tt.to+`"`) {
					t.Errorf("message %q", evs[0].Message)
				}
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func updates(dyn *dynamicfake.FakeDynamicClient) int {
	n := 0
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "update" {
			n++
		}
	}
	return n
}

// A concurrent writer makes the first update conflict: the switch reads
// again and writes once more; a writer that never stops is given up on.
func TestSwitchRetriesConflictsBounded(t *testing.T) {
	for _, tt := range []struct {
		name      string
		conflicts int
		wantErr   bool
	}{{"one conflict", 1, false}, {"always", 1000, true}} {
		t.Run(tt.name, func(t *testing.T) {
			f, dyn, kube := fakes(t, nad("n", storage, with(harvester, "whereabouts")))
			n := 0
			dyn.PrependReactor("update", "network-attachment-definitions", func(k8stesting.Action) (bool, runtime.Object, error) {
				if n < tt.conflicts {
					n++
					return true, nil, apierrors.NewConflict(NADResource.GroupResource(), "n", errors.New("the object has been modified"))
				}
				return false, nil, nil
			})
			r := f.Switch(context.Background(), "harvester-system", "n", Whereabouts, HarvesterIPAM)
			gets := 0
			for _, a := range dyn.Actions() {
				if a.GetVerb() == "get" {
					gets++
				}
			}
			if tt.wantErr {
				if r.Err == nil || !apierrors.IsConflict(errors.Unwrap(r.Err)) || !strings.Contains(r.Err.Error(), "NAD harvester-system/n") {
					t.Fatalf("err %v", r.Err)
				}
				if gets != 5 || config(t, dyn, "n") != with(harvester, "whereabouts") || len(events(t, kube)) != 0 {
					t.Fatalf("%d reads; config %s", gets, config(t, dyn, "n"))
				}
				return
			}
			if r.Err != nil || gets != 2 || config(t, dyn, "n") != with(harvester, "harvester-ipam") {
				t.Fatalf("err %v, %d reads (want a fresh read per try)", r.Err, gets)
			}
		})
	}
}

// A config that cannot be switched is warned about once per version, not
// at every resync.
func TestWarnOncePerResourceVersion(t *testing.T) {
	f, dyn, kube := fakes(t, nad("n", storage, `{"type":"bridge"}`))
	for i := 0; i < 3; i++ {
		f.Switch(context.Background(), "harvester-system", "n", Whereabouts, HarvesterIPAM)
	}
	evs := events(t, kube)
	if len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning || !strings.Contains(evs[0].Message, `no "ipam"`) {
		t.Fatalf("events: %+v", evs)
	}
	o, _ := dyn.Resource(NADResource).Namespace("harvester-system").Get(context.Background(), "n", metav1.GetOptions{})
	o.SetResourceVersion("2")
	_, _ = dyn.Resource(NADResource).Namespace("harvester-system").Update(context.Background(), o, metav1.UpdateOptions{})
	f.Switch(context.Background(), "harvester-system", "n", Whereabouts, HarvesterIPAM)
	if n := len(events(t, kube)); n != 2 {
		t.Fatalf("a new version: %d events, want 2", n)
	}
}

func TestParseSelectors(t *testing.T) {
	sels, err := ParseSelectors(nil)
	if err != nil || len(sels) != 2 || sels[0].String() != StorageNetworkLabel || sels[1].String() != RWXNetworkLabel {
		t.Fatalf("defaults: %v %v", sels, err)
	}
	for in, want := range map[string]string{"": "matches every NAD", "a in (b": "NAD selector \"a in (b\""} {
		if _, err := ParseSelectors([]string{in}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// Run switches what is there and what appears; Unfollow switches back.
func TestRunAndUnfollow(t *testing.T) {
	f, dyn, kube := fakes(t,
		nad("old", storage, with(harvester, "whereabouts")),
		nad("other", nil, with(harvester, "whereabouts")),
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	nads := dyn.Resource(NADResource).Namespace("harvester-system")
	if _, err := nads.Create(ctx, nad("rwx", map[string]string{RWXNetworkLabel: "y"}, with(harvester, "whereabouts")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for config(t, dyn, "old") != with(harvester, "harvester-ipam") || config(t, dyn, "rwx") != with(harvester, "harvester-ipam") {
		if time.Now().After(deadline) {
			t.Fatalf("not switched: old %s, rwx %s", config(t, dyn, "old"), config(t, dyn, "rwx"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if config(t, dyn, "other") != with(harvester, "whereabouts") {
		t.Fatal("a NAD of another network was switched")
	}
	if n := len(events(t, kube)); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}

	rs, err := f.Unfollow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Name != "old" || rs[1].Name != "rwx" || rs[0].Outcome != Switched || rs[1].Outcome != Switched {
		t.Fatalf("results %+v", rs)
	}
	for _, n := range []string{"old", "rwx", "other"} {
		if config(t, dyn, n) != with(harvester, "whereabouts") {
			t.Fatalf("%s: %s", n, config(t, dyn, n))
		}
	}
}
