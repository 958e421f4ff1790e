package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
)

// Telling Redis what the ledger says, for the holds a rebuild could not know
// as the ledger knows them now. A rebuild reads the ledger under the
// product's row lock, but the write-behind may hold events of the SKU's
// earlier life that it read from the outbox before Redis lost its data and
// writes after the rebuild: a cancel, an expiry, a reserve. Each such event
// carries the generation the hold lived in; after writing a batch, the worker
// calls ReconcileApplied, which finds the events whose SKU has since been
// rebuilt and runs reconcile_hold.lua for their tokens with the ledger's
// current row.

// ReconcileApplied makes Redis agree with the ledger for the holds of events
// just applied to it whose SKU was rebuilt since they were written (their
// generation is no longer the SKU's): a hold the ledger has as cancelled or
// expired and the rebuild restored as HELD is released; one Redis has ended
// the other way (the rebuild recorded as expired a hold whose cancel reached
// the ledger only afterwards) takes the ledger's ending, which the ledger
// never changes; a hold the ledger has as HELD and the rebuild did not know
// is adopted if the stock and the quota allow, or else recorded as expired
// (an expire event). It returns how many holds it changed. In the normal
// case (no rebuild) it costs one pipelined HGET per SKU of the batch; when a
// hold is told, the rows read are made durable first (db.Ledger.FlushWAL).
func (m *Maintenance) ReconcileApplied(ctx context.Context, partition int, events []db.Event) (int, error) {
	e := m.e
	for _, ev := range events {
		e.keys.PlaceAt(ev.SKU, partition) // the batch is of this partition's outbox
	}
	gens := map[string]*redis.StringCmd{}
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, ev := range events {
			if ev.Gen != "" && ev.Kind != "commit" && gens[ev.SKU] == nil {
				gens[ev.SKU] = p.HGet(ctx, e.keys.SKU(ev.SKU), "gen")
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, unavailable("reading SKU generations", err)
	}
	seen := map[string]bool{}
	var tokens []string
	for _, ev := range events {
		c := gens[ev.SKU]
		if c == nil || seen[ev.Token] || ev.Kind == "commit" || ev.Gen == "" {
			continue
		}
		// A missing SKU is rebuilt from the ledger, which has the batch.
		if gen, err := c.Result(); err == nil && gen != ev.Gen {
			seen[ev.Token] = true
			tokens = append(tokens, ev.Token)
		}
	}
	if len(tokens) == 0 {
		return 0, nil
	}
	rows, err := e.ledger.Reservations().ReservationsByToken(ctx, tokens)
	if err != nil {
		return 0, unavailable("reading reservations", err)
	}
	// The batch may have been committed without waiting for its WAL (its
	// events stay pending until it is on disk, but events of a SKU rebuilt
	// since may be of an outbox Redis lost): it is made durable before Redis
	// adopts a hold of it, so that a crash of PostgreSQL cannot take it back.
	if err := e.ledger.FlushWAL(ctx); err != nil {
		return 0, unavailable("flushing the ledger", err)
	}
	changed := 0
	for _, tok := range tokens {
		r, ok := rows[tok]
		if !ok || r.Status == db.StatusCommitted {
			continue // a sale is written to the ledger before Redis, and a rebuild reads it
		}
		code, err := e.reconcileHold(ctx, partition, r)
		if err != nil {
			return changed, err
		}
		if code != codeAgrees && code != codeNeedsHydration {
			changed++
			e.log.Info().Str("token", tok).Str("sku", r.SKU).Str("ledger", r.Status).Str("outcome", string(code)).
				Msg("told a rebuilt SKU what the ledger says of a hold")
		}
	}
	return changed, nil
}

// generationsOf lists each SKU and generation that events carry, once per
// pair, for the events ReconcileApplied looks at: a hold's event of a SKU's
// life in Redis, other than a commit (a sale is in the ledger before Redis).
func generationsOf(events []db.Event) (skus, gens []string) {
	type pair struct{ sku, gen string }
	seen := map[pair]bool{}
	for _, ev := range events {
		k := pair{ev.SKU, ev.Gen}
		if ev.Gen == "" || ev.Kind == "commit" || seen[k] {
			continue
		}
		seen[k] = true
		skus, gens = append(skus, ev.SKU), append(gens, ev.Gen)
	}
	return skus, gens
}

// CloseOverdueHolds closes holds of one partition that the ledger has as
// HELD more than grace past their expiry, and returns how many it closed:
//
//   - one Redis does not have in its SKU's current generation (a reserve
//     whose event reached the ledger after its SKU was rebuilt without it,
//     when nothing told Redis: a crash between the write and
//     ReconcileApplied) is closed as EXPIRED in Redis, with its expire
//     event;
//   - one Redis has ended in that generation (EXPIRED or CANCELLED) is an
//     ending whose event has not reached the ledger in all that time (it
//     was lost, or the write-behind of the partition is stuck): Redis is
//     the authority for a hold the ledger has as HELD;
//   - one Redis has HELD, COMMITTING or COMMITTED is left alone: the
//     sweeper and the commit path own it.
//
// The ending of the first two is written to the ledger here, directly
// (db.Ledger.ApplyEvents; the write-behind is not relied on, since its
// failing is one way such rows come about), exactly once: the movement is
// keyed by the ending's event id, which the outbox event shares, and a
// second pass no longer finds the row HELD.
//
// It looks at up to overduePages pages of limit rows (holds Redis has do not
// hide the others).
func (m *Maintenance) CloseOverdueHolds(ctx context.Context, partition int, grace time.Duration, limit int) (int, error) {
	e := m.e
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return 0, unavailable("reading Redis time", err)
	}
	closed := 0
	// Holds made by reserve and the lines of carts: their tokens differ in
	// their first letter only.
	for _, kind := range []byte{tokenHold, tokenLine} {
		n, err := e.closeOverdueOf(ctx, fmt.Sprintf("%c%02d.", kind, partition), partition, now.Add(-grace), limit)
		closed += n
		if err != nil {
			return closed, err
		}
	}
	return closed, nil
}

