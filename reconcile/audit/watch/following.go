package watch

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// Following tells whether every informer the audit reads follows the
// cluster: it has listed, and its watch is open, with no error since. After
// an API server restart each reflector reconnects on its own backoff (up to
// about a minute): meanwhile one informer holds the cluster as it was and
// another as it is, and a look would judge fresh pods against stale pools
// (or the reverse) for longer than the grace. The audit judges only while
// Err is nil (the node agent's copy keeps the same account: agent/cache).
//
// An informer follows again once a list succeeds or a watch opens: a watch
// resumed at the resourceVersion it last saw delivers every change since,
// so nothing is missed (and an error in the stream that ends it, then a
// watch that opens again, is followed again: no informer is left marked
// behind for good).
type Following struct {
	mu    sync.Mutex
	state map[string]*follow
	now   func() time.Time
	// onFollow is called when every informer follows again.
	onFollow func()
}

type follow struct {
	gen   uint64
	ok    bool
	since time.Time // when it stopped following
	why   error
}

// NewFollowing tracks no informer yet.
func NewFollowing() *Following { return &Following{state: map[string]*follow{}, now: time.Now} }

// ErrNotFollowing is what a look gets while an informer does not follow.
var ErrNotFollowing = errors.New("an informer the audit reads does not follow the cluster")

// Err is nil when every informer follows; else which does not, since when
// and why (errors.Is ErrNotFollowing).
func (f *Following) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var behind []string
	for name, s := range f.state {
		if !s.ok {
			behind = append(behind, name)
		}
	}
	if len(behind) == 0 {
		return nil
	}
	sort.Strings(behind)
	s := f.state[behind[0]]
	return fmt.Errorf("%w: %d of %d (%v); the %s informer since %s: %v", ErrNotFollowing, len(behind), len(f.state), behind,
		behind[0], s.since.UTC().Format(time.RFC3339), s.why)
}

// Behind are the informers that do not follow now.
func (f *Following) Behind() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.state {
		if !s.ok {
			n++
		}
	}
	return n
}

func (f *Following) entry(name string) *follow {
	s := f.state[name]
	if s == nil {
		s = &follow{since: f.now(), why: errors.New("not listed yet")}
		f.state[name] = s
	}
	return s
}

// set records the informer's state; gen 0 is any generation, else only
// the watch of that generation may say it ended.
func (f *Following) set(name string, gen uint64, ok bool, why error) {
	f.mu.Lock()
	s := f.entry(name)
	if gen != 0 && gen != s.gen {
		f.mu.Unlock()
		return // an earlier watch's end, after a newer one opened
	}
	was := s.ok
	if ok {
		s.ok, s.why = true, nil
	} else if was || s.why == nil {
		s.ok, s.since, s.why = false, f.now(), why
	} else {
		s.why = why
	}
	all := ok && !was
	if all {
		for _, o := range f.state {
			all = all && o.ok
		}
	}
	cb := f.onFollow
	f.mu.Unlock()
	if all && cb != nil {
		cb()
	}
}

// ListerWatcher is lw whose lists and watches tell f whether the informer
// named name follows the cluster.
func (f *Following) ListerWatcher(name string, lw toolscache.ListerWatcher) toolscache.ListerWatcher {
	f.mu.Lock()
	f.entry(name)
	f.mu.Unlock()
	inner := toolscache.ToListerWatcherWithContext(lw)
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := inner.ListWithContext(ctx, o)
			if err != nil {
				f.set(name, 0, false, fmt.Errorf("list: %w", err))
				return nil, err
			}
			f.set(name, 0, true, nil)
			return obj, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			w, err := inner.WatchWithContext(ctx, o)
			if err != nil {
				f.set(name, 0, false, fmt.Errorf("watch: %w", err))
				return nil, err
			}
			f.mu.Lock()
			s := f.entry(name)
			s.gen++
			gen := s.gen
			f.mu.Unlock()
			f.set(name, 0, true, nil)
			return newFollowedWatch(w, func(why error) { f.set(name, gen, false, why) }), nil
		},
	}
}

// followedWatch passes a watch's events on and says when it ends or
// carries an error.
type followedWatch struct {
	inner apiwatch.Interface
	out   chan apiwatch.Event
	done  chan struct{}
	once  sync.Once
}

func newFollowedWatch(inner apiwatch.Interface, ended func(error)) *followedWatch {
	w := &followedWatch{inner: inner, out: make(chan apiwatch.Event), done: make(chan struct{})}
	go func() {
		defer close(w.out)
		why := errors.New("its watch ended")
		defer func() { ended(why) }()
		for {
			select {
			case <-w.done:
				why = errors.New("its watch was stopped")
				return
			case e, ok := <-inner.ResultChan():
				if !ok {
					return
				}
				if e.Type == apiwatch.Error {
					why = fmt.Errorf("its watch failed: %w", apierrors.FromObject(e.Object))
					ended(why)
				}
				select {
				case w.out <- e:
				case <-w.done:
					return
				}
			}
		}
	}()
	return w
}

func (w *followedWatch) Stop() {
	w.once.Do(func() { close(w.done) })
	w.inner.Stop()
}

func (w *followedWatch) ResultChan() <-chan apiwatch.Event { return w.out }
