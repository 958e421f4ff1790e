package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/policy"
	"github.com/dropline/dropline/inventory/script"
)

// rebuildTimeout bounds one rebuild, Postgres lock included. A rebuild that
// gives up leaves the SKU unavailable until the next one, so the bound is
// generous: a SKU with 200,000 reservations in its windows takes a few
// seconds, up to 21 with the race detector on a loaded 2-core machine
// (docs/reliability.md).
const rebuildTimeout = time.Minute

// rebuildStagingTTL is how long a rebuild's staged keys outlive a rebuild
// that died half-way; well above rebuildTimeout.
const rebuildStagingTTL = 10 * rebuildTimeout

// Rebuild loads a SKU into Redis from Postgres when Redis does not have it (a
// new product, or state lost to a restart, flush, failover or eviction). It
// is a no-op when the SKU is present. Concurrent calls in this process share
// one rebuild; across processes the product's row lock serialises them, and
// the second finds the SKU loaded.
//
// The snapshot is read under the product's Postgres row lock and written to
// Redis before the lock is released, so no commit lands between the two.
// Restored: the total and sold counts, holds Postgres has as HELD and not yet
// due (oldest first, while they fit in total - sold; the rest are recorded as
// expired, and marked so in the ledger before the SKU goes live, so that a
// sale of one begun before the rebuild is refused as expired: see
// statusDrop), sales of the retention window (so a repeated commit replays),
// cancelled and expired reservations of the idempotency window (so their key
// replays them), and each principal's quota count. Holds that never reached
// Postgres are lost with Redis, and their units return to stock. Before the
// SKU goes live, every row the snapshot read is made durable
// (db.Snapshot.Seal): a batch the write-behind committed without waiting
// for its WAL is visible at once, and a crash of PostgreSQL must not take
// back a hold Redis then has.
//
// Before the snapshot, every event of the SKU still in its partition's
// outbox is applied to the ledger (applyOutboxOf): events Redis accepted that
// the write-behind had not applied yet, a hold's reserve or its ending. When
// Redis kept the outbox but not the SKU (a reload after a promotion dropped
// the stock hash, or the hash alone was lost), the rebuild restores those
// holds as Redis had them instead of reading an older ledger. Whichever
// caller rebuilds, the lazy path of a request or the rebuilder, does it: no
// script adds an event of the SKU while its stock hash is missing, so
// nothing the snapshot should see is left in the outbox.
//
// The writing is cut into chunks of RebuildBatch reservations, one script
// each, so no script blocks Redis for long however big the SKU is: a
// generation is staged first (stage_rebuild.lua), each chunk is written under
// it (hydrate_sku.lua), and the SKU goes live last (publish_sku.lua). Until
// then readers find no SKU and wait for the rebuild; a rebuild whose stage was
// replaced by a newer one can write nothing more.
func (e *Engine) Rebuild(ctx context.Context, sku string) error {
	defer e.adding(sku)()
	_, err, _ := e.rebuild.Do(sku, func() (any, error) {
		// Detach from the first caller's cancellation: others wait on this.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rebuildTimeout)
		defer cancel()
		return nil, e.rebuildOnce(ctx, sku)
	})
	return err
}

// RebuildStale reloads a SKU from Postgres although Redis has it: after a
// replica was promoted (or the primary restarted from its files), Redis may
// be missing the last writes before the switch (async replication), so its
// state of the SKU can be older than the ledger's (a sale Postgres has,
// whose hold Redis still has as HELD). The stock hash is dropped and the
// SKU rebuilt as after a loss: under the product's row lock, from the
// ledger; scripts meanwhile wait for the rebuild as they do after a flush.
//
// Holds Redis kept whose events are still in the outbox (the write-behind
// had not applied them) are acknowledged holds the promoted Redis did not
// lose: the rebuild applies the SKU's outbox to the ledger before its
// snapshot (ApplyEvents is idempotent, and a reservation only moves
// forward), so it restores those holds with the others instead of handing
// their units to other buyers until the write-behind brings them back. A
// request that finds the SKU missing once the stock hash is dropped rebuilds
// it the same way (Rebuild), so it does not matter which of the two rebuilds.
func (m *Maintenance) RebuildStale(ctx context.Context, sku string) error {
	e := m.e
	defer e.adding(sku)()
	if err := e.rdb.Del(ctx, e.keys.SKU(sku)).Err(); err != nil {
		return unavailable("dropping stale "+sku, err)
	}
	return e.Rebuild(ctx, sku)
}

