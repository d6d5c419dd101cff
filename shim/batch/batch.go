// Package batch is a queue per key whose first waiter starts the one worker
// that drains it: what waits at one moment goes together, in one round (a
// node agent's writes to one pool: one patch for every ADD, or every
// removal, waiting then).
package batch

import "sync"

// Queue holds what waits for one key. One worker at a time takes rounds
// from it; what arrives while it works waits for its next round.
type Queue[T any] struct {
	mu      sync.Mutex
	waiting []T
	busy    bool
}

// Push adds t. It says whether the caller must start the worker: none runs.
func (q *Queue[T]) Push(t T) (lead bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = append(q.waiting, t)
	lead = !q.busy
	q.busy = true
	return lead
}

// Requeue puts t back for the worker's next round.
func (q *Queue[T]) Requeue(t T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = append(q.waiting, t)
}

// Take is the worker's next round: what pick chooses from what waits (nil
// pick: all of it), the rest waiting on; a pick that chooses nothing of
// what waits gets the first. Nothing waiting ends the worker: the next
// Push starts another.
func (q *Queue[T]) Take(pick func(waiting []T) (round, rest []T)) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		q.waiting = nil
		q.busy = false
		return nil
	}
	round, rest := q.waiting, []T(nil)
	if pick != nil {
		round, rest = pick(q.waiting)
		if len(round) == 0 {
			round, rest = rest[:1], rest[1:]
		}
	}
	q.waiting = rest
	return round
}

// Queues are the queues of every key, each made on first use.
type Queues[K comparable, T any] struct {
	mu sync.Mutex
	m  map[K]*Queue[T]
}

// Of is k's queue.
func (qs *Queues[K, T]) Of(k K) *Queue[T] {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.m == nil {
		qs.m = map[K]*Queue[T]{}
	}
	q := qs.m[k]
	if q == nil {
		q = &Queue[T]{}
		qs.m[k] = q
	}
	return q
}
