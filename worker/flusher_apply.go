package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// apply writes entries to Postgres and acknowledges what it applied. Entries
// that cannot be applied by any batch (undecodable, or of a kind this
// version does not know) are dead-lettered first; the rest go in one fenced
// transaction, split while Postgres refuses it (applySplit). It returns how
// many were applied and acknowledged. The writes and acknowledgements run on
// a context detached from a stop, so a batch that was read is finished, not
// abandoned, on shutdown. Entries of this process's batches still waiting
// for their commit to be durable are left out.
func (f *Flusher) apply(ctx context.Context, p int, entries []inventory.OutboxEntry) (int, error) {
	began := time.Now()
	fence, ok := f.leases.Fence(p)
	if !ok {
		return 0, nil // lost the lease since the read; the events stay pending
	}
	wctx := context.WithoutCancel(ctx)
	batch := make([]inventory.OutboxEntry, 0, len(entries))
	var dead []inventory.DeadLetter
	for _, e := range entries {
		if _, waiting := f.unflushedIDs[e.ID]; waiting {
			// Applied by a batch of this process that waits for its
			// commit to be durable: a read of pending entries (this
			// consumer's own after a lapsed lease, or a claim once idle)
			// returns it again. It is acknowledged with that batch, not
			// applied and counted a second time.
			continue
		}
		if e.Err != nil {
			reason := deadMalformed
			switch {
			case errors.Is(e.Err, db.ErrUnknownKind):
				reason = deadUnknownKind
			case errors.Is(e.Err, inventory.ErrNewerEvent):
				reason = deadNewerVersion
			}
			dead = append(dead, inventory.DeadLetter{Entry: e, Reason: reason, Err: e.Err})
			continue
		}
		batch = append(batch, e)
	}
	if err := f.deadLetter(wctx, p, dead); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if h := f.hooks.beforeApply; h != nil {
		h(p, events(batch))
	}
	wctx, tr := f.startApply(wctx, p, batch)
	n, err := f.applyBatch(wctx, p, fence, batch, began)
	f.endApply(tr, n, err)
	return n, err
}

// applyBatch applies a batch of decodable entries (apply), acknowledges
// what Postgres took and has on disk, and refuses what it would not. A
// batch committed unflushed (db.Commit) is kept in f.unflushed until its
// commit is durable. The batches of the partition the last one's commit
// report showed durable are acknowledged while this batch is written, one
// round trip to Redis beside the one to Postgres instead of after it
// (ackPrior); the batches found durable otherwise are acknowledged by a
// later pass (ackFlushed).
func (f *Flusher) applyBatch(wctx context.Context, p int, fence db.Fence, batch []inventory.OutboxEntry, began time.Time) (int, error) {
	prior, acked := f.ackPrior(wctx, p)
	// While maxUnflushed batches wait for the WAL writer, the next is
	// committed durably: the flush it waits for is then the batch's own
	// time, and the batches before it are durable too.
	unflushed := !f.cfg.SynchronousCommit && len(f.unflushed[p]) < maxUnflushed
	done, refused, commit, err := f.applySplit(wctx, p, fence, batch, unflushed)
	if errors.Is(err, db.ErrFenced) {
		f.leases.Lost(p)
		err = nil // the events stay pending for the new owner
	}
	if aerr := <-acked; aerr != nil {
		// The earlier batches stay pending, with this one: the failure
		// has them read and applied again (settle).
		return 0, errors.Join(err, aerr)
	}
	f.acknowledged(prior)
	if commit.Unflushed {
		f.holdUnflushed(p, commit, done)
	} else if len(done) > 0 {
		if aerr := f.acknowledge(wctx, p, done, err == nil); aerr != nil {
			return 0, errors.Join(err, aerr)
		}
	}
	if len(done) > 0 {
		f.m.batchSize.Observe(float64(len(done)))
	}
	if len(done) > 0 || len(prior) > 0 {
		f.m.batchDur.Observe(time.Since(began).Seconds())
	}
	if err != nil {
		return len(done), err
	}
	return len(done), f.refuse(wctx, p, refused)
}

// ackPrior starts acknowledging, on a goroutine of its own, partition p's
// batches that the commit report of its last unflushed batch showed
// durable, and returns their entries and where the acknowledgement's
// outcome is sent (at once nil when there are none). The caller receives
// the outcome before it goes on with anything else of p, then counts the
// entries (acknowledged) if it is nil.
func (f *Flusher) ackPrior(wctx context.Context, p int) ([]inventory.OutboxEntry, <-chan error) {
	acked := make(chan error, 1)
	var prior []inventory.OutboxEntry
	if b := f.unflushed[p]; len(b) > 0 {
		last := b[len(b)-1].commit
		prior = f.takeDurable(p, last.Session, last.Flushed, "batch")
	}
	if len(prior) == 0 {
		acked <- nil
		return nil, acked
	}
	go func() { acked <- f.ackInRedis(wctx, p, prior, true) }()
	return prior, acked
}