func (e *Engine) closeOverdueOf(ctx context.Context, prefix string, partition int, before time.Time, limit int) (int, error) {
	closed := 0
	var afterExp time.Time
	afterToken := ""
	for range overduePages {
		rows, err := e.ledger.Reservations().OverdueHeld(ctx, prefix, before, afterExp, afterToken, limit)
		if err != nil {
			return closed, unavailable("listing overdue holds", err)
		}
		n, err := e.closeOverdue(ctx, partition, rows)
		closed += n
		if err != nil || len(rows) < limit {
			return closed, err
		}
		afterExp, afterToken = rows[len(rows)-1].ExpiresAt, rows[len(rows)-1].Token
	}
	return closed, nil
}

// overduePages bounds one CloseOverdueHolds call; the next pass goes on.
const overduePages = 10

func (e *Engine) closeOverdue(ctx context.Context, partition int, rows []db.Reservation) (int, error) {
	closed := 0
	for _, r := range rows {
		res, err := e.reconcileHoldReply(ctx, partition, r)
		if err != nil {
			return closed, err
		}
		switch replyCode(res.Code) {
		case codeClosed, codeAgrees:
			ev, ended := endedHold(res, r)
			if !ended {
				continue // Redis has it as HELD or being committed
			}
			if err := e.ledger.ApplyEvents(ctx, nil, []db.Event{ev}); err != nil {
				return closed, unavailable("recording the ending of hold "+r.Token, err)
			}
			closed++
			if replyCode(res.Code) == codeClosed {
				e.log.Warn().Str("token", r.Token).Str("sku", r.SKU).
					Msg("closed a hold the ledger had as HELD past its expiry and Redis did not have")
			} else {
				e.log.Warn().Str("token", r.Token).Str("sku", r.SKU).Str("event", ev.ID).
					Msg("recorded in the ledger the ending of a hold it had as HELD past its expiry: Redis had ended it and its event had not reached the ledger")
			}
		case codeNeedsHydration:
			// The rebuild records an overdue hold as expired itself.
			if err := e.Rebuild(ctx, r.SKU); err != nil && !errors.Is(err, ErrNotFound) {
				return closed, err
			}
		}
	}
	return closed, nil
}

// reconcileHold runs reconcile_hold.lua for one ledger row and returns its code.
func (e *Engine) reconcileHold(ctx context.Context, partition int, r db.Reservation) (replyCode, error) {
	res, err := e.reconcileHoldReply(ctx, partition, r)
	if err != nil {
		return "", err
	}
	return replyCode(res.Code), nil
}

// reconcileHoldReply runs reconcile_hold.lua for one ledger row and returns
// its reply, whose code is one the script documents.
func (e *Engine) reconcileHoldReply(ctx context.Context, partition int, r db.Reservation) (script.ReconcileReply, error) {
	res, err := script.RunReconcileHold(ctx, e.run, e.keys, script.ReconcileHold{
		Partition: partition, Token: r.Token, Status: r.Status, SKU: r.SKU, Principal: r.Principal, Quantity: r.Quantity,
		ExpiresMs: r.ExpiresAt.UnixMilli(), CreatedMs: r.CreatedAt.UnixMilli(), Idem: r.IdempotencyHash, FP: r.RequestHash,
		Retention: int64(e.cfg.Retention.Seconds()), IdempotencyTTL: int64(e.cfg.IdempotencyTTL.Seconds()),
		Extensions: r.Extensions, Nonce: newNonce(), Dropped: r.Status == db.StatusHeld && r.DroppedAt != nil,
	})
	if err != nil {
		return res, fmt.Errorf("reconciling hold %s: %w", r.Token, err)
	}
	switch code := replyCode(res.Code); code {
	case codeAgrees, codeReleased, codeAdopted, codeClosed, codeRestated, codeNeedsHydration:
		return res, nil
	default:
		return res, fmt.Errorf("reconciling hold %s: unexpected script reply %q", r.Token, code)
	}
}
