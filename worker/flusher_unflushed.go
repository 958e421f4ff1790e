package worker

import (
	"context"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// A batch of fresh holds is committed without waiting for its WAL to reach
// the disk (db.Ledger.ApplyEventsUnflushed): the flusher goes on with its
// next batch while PostgreSQL's WAL writer flushes, instead of waiting for
// the flush in every batch. Its entries stay pending in the outbox until
// the commit is durable, so a PostgreSQL crash that loses the commit loses
// nothing: the entries are read and applied again.

// maxUnflushed is the most batches of a partition that wait for their
// commit to be durable; the next one is committed durably. PostgreSQL's WAL
// writer flushes at least every wal_writer_delay (200 ms by default), in
// which a flusher behind its events applies about 8 batches of 500.
const maxUnflushed = 16

// unflushedCheckAfter is how old a partition's oldest batch waiting for
// its commit to be durable may grow before a pass that applies a batch
// of that partition also asks PostgreSQL how far its WAL is flushed
// (ackFlushed). A batch is normally shown durable by the next batch's
// report and acknowledged while the batch after that is written
// (ackPrior); a report only shows durable the batches committed on the
// same session: one committed on another connection of the pool, or before a
// batch committed durably, waits for this check while events keep coming.
// It is above wal_writer_delay (200 ms by default), within which the WAL
// writer flushes every commit.
const unflushedCheckAfter = 250 * time.Millisecond

// unflushedBatch is an applied batch whose commit may not be durable yet.
type unflushedBatch struct {
	commit  db.Commit
	entries []inventory.OutboxEntry
	at      time.Time // when it was committed
}

// holdUnflushed keeps an applied batch of partition p until its commit is
// durable.
func (f *Flusher) holdUnflushed(p int, c db.Commit, entries []inventory.OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	f.unflushed[p] = append(f.unflushed[p], unflushedBatch{commit: c, entries: entries, at: time.Now()})
	for _, e := range entries {
		f.unflushedIDs[e.ID] = struct{}{}
	}
}

// takeDurable removes and returns the entries of partition p's batches
// that a flush position read on session s shows durable, counting them by
// what showed it (by: "batch" or "check").
func (f *Flusher) takeDurable(p int, s db.Session, flushed uint64, by string) []inventory.OutboxEntry {
	var out []inventory.OutboxEntry
	kept := f.unflushed[p][:0]
	for _, b := range f.unflushed[p] {
		if !b.commit.Durable(s, flushed) {
			kept = append(kept, b)
			continue
		}
		out = append(out, b.entries...)
		for _, e := range b.entries {
			delete(f.unflushedIDs, e.ID)
		}
		f.m.durable.WithLabelValues(by).Inc()
	}
	clear(f.unflushed[p][len(kept):])
	f.unflushed[p] = kept
	return out
}

// dropUnflushed forgets partition p's unflushed batches after a failure:
// their entries stay pending and are read again (partitionState.ownPending)
// and applied again, a no-op for what the ledger has.
func (f *Flusher) dropUnflushed(p int) {
	for _, b := range f.unflushed[p] {
		for _, e := range b.entries {
			delete(f.unflushedIDs, e.ID)
		}
	}
	f.unflushed[p] = nil
}

// unflushedOverdue reports whether partition p's oldest batch waiting for
// its commit to be durable is older than unflushedCheckAfter.
func (f *Flusher) unflushedOverdue(p int) bool {
	b := f.unflushed[p]
	return len(b) > 0 && time.Since(b[0].at) >= unflushedCheckAfter
}

// hasUnflushed reports whether any partition has batches waiting for their
// commit to be durable.
func (f *Flusher) hasUnflushed() bool {
	return len(f.unflushedIDs) > 0
}

// ackFlushed asks PostgreSQL how far its WAL is flushed and acknowledges
// partition p's batches that are durable, for a pass that applied no
// batch of p (which would have). It returns how many entries it
// acknowledged. A batch whose session has ended (the server restarted, or
// the pool closed the connection) cannot be shown durable: p's batches are
// then dropped, read again and applied again.
func (f *Flusher) ackFlushed(ctx context.Context, p int, st *partitionState) (int, error) {
	if len(f.unflushed[p]) == 0 {
		return 0, nil
	}
	began := time.Now()
	var sessions []db.Session
	for _, b := range f.unflushed[p] {
		sessions = append(sessions, b.commit.Session)
	}
	wctx := context.WithoutCancel(ctx)
	sctx, cancel := stepContext(wctx, f.cfg.StepTimeout)
	flushed, alive, err := f.engine.Flushed(sctx, sessions)
	cancel()
	if err != nil {
		return 0, err
	}
	var ack []inventory.OutboxEntry
	for _, s := range sessions {
		if !alive[s] {
			f.log.Info().Int("partition", p).Msg("a batch's PostgreSQL session ended before its commit was seen durable; its events are applied again")
			f.dropUnflushed(p)
			st.ownPending = true
			return 0, nil
		}
		ack = append(ack, f.takeDurable(p, s, flushed, "check")...)
	}
	if len(ack) == 0 {
		return 0, nil
	}
	if err := f.acknowledge(wctx, p, ack, true); err != nil {
		return 0, err
	}
	f.m.ackCheck.Observe(time.Since(began).Seconds())
	return len(ack), nil
}
