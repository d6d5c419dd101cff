package install

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Only an uninstall gives the name back: the DaemonSet gone, being deleted,
// or the installer's service account gone with it. A rollout, a restart, a
// shutdown, or a DaemonSet that cannot be read keeps it.
func TestRemoving(t *testing.T) {
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	present := &appsv1.DaemonSet{}
	deleting := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: time.Unix(1e9, 0)}}}
	notFound := apierrors.NewNotFound(gr, "harvester-ipam")
	unauthorized := apierrors.NewUnauthorized("token refused")
	forbidden := apierrors.NewForbidden(gr, "harvester-ipam", errors.New("no role"))
	refused := errors.New("dial tcp 10.43.0.1:443: connect: connection refused")
	type answer struct {
		ds  *appsv1.DaemonSet
		err error
	}
	tests := []struct {
		name      string
		answers   []answer
		uninstall bool
		reads     int
		why       string
	}{
		{"in place: a rollout, a restart, a shutdown", []answer{{present, nil}}, false, 1, "is in place"},
		{"gone", []answer{{nil, notFound}}, true, 1, "is gone"},
		{"being deleted (foreground)", []answer{{deleting, nil}}, true, 1, "is being deleted (since 2001-09-09T01:46:40Z)"},
		{"its service account gone too", []answer{{nil, unauthorized}}, true, 1, "service account is gone"},
		{"its role gone first, then its account", []answer{{nil, forbidden}, {nil, unauthorized}}, true, 2, "service account is gone"},
		{"unreachable, then in place", []answer{{nil, refused}, {present, nil}}, false, 2, "is in place"},
		{"unreachable", []answer{{nil, refused}, {nil, refused}, {nil, refused}}, false, 3, "could not be read (dial tcp"},
		{"access refused", []answer{{nil, forbidden}, {nil, forbidden}, {nil, forbidden}}, false, 3, "could not be read"},
		{"no answer", []answer{{nil, context.DeadlineExceeded}, {nil, context.DeadlineExceeded}, {nil, context.DeadlineExceeded}}, false, 3, "no answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads, slept := 0, 0
			o := &Owner{Namespace: "kube-system", Name: "harvester-ipam", Get: func(context.Context) (*appsv1.DaemonSet, error) {
				a := tt.answers[min(reads, len(tt.answers)-1)]
				reads++
				return a.ds, a.err
			}}
			r := o.Removing(context.Background(), func(time.Duration) { slept++ })
			assert.Equal(t, tt.uninstall, r.Uninstall, r.Why)
			assert.Equal(t, tt.reads, reads, "reads of the DaemonSet")
			assert.Equal(t, tt.reads-1, slept, "a pause between reads, none after the last")
			assert.Contains(t, r.Why, tt.why)
		})
	}
}
