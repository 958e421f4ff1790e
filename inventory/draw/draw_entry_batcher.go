package draw

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dropline/dropline/db"
)

const (
	// maxEntryBatch bounds the entries one Postgres transaction records.
	maxEntryBatch = 256
	// entryBatchesInFlight is how many batches may be on their way at
	// once: while one waits for its commit to reach the disk, the entries
	// that arrive meanwhile gather for the next.
	entryBatchesInFlight = 4
	// entryBatchTimeout bounds one batch's transaction (its callers may
	// stop waiting sooner).
	entryBatchTimeout = 10 * time.Second
)

// entryBatcher is group commit for draw entries: the entries that
// arrive while earlier batches are on their way queue up and are recorded
// together, in one Postgres transaction (db.Draws.EnterDraws), and each
// caller is answered only once its batch has committed. So an entry is
// still a Postgres row before its answer, but a thousand entries cost a few
// transactions and WAL flushes instead of a thousand. The decisions are
// those of the same requests made one after the other (a principal's second
// entry replays its first, in the batch as across batches).
//
// Nothing waits for a batch to fill: an entry that finds fewer than
// entryBatchesInFlight batches on their way starts one at once, so a
// quiet draw records every entry in a transaction of its own.
type entryBatcher struct {
	mu       sync.Mutex
	pending  []*entryCall
	inFlight int
}

// entryCall is one request of a batch and, once done is closed, its
// answer or the batch's error. left says its caller stopped waiting: a
// batch that has not left yet drops it.
type entryCall struct {
	req  db.DrawEntryRequest
	done chan struct{}
	ans  db.DrawEntryAnswer
	err  error
	left atomic.Bool
}

// enterInBatch records one entry with the concurrent ones. It returns when
// its batch committed (or failed), or with ctx's error when ctx ends first;
// an entry whose batch has not left by then is not recorded, one on its way
// may still be (entering again replays it).
func (e *engine) enterInBatch(ctx context.Context, req db.DrawEntryRequest) (db.DrawEntryAnswer, error) {
	c := &entryCall{req: req, done: make(chan struct{})}
	b := &e.entries
	b.mu.Lock()
	b.pending = append(b.pending, c)
	start := b.inFlight < entryBatchesInFlight
	if start {
		b.inFlight++
	}
	b.mu.Unlock()
	if start {
		go e.drainEntries(context.WithoutCancel(ctx))
	}
	select {
	case <-c.done:
		return c.ans, c.err
	case <-ctx.Done():
		c.left.Store(true)
		return db.DrawEntryAnswer{}, ctx.Err()
	}
}

// drainEntries records the waiting entries in batches until none waits.
func (e *engine) drainEntries(ctx context.Context) {
	b := &e.entries
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.inFlight--
			b.pending = nil // let go of the backing array a burst grew
			b.mu.Unlock()
			return
		}
		n := min(len(b.pending), maxEntryBatch)
		calls := b.pending[:n:n]
		b.pending = b.pending[n:]
		b.mu.Unlock()
		calls = slices.DeleteFunc(calls, func(c *entryCall) bool { return c.left.Load() })
		if len(calls) > 0 {
			e.runEntryBatch(ctx, calls)
		}
	}
}

// runEntryBatch records one batch and answers each of its callers.
func (e *engine) runEntryBatch(ctx context.Context, calls []*entryCall) {
	reqs := make([]db.DrawEntryRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	ctx, cancel := context.WithTimeout(ctx, entryBatchTimeout)
	out, err := e.ledger.Draws().EnterDraws(ctx, reqs)
	cancel()
	e.metrics.entryBatch.Observe(float64(len(calls)))
	for i, c := range calls {
		if err != nil {
			c.err = err
		} else {
			c.ans = out[i]
		}
		close(c.done)
	}
}
