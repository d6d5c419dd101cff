package batch_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/harvester/harvester-ipam/shim/batch"
)

func TestQueue(t *testing.T) {
	evens := func(w []int) (round, rest []int) {
		for _, x := range w {
			if x%2 == 0 {
				round = append(round, x)
			} else {
				rest = append(rest, x)
			}
		}
		return round, rest
	}
	none := func(w []int) (round, rest []int) { return nil, append([]int(nil), w...) }
	last := func(w []int) (round, rest []int) {
		return []int{w[len(w)-1]}, append([]int(nil), w[:len(w)-1]...)
	}
	for _, tt := range []struct {
		name   string
		push   []int
		pick   func([]int) ([]int, []int)
		rounds [][]int
	}{
		{"nothing waits: the worker ends at once", nil, nil, nil},
		{"all that waits, in one round", []int{1, 2, 3}, nil, [][]int{{1, 2, 3}}},
		{"what pick chooses, the rest in later rounds", []int{1, 2, 3, 4}, evens, [][]int{{2, 4}, {1}, {3}}},
		{"a pick of nothing gets the first", []int{5, 6}, none, [][]int{{5}, {6}}},
		{"a pick of one gets that one", []int{1, 2, 3}, last, [][]int{{3}, {2}, {1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var q batch.Queue[int]
			for i, x := range tt.push {
				assert.Equal(t, i == 0, q.Push(x), "only the first push leads")
			}
			var got [][]int
			for r := q.Take(tt.pick); r != nil; r = q.Take(tt.pick) {
				got = append(got, append([]int(nil), r...))
				if len(got) > 10 {
					t.Fatal("the worker never ends")
				}
			}
			assert.Equal(t, tt.rounds, got)
			assert.True(t, q.Push(9), "the worker ended: the next push leads again")
		})
	}
}

func TestRequeueWaitsForTheNextRound(t *testing.T) {
	var q batch.Queue[string]
	q.Push("a")
	q.Push("b")
	assert.Equal(t, []string{"a", "b"}, q.Take(nil))
	q.Requeue("b")
	assert.False(t, q.Push("c"), "the worker still runs")
	assert.Equal(t, []string{"b", "c"}, q.Take(nil))
	assert.Nil(t, q.Take(nil))
}

func TestQueuesOfOneKeyAreOne(t *testing.T) {
	var qs batch.Queues[string, int]
	var wg sync.WaitGroup
	got := make([]*batch.Queue[int], 8)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = qs.Of("pool") }()
	}
	wg.Wait()
	for _, q := range got {
		assert.Same(t, got[0], q)
	}
	assert.NotSame(t, got[0], qs.Of("other"))
}
