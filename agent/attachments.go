package agent

import (
	"context"
	"sync"
)

// attachments runs the verbs of one attachment (CNI_CONTAINERID,
// CNI_IFNAME) one after the other. A client that gave up on an ADD (its
// timeout, a kill) leaves the agent finishing what the ADD began: the
// allocator writes an entry it chose, and its reservation, whatever became
// of the client. A DEL of that attachment run beside it would look before
// that write and find nothing, leaving the entry to the pod's next ADD or the
// reconciler; after it, it releases what the ADD wrote. The runtime never
// runs two verbs of one attachment at once; the plugin's fallback may.
type attachments struct {
	mu   sync.Mutex
	busy map[string]chan struct{}
	// wait waits until done is closed (nil: a receive); the simulation
	// waits under its scheduler.
	wait func(done <-chan struct{})
}

// hold waits until no other verb of key runs and marks one running; release
// ends it. It gives up, nothing held, when ctx ends first (the client went
// away).
func (a *attachments) hold(ctx context.Context, key string) (release func(), err error) {
	for {
		a.mu.Lock()
		if a.busy == nil {
			a.busy = map[string]chan struct{}{}
		}
		ch, taken := a.busy[key]
		if !taken {
			ch = make(chan struct{})
			a.busy[key] = ch
			a.mu.Unlock()
			return func() {
				a.mu.Lock()
				delete(a.busy, key)
				a.mu.Unlock()
				close(ch)
			}, nil
		}
		a.mu.Unlock()
		if a.wait != nil {
			a.wait(ch)
		} else {
			select {
			case <-ch:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}
