package queue

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dropline/dropline/internal/batch"
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
// so on a quiet queue every join is a batch of one. A queue with nothing on
// its way is forgotten.
type joinBatcher struct {
	*batch.Batcher[keys, string, joinReply] // by queue, principals
	// batches and joins count the batches sent to Redis and the joins
	// they carried.
	batches, joins atomic.Int64
}

// newJoinBatcher sets up s's join batches.
func (s *Service) newJoinBatcher() {
	s.joins.Batcher = batch.New(batch.Options{Max: maxJoinBatch, InFlight: joinBatchesInFlight, Forget: true}, s.runJoinBatch)
}

// joinInBatch runs principal's join of the queue of k, batched with the
// queue's concurrent joins. It returns when its batch answered, or with
// ctx's error when ctx ends first; a join whose batch has not left by then
// is not sent, one already on its way may still be decided (joining again
// returns its ticket).
func (s *Service) joinInBatch(ctx context.Context, k keys, principal string) (joinReply, error) {
	return s.joins.Do(ctx, k, principal)
}

// runJoinBatch runs one batch and hands each join its reply.
func (s *Service) runJoinBatch(ctx context.Context, k keys, calls []*batch.Call[string, joinReply]) {
	who := make([]string, len(calls))
	for i, c := range calls {
		who[i] = c.Req
	}
	ctx, cancel := context.WithTimeout(ctx, joinBatchTimeout)
	reps, err := s.scripts.runJoin(ctx, s.rdb, k, joinArgs{MaxTickets: s.cfg.MaxTickets, Principals: who})
	cancel()
	s.joins.batches.Add(1)
	s.joins.joins.Add(int64(len(calls)))
	for i, c := range calls {
		if err != nil {
			c.Answer(joinReply{}, fmt.Errorf("joining %s: %w", k.id, err))
		} else {
			c.Answer(reps[i], nil)
		}
	}
}
