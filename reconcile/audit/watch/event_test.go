package watch

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/harvester/harvester-ipam/reconcile/audit"
)

// eventFields are an Event's selectable fields as the API server matches a
// fieldSelector against them (pkg/registry/core/event ToSelectableFields).
func eventFields(e corev1.Event) fields.Set {
	return fields.Set{
		"metadata.name":                  e.Name,
		"metadata.namespace":             e.Namespace,
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"source":                         e.Source.Component,
		"type":                           e.Type,
	}
}

// describes says whether `kubectl describe` of the object shows e: kubectl
// lists the object's namespace's Events with the fieldSelector client-go's
// GetFieldSelector makes of its name, namespace, kind and UID (kubectl's
// describe searchEvents).
// (The fake clientset's GetFieldSelector selects everything: a real
// client's makes the selector, and sends nothing.)
func describes(t *testing.T, e corev1.Event, kind, namespace, name, uid string) bool {
	t.Helper()
	c, err := corev1client.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	require.NoError(t, err)
	sel := c.Events(namespace).GetFieldSelector(&name, &namespace, &kind, &uid)
	return e.Namespace == namespace && sel.Matches(eventFields(e))
}

// TestEventNamesThePodUID is issue 44's third reproduction: the audit's
// Event on a pod must be among those `kubectl describe pod` shows, which
// it selects by the pod's UID (and name, namespace, kind); an Event on a
// pool, likewise by the pool's.
func TestEventNamesThePodUID(t *testing.T) {
	kube := fake.NewClientset()
	src := &fixed{s: world(false)}
	a := &Auditor{Source: src, Tracker: audit.NewTracker(map[audit.Kind]time.Duration{audit.MissingAddress: 0}), Kube: kube}
	for i := 0; i < 2; i++ {
		_, _, err := a.Look(context.Background())
		require.NoError(t, err)
	}
	l, err := kube.CoreV1().Events("longhorn-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, l.Items, 1)
	ev := l.Items[0]
	assert.Equal(t, corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "longhorn-system", Name: "instance-manager-a", UID: "u1"}, ev.InvolvedObject)
	assert.True(t, describes(t, ev, "Pod", "longhorn-system", "instance-manager-a", "u1"), "kubectl describe pod shows it")
	assert.False(t, describes(t, ev, "Pod", "longhorn-system", "instance-manager-a", "u2"), "not on a pod of that name made again")

	// Headroom's Event goes on the pool.
	s := world(true)
	s.Pools[0].UID = "pool-uid"
	s.Pods[0].Labels = map[string]string{"longhorn.io/component": "instance-manager"}
	s.Nodes = 300 // need 300 of 253 free
	src.set(s)
	a.Tracker = audit.NewTracker(map[audit.Kind]time.Duration{audit.Headroom: 0})
	for i := 0; i < 2; i++ {
		_, _, err := a.Look(context.Background())
		require.NoError(t, err)
	}
	l, err = kube.CoreV1().Events("kube-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, l.Items, 1)
	assert.Equal(t, "StorageNetworkHeadroomLow", l.Items[0].Reason)
	assert.True(t, describes(t, l.Items[0], "IPPool", "kube-system", "10.0.50.0-24", "pool-uid"), "kubectl describe ippool shows it")
}

// An Event's message is cut to fit, the command to run next never.
func TestAnEventKeepsItsCommandWhole(t *testing.T) {
	for _, n := range []int{10, 1000, 5000} {
		msg := eventMessage(strings.Repeat("é", n), "kubectl cordon node-b")
		assert.LessOrEqual(t, len(msg), 1024)
		assert.True(t, strings.HasSuffix(msg, " Next: kubectl cordon node-b"), "n=%d", n)
		assert.True(t, utf8.ValidString(msg), "n=%d", n)
	}
}
