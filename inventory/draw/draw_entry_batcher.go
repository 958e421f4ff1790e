package draw

import (
	"context"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/batch"
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
type entryBatcher = batch.Batcher[struct{}, db.DrawEntryRequest, db.DrawEntryAnswer]

// recordEntries records one batch of entries.
type recordEntries func(context.Context, []db.DrawEntryRequest) ([]db.DrawEntryAnswer, error)

// newEntryBatcher is e's entry batcher: its batches go to record (nil: the
// ledger's EnterDraws) and wait up to gatherWait for a few more.
func (e *engine) newEntryBatcher(record recordEntries, gatherWait time.Duration) *entryBatcher {
	opts := batch.Options{Max: maxEntryBatch, InFlight: entryBatchesInFlight, SecondWhenFull: true,
		GatherFew: entryGatherFew, GatherWait: gatherWait}
	if record == nil {
		record = e.ledger.Draws().EnterDraws
	}
	return batch.New(opts, func(ctx context.Context, _ struct{}, calls []*batch.Call[db.DrawEntryRequest, db.DrawEntryAnswer]) {
		e.runEntryBatch(ctx, record, calls)
	})
}

// enterInBatch records one entry with the concurrent ones. It returns when
// its batch committed (or failed), or with ctx's error when ctx ends first;
// an entry whose batch has not left by then is not recorded, one on its way
// may still be (entering again replays it).
func (e *engine) enterInBatch(ctx context.Context, req db.DrawEntryRequest) (db.DrawEntryAnswer, error) {
	return e.entries.Do(ctx, struct{}{}, req)
}

// runEntryBatch records one batch and answers each of its callers.
func (e *engine) runEntryBatch(ctx context.Context, record recordEntries, calls []*batch.Call[db.DrawEntryRequest, db.DrawEntryAnswer]) {
	reqs := make([]db.DrawEntryRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.Req
	}
	ctx, cancel := context.WithTimeout(ctx, entryBatchTimeout)
	out, err := record(ctx, reqs)
	cancel()
	e.metrics.entryBatch.Observe(float64(len(calls)))
	for i, c := range calls {
		var ans db.DrawEntryAnswer
		if err == nil {
			ans = out[i]
		}
		c.Answer(ans, err)
	}
}
