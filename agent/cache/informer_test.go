package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/harvester/harvester-ipam/shim"
)

// With client-go's WatchListClient, the reflector lists by a watch that
// streams the initial state (sendInitialEvents) into a store of its own,
// and replaces the informer's with it once the bookmark that ends the
// initial events comes: the copy follows again at that bookmark, not at the
// stream's first event.
func TestAWatchThatStreamsTheListFollowsOnceItsInitialEventsEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      metav1.ListOptions
		first     watch.Event
		followsAt string // "first": its first event; "end": the bookmark ending the initial events
	}{
		{"a watch", metav1.ListOptions{ResourceVersion: "4"}, watch.Event{Type: watch.Added, Object: poolAt("5")}, "first"},
		{"a watch that streams the list", metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			watch.Event{Type: watch.Added, Object: poolAt("5")}, "end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := New()
			fw := watch.NewFakeWithChanSize(4, false)
			lw := o.following("kube-system", "ippools", &toolscache.ListWatch{
				ListFunc:  func(metav1.ListOptions) (runtime.Object, error) { return nil, errors.New("unused") },
				WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return fw, nil },
			})
			o.failed("kube-system", "ippools", 0, errors.New("an earlier watch failed"))
			w, err := lw.Watch(tc.opts)
			require.NoError(t, err)
			defer w.Stop()
			next := func(e watch.Event) {
				fw.Action(e.Type, e.Object)
				select {
				case <-w.ResultChan():
				case <-time.After(10 * time.Second):
					t.Fatal("no event through the filter")
				}
			}
			next(tc.first)
			if tc.followsAt == "first" {
				assert.NoError(t, o.Following())
				return
			}
			assert.Error(t, o.Following(), "the initial events have not ended")
			next(watch.Event{Type: watch.Bookmark, Object: poolAt("9")})
			assert.Error(t, o.Following(), "a bookmark that does not end them")
			end := poolAt("9")
			end.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
			next(watch.Event{Type: watch.Bookmark, Object: end})
			assert.NoError(t, o.Following())
		})
	}
}

func poolAt(rv string) *shim.Pool {
	return &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.0-24", Namespace: "kube-system", ResourceVersion: rv}}
}
