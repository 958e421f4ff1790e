package draw

import (
	"cmp"
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
	// once. One is the rule: the entries that arrive while it commits
	// gather for the next. A second starts only when a whole batch
	// (maxEntryBatch) waits besides.
	entryBatchesInFlight = 2
	// entryGatherFew and entryGatherWait: a batch that comes back to
	// find entries waiting (the draw is busy) but fewer than
	// entryGatherFew waits up to entryGatherWait for that many before it
	// leaves. An entry that finds no batch on its way never waits.
	entryGatherFew  = 32
	entryGatherWait = 2 * time.Millisecond
	// entryBatchTimeout bounds one batch's transaction (its callers may
	// stop waiting sooner).
	entryBatchTimeout = 10 * time.Second
)

// entryBatcher is group commit for draw entries: the entries that
// arrive while a batch is on its way queue up and are recorded together,
// in one Postgres transaction (db.Draws.EnterDraws), and each caller is
// answered only once its batch has committed. So an entry is still a
// Postgres row before its answer, but a thousand entries cost a few
// transactions and WAL flushes instead of a thousand. The decisions are
// those of the same requests made one after the other (a principal's second
// entry replays its first, in the batch as across batches).
//
// The batches clock themselves: an entry that finds no batch on its way
// starts one at once (so a quiet draw records every entry in a transaction
// of its own, without waiting), and otherwise waits for the batch on its
// way to commit, which then takes everything waiting. When entries arrive
// one by one the batches would still be a few entries each (each commit
// finding the two or three that came meanwhile), and a transaction's fixed
// cost would come nearly once per entry; so a batch that comes back to a
// few entries waiting gives more a moment (entryGatherWait) to join them.
type entryBatcher struct {
	mu       sync.Mutex
	pending  []*entryCall
	inFlight int
	// gathering is set while a batch waits for entryGatherFew entries;
	// the entry that makes them that many signals enough.
	gathering bool
	enough    chan struct{}
	// record records one batch (nil: the ledger's EnterDraws) and
	// gatherWait is entryGatherWait unless set: tests put their own.
	record     func(context.Context, []db.DrawEntryRequest) ([]db.DrawEntryAnswer, error)
	gatherWait time.Duration
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
	start := b.inFlight == 0 || (b.inFlight < entryBatchesInFlight && len(b.pending) > maxEntryBatch)
	if start {
		b.inFlight++
	}
	if b.gathering && len(b.pending) >= entryGatherFew {
		b.gathering = false
		select {
		case b.enough <- struct{}{}:
		default: // a signal not taken yet: at worst a batch leaves early
		}
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
	var timer *time.Timer
	busy := false // this drainer's previous batch found entries waiting after it
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.inFlight--
			b.pending = nil // let go of the backing array a burst grew
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if busy && len(b.pending) < entryGatherFew && !b.gathering {
			if b.enough == nil {
				b.enough = make(chan struct{}, 1)
			}
			b.gathering = true
			b.mu.Unlock()
			wait := cmp.Or(b.gatherWait, entryGatherWait)
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-b.enough:
				timer.Stop() // no stale tick after Stop since Go 1.23
			case <-timer.C:
			}
			b.mu.Lock()
			if b.gathering {
				b.gathering = false
			} else {
				// enough was sent, maybe after the timer fired: take it
				// so that the next gathering starts empty.
				select {
				case <-b.enough:
				default:
				}
			}
		}
		n := min(len(b.pending), maxEntryBatch)
		calls := b.pending[:n:n]
		b.pending = b.pending[n:]
		b.mu.Unlock()
		calls = slices.DeleteFunc(calls, func(c *entryCall) bool { return c.left.Load() })
		if len(calls) > 0 {
			e.runEntryBatch(ctx, calls)
		}
		b.mu.Lock()
		busy = len(b.pending) > 0
		b.mu.Unlock()
	}
}

// runEntryBatch records one batch and answers each of its callers.
func (e *engine) runEntryBatch(ctx context.Context, calls []*entryCall) {
	reqs := make([]db.DrawEntryRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	ctx, cancel := context.WithTimeout(ctx, entryBatchTimeout)
	record := e.entries.record
	if record == nil {
		record = e.ledger.Draws().EnterDraws
	}
	out, err := record(ctx, reqs)
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
