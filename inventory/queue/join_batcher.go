package queue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxJoinBatch bounds the principals one run of join_queue.lua takes:
	// Redis runs nothing else meanwhile (128 joins are well under a
	// millisecond of its time).
	maxJoinBatch = 128
	// joinBatchesInFlight is how many batches of one queue may be on their
	// way at once: with two, Redis runs one while the replies of the other
	// travel back, and the joins that arrive meanwhile wait for the next.
	joinBatchesInFlight = 2
	// joinBatchTimeout bounds one batch's script (its callers may stop
	// waiting sooner).
	joinBatchTimeout = 10 * time.Second
)

// joinBatcher is group commit for joins, as the engine's reserves have it:
// the joins of one queue that arrive while earlier batches of the queue are
// on their way wait, and go to Redis together as one run of join_queue.lua,
// which decides each principal in turn. Redis, the network and this process
// then pay for one script call, one command and one reply per batch instead
// of per join. The decisions are those of the same joins run one after the
// other: the script checks each principal's ticket before it gives one.
//
// Nothing waits for a batch to fill: a join that finds fewer than
// joinBatchesInFlight batches of its queue on their way starts one at once,
// so on a quiet queue every join is a batch of one.
type joinBatcher struct {
	mu     sync.Mutex
	queues map[string]*joinQueue // by queue id
	// batches and joins count the batches sent to Redis and the joins
	// they carried.
	batches, joins atomic.Int64
}

// joinQueue is one queue's waiting joins and how many of its batches are on
// their way.
type joinQueue struct {
	k        keys
	pending  []*joinCall
	inFlight int
}

// joinCall is one join of a batch: once done is closed, its reply or the
// batch's error. left says its caller stopped waiting: a batch that has not
// left yet drops it.
type joinCall struct {
	principal string
	done      chan struct{}
	rep       joinReply
	err       error
	left      atomic.Bool
}

// joinInBatch runs principal's join of the queue of k, batched with the
// queue's concurrent joins. It returns when its batch answered, or with
// ctx's error when ctx ends first; a join whose batch has not left by then
// is not sent, one already on its way may still be decided (joining again
// returns its ticket).
func (s *Service) joinInBatch(ctx context.Context, k keys, principal string) (joinReply, error) {
	c := &joinCall{principal: principal, done: make(chan struct{})}
	b := &s.joins
	b.mu.Lock()
	if b.queues == nil {
		b.queues = map[string]*joinQueue{}
	}
	q := b.queues[k.id]
	if q == nil {
		q = &joinQueue{k: k}
		b.queues[k.id] = q
	}
	q.pending = append(q.pending, c)
	start := q.inFlight < joinBatchesInFlight
	if start {
		q.inFlight++
	}
	b.mu.Unlock()
	if start {
		go s.drainJoins(context.WithoutCancel(ctx), q)
	}
	select {
	case <-c.done:
		return c.rep, c.err
	case <-ctx.Done():
		c.left.Store(true)
		return joinReply{}, ctx.Err()
	}
}

// drainJoins sends q's waiting joins in batches until none waits; the last
// drainer of an idle queue forgets it.
func (s *Service) drainJoins(ctx context.Context, q *joinQueue) {
	b := &s.joins
	for {
		b.mu.Lock()
		if len(q.pending) == 0 {
			q.inFlight--
			q.pending = nil // let go of the backing array a burst grew
			if q.inFlight == 0 && b.queues[q.k.id] == q {
				delete(b.queues, q.k.id)
			}
			b.mu.Unlock()
			return
		}
		n := min(len(q.pending), maxJoinBatch)
		calls := q.pending[:n:n]
		q.pending = q.pending[n:]
		b.mu.Unlock()
		// Nobody would hear of the tickets of callers that left; they have
		// them when they join again.
		calls = slices.DeleteFunc(calls, func(c *joinCall) bool { return c.left.Load() })
		if len(calls) > 0 {
			s.runJoinBatch(ctx, q.k, calls)
		}
	}
}

// runJoinBatch runs one batch and hands each join its reply.
func (s *Service) runJoinBatch(ctx context.Context, k keys, calls []*joinCall) {
	who := make([]string, len(calls))
	for i, c := range calls {
		who[i] = c.principal
	}
	ctx, cancel := context.WithTimeout(ctx, joinBatchTimeout)
	reps, err := s.scripts.runJoin(ctx, s.rdb, k, joinArgs{MaxTickets: s.cfg.MaxTickets, Principals: who})
	cancel()
	s.joins.batches.Add(1)
	s.joins.joins.Add(int64(len(calls)))
	for i, c := range calls {
		if err != nil {
			c.err = fmt.Errorf("joining %s: %w", k.id, err)
		} else {
			c.rep = reps[i]
		}
		close(c.done)
	}
}
