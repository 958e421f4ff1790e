package worker

import (
	"context"
	"errors"
	"time"

	"github.com/dropline/dropline/inventory"
)

// partitionState is what one run of the loop knows of a partition.
type partitionState struct {
	ownPending bool // re-read this consumer's pending events first
	// lookPending: look for entries pending on this consumer that it never
	// got (their read lost its reply), leaving the refused ones alone.
	lookPending bool
	partitionBackoff
}

// loop flushes until stopped. gctx ends on a stop or a keeper failure; stop
// ends only on a stop, which is when the final drain runs. A partition's
// failure never ends the loop (see pass); only Redis failing the
// measurement, which every partition needs, does.
func (f *Flusher) loop(gctx, stop context.Context) error {
	var state [inventory.Partitions]partitionState
	for p := range state {
		state[p].ownPending = true
	}
	var lastClaim, lastTrim time.Time
	busy := true // the first idle pass signals too
	for {
		if gctx.Err() != nil {
			if stop.Err() != nil {
				return f.drain(stop, &state)
			}
			return nil
		}
		// Measure first: the lag and backlog matter most when Postgres is
		// down and every pass fails.
		if time.Since(lastTrim) >= f.cfg.TrimInterval {
			lastTrim = time.Now()
			if err := f.trimAndMeasure(gctx); err != nil && gctx.Err() == nil {
				return err
			}
		}
		if time.Since(lastClaim) >= f.cfg.ClaimInterval {
			// Entries Redis delivered to this consumer whose reply never
			// arrived stay pending on it: the Redis client sends a read that
			// lost its reply again, and the second read returns the next
			// entries with no error. Looking at this consumer's own pending
			// entries once per interval brings them back now, instead of
			// after ClaimIdle (which a second lost reply, on the claim that
			// resets their idle time, would double).
			for p := range state {
				state[p].lookPending = true
			}
		}
		n, full := f.pass(gctx, &state)
		if time.Since(lastClaim) >= f.cfg.ClaimInterval {
			lastClaim = time.Now()
			n += f.claimAll(gctx, &state)
		}
		wait := f.cfg.PollInterval
		if n > 0 || f.hasUnflushed() {
			busy = true
		} else {
			// Nothing came and nothing waits: the flusher is idle, and
			// reads less often.
			wait = f.cfg.IdleInterval
			if busy {
				busy = false
				f.caughtUp.Signal(struct{}{})
			}
		}
		// A pass that read a full batch goes on at once: the flusher is
		// behind. Otherwise the next pass waits, so that the events arriving
		// meanwhile make one larger batch (one transaction and one
		// acknowledgement for all of them) instead of many small ones.
		if !full {
			if h := f.hooks.beforeWait; h != nil {
				h(n, wait)
			}
			t := time.NewTimer(wait)
			select {
			case <-gctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// drain flushes what is left after a stop, for up to DrainTimeout, under
// the leases run keeps renewing meanwhile. A partition backing off after a
// failure is tried again when its backoff ends, if that is before the
// deadline.
func (f *Flusher) drain(stop context.Context, state *[inventory.Partitions]partitionState) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(stop), f.cfg.DrainTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	for ctx.Err() == nil {
		if n, _ := f.pass(ctx, state); n > 0 {
			continue
		}
		if f.hasUnflushed() {
			// Batches applied unflushed wait for the WAL writer (within
			// wal_writer_delay) to be acknowledged; left pending, they
			// are applied again by the next owner.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		retry, failing := time.Time{}, false
		for p := range state {
			if state[p].failures > 0 && f.leases.Held(p) && (!failing || state[p].retryAt.Before(retry)) {
				retry, failing = state[p].retryAt, true
			}
		}
		if !failing {
			return nil
		}
		if !retry.Before(deadline) {
			for p := range state {
				if state[p].failures > 0 && f.leases.Held(p) {
					f.log.Warn().Int("partition", p).Msg("final flush gave up on a failing partition; its events stay pending in Redis")
				}
			}
			return nil
		}
		t := time.NewTimer(time.Until(retry))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	f.log.Warn().Msg("final flush ran out of time; the rest stays pending in Redis")
	return nil
}

// pass reads and applies one batch from every owned partition and returns
// how many entries it handled, and whether one partition's batch was full
// (BatchSize entries: more may be waiting). A partition that fails is logged
// and left alone for a backoff; the others go on in the same pass. The new
// entries of every partition with nothing pending to look at are read in
// one round trip first (readNew).
func (f *Flusher) pass(ctx context.Context, state *[inventory.Partitions]partitionState) (total int, full bool) {
	read := f.readNew(ctx, state)
	for p := range inventory.Partitions {
		st := &state[p]
		if !f.leases.Held(p) || !st.due() {
			if len(read[p].entries) > 0 {
				// The lease lapsed since the read: what was read stays
				// pending on this consumer; read it again first if the
				// lease comes back.
				st.ownPending = true
			}
			if st.due() && len(f.unflushed[p]) > 0 {
				// What this process applied is acknowledged once durable,
				// lease or not.
				acked, err := f.ackFlushed(ctx, p, st)
				total += acked
				f.settle(ctx, p, st, err)
			}
			continue
		}
		var n int
		var err error
		if r, ok := read[p]; ok {
			n, err = f.applyNew(ctx, p, st, r.entries, r.err)
		} else {
			n, err = f.flushPartition(ctx, p, st)
		}
		total += n
		full = full || n >= f.cfg.BatchSize
		if err == nil && (n == 0 || f.unflushedOverdue(p)) {
			// No batch acknowledged what of p's earlier ones is durable,
			// or one waits longer than a batch's report can show it
			// (another session's, or one before a durable batch).
			var acked int
			acked, err = f.ackFlushed(ctx, p, st)
			total += acked
		}
		f.settle(ctx, p, st, err)
	}
	return total, full
}

// settle records the outcome of one partition's flush: a failure is logged
// and counted, and the partition backs off (doubling, MinRestartBackoff to
// MaxRestartBackoff) while the others go on.
func (f *Flusher) settle(ctx context.Context, p int, st *partitionState, err error) {
	if err == nil {
		if st.failures > 0 {
			f.log.Info().Int("partition", p).Int("failures", st.failures).Msg("partition flushes again")
		}
		st.partitionBackoff = partitionBackoff{}
		return
	}
	// What this consumer read stays pending on it: read it again first,
	// with the batches applied unflushed, whose commits may be lost.
	st.ownPending = true
	f.dropUnflushed(p)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return // a stop interrupted it: the final drain goes again at once
	}
	delay := st.fail(f.cfg.Options)
	f.m.failures.Inc()
	f.log.Error().Err(err).Int("partition", p).Int("failures", st.failures).Dur("backoff", delay).
		Msg("flushing a partition failed; its events stay pending, the other partitions go on")
}

// flushPartition reads and applies one batch of partition p: this
// consumer's pending entries first when it may have some, else new ones.
func (f *Flusher) flushPartition(ctx context.Context, p int, st *partitionState) (int, error) {
	if st.lookPending && !st.ownPending {
		st.lookPending = false
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		// Entries Postgres refused stay pending on this consumer; they are
		// retried when claimed after ClaimIdle (refuse counts them), so
		// their idle time is left to grow.
		// Entries of batches applied unflushed are pending until their
		// commit is durable, and left alone too.
		entries, err := f.outbox.ReadOwnPending(sctx, p, f.cfg.BatchSize, func(id string) bool {
			_, unflushed := f.unflushedIDs[id]
			return f.refusals[id] > 0 || unflushed
		})
		cancel()
		if err != nil {
			return 0, err
		}
		if len(entries) > 0 {
			f.log.Info().Int("partition", p).Int("events", len(entries)).
				Msg("found pending events a read delivered without its reply arriving")
			_, err := f.apply(ctx, p, entries)
			return len(entries), err
		}
	}
	if st.ownPending {
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		entries, err := f.outbox.ReadPending(sctx, p, f.cfg.BatchSize)
		cancel()
		if err != nil {
			return 0, err
		}
		if len(entries) > 0 {
			applied, err := f.apply(ctx, p, entries)
			if err == nil && applied < len(entries) {
				// Some were refused or fenced: leave them to XAUTOCLAIM
				// rather than re-reading them on every pass.
				st.ownPending = false
			}
			return len(entries), err
		}
		st.ownPending = false
	}
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	entries, err := f.outbox.Read(sctx, p, f.cfg.BatchSize)
	cancel()
	return f.applyNew(ctx, p, st, entries, err)
}

// newRead is what one partition's read of new entries returned.
type newRead struct {
	entries []inventory.OutboxEntry
	err     error
}

// readNew reads new entries of every partition the pass would read them
// from (held, due, with nothing of this consumer's pending to look at
// first) in one round trip, when there are two or more: one pass then costs
// one read however many partitions are idle. The others are read by
// flushPartition.
func (f *Flusher) readNew(ctx context.Context, state *[inventory.Partitions]partitionState) map[int]newRead {
	var ps []int
	for p := range inventory.Partitions {
		st := &state[p]
		if f.leases.Held(p) && st.due() && !st.ownPending && !st.lookPending {
			ps = append(ps, p)
		}
	}
	if len(ps) < 2 {
		return nil
	}
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	entries, errs := f.outbox.ReadMany(sctx, ps, f.cfg.BatchSize)
	cancel()
	out := make(map[int]newRead, len(ps))
	for _, p := range ps {
		out[p] = newRead{entries: entries[p], err: errs[p]}
	}
	return out
}

// applyNew applies what a read of partition p's new entries returned.
func (f *Flusher) applyNew(ctx context.Context, p int, st *partitionState, entries []inventory.OutboxEntry, err error) (int, error) {
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	_, err = f.apply(ctx, p, entries)
	if _, held := f.leases.Fence(p); !held {
		// The lease lapsed since the read: what was read stays pending on
		// this consumer; read it again first if the lease comes back.
		st.ownPending = true
	}
	return len(entries), err
}