// acknowledge acknowledges entries of partition p that are in the ledger
// for good. hook runs the beforeAck test hook first.
func (f *Flusher) acknowledge(wctx context.Context, p int, entries []inventory.OutboxEntry, hook bool) error {
	if err := f.ackInRedis(wctx, p, entries, hook); err != nil {
		return err
	}
	f.acknowledged(entries)
	return nil
}

// ackInRedis is acknowledge's part in Redis, which touches nothing of the
// loop's own: ackPrior runs it beside the next batch.
func (f *Flusher) ackInRedis(wctx context.Context, p int, entries []inventory.OutboxEntry, hook bool) error {
	evs := events(entries)
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	if h := f.hooks.beforeAck; hook && h != nil {
		if err := h(p, evs); err != nil {
			return err
		}
	}
	// What Postgres has is acknowledged even when the rest failed, in one
	// round trip when no SKU of the batch was rebuilt meanwhile. When one
	// was, Redis hears what the ledger now says before anything is
	// acknowledged: if it cannot, the batch is read, applied (a no-op)
	// and reconciled again.
	actx, cancel := stepContext(wctx, f.cfg.StepTimeout)
	acked, err := f.outbox.AckApplied(actx, p, evs, ids)
	cancel()
	if err != nil {
		return err
	}
	if !acked {
		if err := f.reconcile(wctx, p, evs); err != nil {
			return err
		}
		actx, cancel := stepContext(wctx, f.cfg.StepTimeout)
		err := f.outbox.Ack(actx, p, ids...)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// acknowledged counts entries acknowledged in Redis; loop goroutine only.
func (f *Flusher) acknowledged(entries []inventory.OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	for _, e := range entries {
		delete(f.refusals, e.ID)
	}
	f.m.applied.Add(float64(len(entries)))
	f.applied.Signal(f.total.Add(int64(len(entries))))
}

// applySplit applies batch in one fenced transaction. When Postgres refuses
// it (db.ErrRefused: the same batch would fail again), it applies each half
// on its own, down to single events, so only the events at fault are left
// out: a batch of n with one bad event takes about 2·log2(n) transactions.
// It returns what was applied, what Postgres refused alone, and the first
// other error (an outage or a timeout, or db.ErrFenced), which stops it.
// With unflushed the whole batch's transaction may be committed unflushed
// (db.Ledger.ApplyEventsUnflushed), and commit says where; the halves of a
// refused batch are committed durably.
func (f *Flusher) applySplit(ctx context.Context, p int, fence db.Fence, batch []inventory.OutboxEntry, unflushed bool) (done, refused []inventory.OutboxEntry, commit db.Commit, err error) {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	if unflushed {
		commit, err = f.engine.ApplyEventsUnflushed(sctx, &fence, events(batch))
	} else {
		err = f.engine.ApplyEvents(sctx, &fence, events(batch))
	}
	cancel()
	switch {
	case err == nil:
		return batch, nil, commit, nil
	case !errors.Is(err, db.ErrRefused) || errors.Is(err, db.ErrFenced):
		return nil, nil, db.Commit{}, fmt.Errorf("applying partition %d: %w", p, err)
	case len(batch) == 1:
		f.m.refused.Inc()
		f.log.Error().Err(err).Int("partition", p).Str("event", batch[0].Event.ID).Str("entry", batch[0].ID).
			Msg("Postgres refused an outbox event; it stays pending and is retried, the rest of its batch is applied")
		return nil, batch, db.Commit{}, nil
	}
	mid := len(batch) / 2
	done, refused, _, err = f.applySplit(ctx, p, fence, batch[:mid], false)
	if err != nil {
		return done, refused, db.Commit{}, err
	}
	d2, r2, _, err := f.applySplit(ctx, p, fence, batch[mid:], false)
	return append(done, d2...), append(refused, r2...), db.Commit{}, err
}

// reconcile tells Redis what an applied batch changed in the ledger for holds
// whose SKU was rebuilt since their events were written (see
// inventory.Maintenance.ReconcileApplied).
func (f *Flusher) reconcile(ctx context.Context, p int, events []db.Event) error {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	n, err := f.engine.ReconcileApplied(sctx, p, events)
	f.m.reconciled.Add(float64(n))
	if err != nil {
		return fmt.Errorf("reconciling partition %d with the ledger: %w", p, err)
	}
	return nil
}

// events are the ledger events of decoded entries.
func events(entries []inventory.OutboxEntry) []db.Event {
	evs := make([]db.Event, len(entries))
	for i, e := range entries {
		evs[i] = e.Event
	}
	return evs
}