// applyOutboxOf applies to the ledger the reservation events of sku that
// its partition's outbox still holds, acknowledged or not (the write-behind
// trims what it acknowledged, so the stream is short).
func (e *Engine) applyOutboxOf(ctx context.Context, sku string) error {
	stream := e.keys.Outbox(e.keys.PartitionOf(sku))
	start := "-"
	for {
		msgs, err := e.rdb.XRangeN(ctx, stream, start, "+", int64(e.cfg.RebuildBatch)).Result()
		if err != nil {
			return unavailable("reading the outbox of "+sku, err)
		}
		var events []db.Event
		for _, m := range msgs {
			ev, err := ParseEvent(m)
			if err != nil || ev.SKU != sku || db.IsWaitlistKind(ev.Kind) || ev.Validate() != nil {
				continue // the write-behind sets what cannot be applied aside
			}
			events = append(events, ev)
		}
		if len(events) > 0 {
			err := e.ledger.ApplyEvents(ctx, nil, events)
			switch {
			case errors.Is(err, db.ErrRefused):
				// Left to the write-behind, which sets the event at fault aside.
				e.log.Warn().Err(err).Str("sku", sku).Msg("Postgres refused the outbox of a SKU before its reload; the write-behind applies it")
			case err != nil:
				return unavailable("applying the outbox of "+sku+" before its reload", err)
			}
		}
		if len(msgs) < e.cfg.RebuildBatch {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// rebuildStats are the figures of one rebuild, logged when it published.
type rebuildStats struct {
	published    bool
	reservations int
	dropped      int
	quotaEntries int
	chunks       int
	longestChunk time.Duration
	inScripts    time.Duration // summed round trips of the chunks
	firstRows    time.Duration // until Postgres sent the first rows, from the lock
}

func (e *Engine) rebuildOnce(ctx context.Context, sku string) error {
	// Where the SKU's keys live, and its drop, come from the ledger first: a
	// SKU another instance put in a drop is placed here before any key of
	// it is read or written, and its drop's copy in Redis is brought up to
	// date before the SKU can go live (or when Redis lost only the drop).
	drop, err := e.ledger.Drops().ProductDrop(ctx, sku)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return productNotFound(sku)
	case err != nil:
		return unavailable("rebuilding "+sku, err)
	}
	place(e.keys, sku, drop)
	if drop != "" {
		if err := e.applyDrop(ctx, drop); err != nil {
			return err
		}
	}
	if n, err := e.rdb.Exists(ctx, e.keys.SKU(sku)).Result(); err != nil {
		return unavailable("rebuilding "+sku, err)
	} else if n == 1 {
		return nil
	}
	if err := e.applyOutboxOf(ctx, sku); err != nil {
		return err
	}
	start := time.Now()
	var st rebuildStats
	for try := 1; ; try++ {
		st = rebuildStats{}
		err = e.ledger.WithSnapshot(ctx, sku, e.cfg.Retention, e.cfg.IdempotencyTTL, func(s *db.Snapshot) error {
			return e.hydrate(ctx, s, &st)
		})
		if !errors.Is(err, db.ErrRowsBusy) || try == rebuildBusyTries {
			break
		}
		// A sale of a hold this rebuild would record as expired is being
		// written, waiting for the product's lock: let it end, then read
		// again (it is a sale then).
		e.log.Info().Str("sku", sku).Int("try", try).Msg("a sale of a hold the rebuild drops is being written; rebuilding again")
		select {
		case <-ctx.Done():
			return unavailable("rebuilding "+sku, ctx.Err())
		case <-time.After(time.Duration(try) * 20 * time.Millisecond):
		}
	}
	switch {
	case errors.Is(err, errRebuildExists):
		return nil // loaded by another meanwhile; nothing of this one was kept
	case errors.Is(err, db.ErrNotFound):
		return productNotFound(sku)
	case errors.Is(err, ErrUnavailable):
		return err
	case err != nil:
		return unavailable("rebuilding "+sku, err)
	}
	if st.published {
		e.metrics.rebuilds.Inc()
		e.log.Info().Str("sku", sku).Int("reservations", st.reservations).Int("dropped", st.dropped).
			Int("quota_entries", st.quotaEntries).Int("chunks", st.chunks).
			Int64("first_rows_ms", st.firstRows.Milliseconds()).
			Int64("longest_chunk_ms", st.longestChunk.Milliseconds()).Int64("chunks_ms", st.inScripts.Milliseconds()).
			Int64("took_ms", time.Since(start).Milliseconds()).
			Msg("rebuilt SKU in Redis from Postgres")
	}
	return nil
}

// rebuildBusyTries is how many times a rebuild takes its snapshot again
// when a sale of a hold it drops is being written (db.ErrRowsBusy).
const rebuildBusyTries = 5

// errRebuildExists stops a rebuild that finds the SKU loaded by another;
// errRebuildSuperseded one whose stage a newer rebuild has replaced.
var (
	errRebuildExists     = errors.New("SKU loaded meanwhile")
	errRebuildSuperseded = errors.New("a newer rebuild has staged")
)

// statusDrop marks, for hydrate_sku.lua, a hold Postgres still has as HELD
// that is past due or no longer fits the stock, or that an earlier rebuild
// dropped (its expire event has not reached the ledger): it is recorded as
// expired, and marked so in the ledger (db.Snapshot.Seal) before the
// SKU is published, so that a sale of it begun before the rebuild and
// written after is refused as expired rather than sold on top of the buyer
// the unit went to.
const statusDrop = "DROP"

// hydrate writes a snapshot into Redis: stage, chunks, publish. It returns
// nil without writing when the SKU is loaded already.
func (e *Engine) hydrate(ctx context.Context, s *db.Snapshot, st *rebuildStats) error {
	p := s.Product
	stagingTTL := int64(rebuildStagingTTL.Seconds())
	staged, err := script.RunStageRebuild(ctx, e.run, e.keys, script.StageRebuild{SKU: p.SKU, StagingTTL: stagingTTL})
	if err != nil {
		return err
	}
	if replyCode(staged.Code) == codeExists {
		return nil
	}
	gen := staged.Generation
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return unavailable("reading Redis time", err)
	}
	c := chunker{e: e, st: st, head: script.HydrateSKU{SKU: p.SKU, Generation: gen,
		Retention: int64(e.cfg.Retention.Seconds()), IdempotencyTTL: int64(e.cfg.IdempotencyTTL.Seconds()), StagingTTL: stagingTTL,
	}, quota: map[string]int{}}
	room, held := p.Total-p.Sold, 0
	var dropped []string
	query := time.Now()
	err = s.Reservations(ctx, e.cfg.RebuildBatch, func(rs []db.Reservation) error {
		if st.firstRows == 0 {
			st.firstRows = time.Since(query)
		}
		for _, r := range rs {
			status := r.Status
			ended := timeMs(r.EndedAt)
			if status == db.StatusHeld {
				if r.DroppedAt != nil || !r.ExpiresAt.After(now) || r.Quantity > room-held {
					status, ended = statusDrop, now.UnixMilli() // recorded as expired now, with its event
					st.dropped++
					dropped = append(dropped, r.Token)
				} else {
					held += r.Quantity
					c.quota[r.Principal] += r.Quantity
				}
			}
			c.holds = append(c.holds, script.HydrateHold{Token: r.Token, Principal: r.Principal, Quantity: r.Quantity,
				Status: status, ExpiresMs: r.ExpiresAt.UnixMilli(), CreatedMs: r.CreatedAt.UnixMilli(),
				CommittedMs: timeMs(r.CommittedAt), EndedMs: ended, Idem: r.IdempotencyHash, FP: r.RequestHash,
				Extensions: r.Extensions})
			st.reservations++
		}
		return c.flush(ctx)
	})
	if err == nil {
		err = s.Bought(ctx, e.cfg.RebuildBatch, func(bs []db.Bought) error {
			for _, b := range bs {
				c.quota[b.Principal] += b.Units
			}
			return c.flush(ctx)
		})
	}
	// Whatever happened, no chunk may still be in flight once this returns.
	if werr := c.wait(); err == nil {
		err = werr
	}
	if errors.Is(err, errRebuildExists) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := e.stageWaitlist(ctx, s, gen, stagingTTL); err != nil {
		return err
	}
	if fn := e.restoreQueue.Load(); fn != nil && p.Queued {
		// The queue's passes first: a reserve of the SKU checks them.
		id := db.QueueID("sku", p.SKU)
		if p.DropID != "" {
			id = db.QueueID("drop", p.DropID)
		}
		if err := (*fn)(ctx, id); err != nil {
			return err
		}
	}
	// Last before the SKU goes live: the ledger learns which of its HELD rows
	// Redis now has as expired (a sale of one written from now on is
	// refused), and every row the snapshot read is on disk, so a crash of
	// PostgreSQL cannot take back a hold the SKU goes live with.
	if err := s.Seal(ctx, dropped); err != nil {
		return err
	}
	r, err := script.RunPublishSKU(ctx, e.run, e.keys, script.PublishSKU{SKU: p.SKU, Generation: gen, Chunks: st.chunks,
		Total: p.Total, Sold: p.Sold, MaxPerUser: p.MaxPerUser, StartsMs: timeMs(p.SaleStartsAt), EndsMs: timeMs(p.SaleEndsAt),
		Version: p.Version, Held: held, Available: room - held, Nonce: newNonce(), Drop: p.DropID,
		Mode: string(policy.ModeOf(p.Draw, p.Queued))})
	if err != nil {
		return err
	}
	switch replyCode(r.Code) {
	case codeOK:
		st.published = true
		if e.rebuildPublished != nil {
			e.rebuildPublished(p.SKU)
		}
		return nil
	case codeExists:
		return errRebuildExists // the SKU is another rebuild's; the marks, committed before, stay
	default:
		return unavailable("rebuilding "+p.SKU, errRebuildSuperseded)
	}
}

// chunker collects a rebuild's holds and quota counts and writes them as
// hydrate_sku.lua chunks, in order. One chunk is in flight while the next is
// read from Postgres and laid out, so Redis and Postgres work at once; the
// chunk numbers keep them in order and exactly once.
type chunker struct {
	e       *Engine
	head    script.HydrateSKU // the rebuild's arguments, with no holds or counts
	holds   []script.HydrateHold
	quota   map[string]int
	st      *rebuildStats
	pending chan error // the chunk in flight, nil when none
}

// flush sends what was collected as the next chunk, once the previous one
// has been written.
func (c *chunker) flush(ctx context.Context) error {
	if len(c.holds) == 0 && len(c.quota) == 0 {
		return nil
	}
	chunk := c.head
	chunk.Holds = slices.Clone(c.holds)
	chunk.Quota = make([]script.QuotaCount, 0, len(c.quota))
	for who, n := range c.quota {
		chunk.Quota = append(chunk.Quota, script.QuotaCount{Principal: who, Units: n})
	}
	c.st.quotaEntries += len(c.quota)
	c.holds = c.holds[:0]
	clear(c.quota)
	if err := c.wait(); err != nil {
		return err
	}
	seq := c.st.chunks
	chunk.Chunk = seq
	c.st.chunks++
	c.pending = make(chan error, 1)
	go func() { c.pending <- c.write(ctx, seq, chunk) }()
	return nil
}

// wait returns the outcome of the chunk in flight, if any.
func (c *chunker) wait() error {
	if c.pending == nil {
		return nil
	}
	err := <-c.pending
	c.pending = nil
	return err
}

func (c *chunker) write(ctx context.Context, seq int, chunk script.HydrateSKU) error {
	start := time.Now()
	r, err := script.RunHydrateSKU(ctx, c.e.run, c.e.keys, chunk)
	if err != nil {
		return fmt.Errorf("writing chunk %d: %w", seq, err)
	}
	c.st.longestChunk = max(c.st.longestChunk, time.Since(start))
	c.st.inScripts += time.Since(start)
	switch replyCode(r.Code) {
	case codeOK, codeDone:
		return nil
	case codeExists:
		return errRebuildExists
	default:
		return unavailable("rebuilding "+c.head.SKU, errRebuildSuperseded)
	}
}

// stageWaitlist writes the SKU's waitlist as the ledger has it (the entries
// not LEFT, in queue order) under the rebuild's generation, in chunks of
// RebuildBatch; publish_sku.lua makes it live with the rest.
func (e *Engine) stageWaitlist(ctx context.Context, s *db.Snapshot, gen string, stagingTTL int64) error {
	sku := s.Product.SKU
	maxSeq, err := s.MaxWaitlistSeq(ctx)
	if err != nil {
		return err
	}
	first := true
	write := func(entries []db.WaitlistEntry) error {
		chunk := script.StageWaitlist{SKU: sku, Generation: gen, StagingTTL: stagingTTL, MaxSeq: maxSeq, First: first}
		first = false
		for _, w := range entries {
			st := "W"
			if w.Status == db.WaitOffered {
				st = "O"
			}
			chunk.Entries = append(chunk.Entries, script.WaitlistEntry{Principal: w.Principal, Seq: w.Seq, Quantity: w.Quantity,
				HoldMs: w.HoldMillis, Status: st, Token: w.Token, JoinedMs: w.JoinedAt.UnixMilli()})
		}
		r, err := script.RunStageWaitlist(ctx, e.run, e.keys, chunk)
		if err != nil {
			return fmt.Errorf("staging the waitlist of %s: %w", sku, err)
		}
		switch replyCode(r.Code) {
		case codeOK:
			return nil
		case codeExists:
			return errRebuildExists
		default:
			return unavailable("rebuilding "+sku, errRebuildSuperseded)
		}
	}
	if err := write(nil); err != nil { // clears, and sets the seq floor even for an empty waitlist
		return err
	}
	return s.Waitlist(ctx, e.cfg.RebuildBatch, write)
}
