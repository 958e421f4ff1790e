package inventory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// Maintenance is the engine's upkeep, as the worker group runs it: expiring
// due holds, applying the outbox to the ledger, closing commits and holds a
// crash left half-done, rebuilding SKUs Redis lost, re-applying products,
// letting go of stale carts and running due draws. None of it is a buyer's
// or an admin's request, so it is not on Engine: the App hands it to
// worker.NewGroup, and nothing else holds one.
type Maintenance struct {
	e *Engine
}

// Maintenance returns the engine's upkeep calls, for the worker group.
func (e *Engine) Maintenance() *Maintenance { return &Maintenance{e: e} }

// Engine is the engine the upkeep runs on, for the requests the worker group
// makes as any caller would (running a draw, listing products).
func (m *Maintenance) Engine() *Engine { return m.e }

// Keys is the engine's key layout.
func (m *Maintenance) Keys() Keys { return m.e.keys }

// Config is the engine's settings with defaults filled in.
func (m *Maintenance) Config() Config { return m.e.cfg }

// Ledger is the Postgres ledger, for the workers that read it alone (the
// webhook dispatcher).
func (m *Maintenance) Ledger() *db.Ledger { return m.e.ledger }

// The engine's maintenance steps, run by the worker group: expiring due holds,
// finishing commits a crash left half-done (the outbox is in outbox.go; the
// others are with what they maintain: carts, draws, products, rebuilds).

// Expired describes one hold released by expiry.
type Expired struct {
	Token string
	SKU   string
	// Delay is how long after its expiresAt the units became available again.
	Delay time.Duration
}

// ExpireDue releases up to limit due holds of one partition, each through the
// same idempotent script as Cancel, and reports what it released. A hold
// already released, committed or not yet due is left alone.
func (m *Maintenance) ExpireDue(ctx context.Context, partition, limit int) ([]Expired, error) {
	e := m.e
	return e.expireDue(ctx, partition, limit, true)
}

func (e *Engine) expireDue(ctx context.Context, partition, limit int, reload bool) ([]Expired, error) {
	r, err := script.RunDueHolds(ctx, e.run, e.keys, script.DueHolds{Partition: partition, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("listing due holds: %w", err)
	}
	tokens := r.Tokens
	if len(tokens) == 0 {
		return nil, nil
	}
	// One round trip for the whole batch; each release is its own script.
	cmds := make([]*redis.Cmd, len(tokens))
	release := e.scripts[lua.ReleaseHold]
	_, err = e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, tok := range tokens {
			c := e.releaseArgs(partition, tok, Principal{}, string(StatusExpired)).Call(e.keys)
			cmds[i] = release.EvalSha(ctx, p, c.Keys, c.Argv...)
		}
		return nil
	})
	if err != nil && isNoScript(err) && reload {
		// SCRIPT FLUSH under way: load once and go again.
		if lerr := e.LoadScripts(ctx); lerr != nil {
			return nil, lerr
		}
		return e.expireDue(ctx, partition, limit, false)
	}
	var out []Expired
	var lostSKUs []string
	for i, c := range cmds {
		vals, err := c.Slice()
		if err != nil {
			if errors.Is(err, redis.Nil) {
				continue
			}
			return out, unavailable("expiring holds", err)
		}
		res := script.HoldOf(vals)
		if replyCode(res.Code) == codeNeedsHydration {
			if sku := res.Missing; !slices.Contains(lostSKUs, sku) {
				lostSKUs = append(lostSKUs, sku)
			}
			continue
		}
		if replyCode(res.Code) != codeOK || res.Replayed {
			continue // not due, committed, gone, or released by someone else first
		}
		h := holdOf(res).reservation()
		out = append(out, Expired{Token: tokens[i], SKU: h.SKU, Delay: h.EndedAt.Sub(h.ExpiresAt)})
	}
	// A due hold whose SKU Redis lost: rebuild the SKU, and the next pass
	// releases the hold (if Postgres knew it) or drops the token. One SKU
	// that cannot be rebuilt does not keep the others from it.
	var errs []error
	for _, sku := range lostSKUs {
		if err := e.Rebuild(ctx, sku); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// ReconcileCommits finishes the commits of one partition that have been
// COMMITTING for longer than olderThan (a server crashed between its Postgres
// write and its Redis update, or the write's outcome was unknown). It asks
// Postgres whether the sale exists: if so the hold becomes COMMITTED,
// otherwise it goes back to HELD with its original expiry, unless the ledger
// has the reservation as ended, or as HELD marked dropped by a rebuild (then
// it is released as the ledger's ending, or as expired). olderThan must
// exceed any commit's Postgres timeout, so a write still in flight is never
// judged. It returns how many commits it settled.
func (m *Maintenance) ReconcileCommits(ctx context.Context, partition int, olderThan time.Duration, limit int) (int, error) {
	e := m.e
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return 0, unavailable("reading Redis time", err)
	}
	cutoff := now.Add(-olderThan).UnixMilli()
	tokens, err := e.rdb.ZRangeByScore(ctx, e.keys.Committing(partition), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff, 10), Count: int64(limit),
	}).Result()
	if err != nil {
		return 0, unavailable("listing stuck commits", err)
	}
	settled := 0
	for _, tok := range tokens {
		h, err := e.rdb.HGetAll(ctx, e.keys.Hold(partition, tok)).Result()
		if err != nil {
			return settled, unavailable("reading hold", err)
		}
		if len(h) == 0 {
			e.rdb.ZRem(ctx, e.keys.Committing(partition), tok)
			continue
		}
		// The attempt id is read before Postgres is asked: if an attempt joins
		// meanwhile, the RESTORE below no longer matches and changes nothing.
		stored := holdFromHash(tok, h)
		hold, attemptID := stored.reservation(), stored.attempt
		sale, err := e.ledger.Sales().Sale(ctx, tok)
		var res Reservation
		switch {
		case err == nil:
			res, err = e.finishCommit(ctx, tok, hold, outcomeCommitted, sale.CommittedAt, attemptID)
		case errors.Is(err, db.ErrNotFound):
			// No sale. A hold the ledger has as finished is released as such
			// (no commit can sell it), and so is one it has as HELD marked
			// dropped (a rebuild recorded it as expired, and the ledger
			// refuses its sale): it is released as expired, as that rebuild
			// did. Any other goes back to HELD.
			outcome := outcomeRestore
			row, rerr := e.ledger.Reservations().Reservation(ctx, tok)
			switch {
			case rerr == nil && (row.Status == db.StatusCancelled || row.Status == db.StatusExpired):
				outcome = row.Status
			case rerr == nil && row.Status == db.StatusHeld && row.DroppedAt != nil:
				outcome = db.StatusExpired
			case rerr != nil && !errors.Is(rerr, db.ErrNotFound):
				return settled, unavailable("checking reservation", rerr)
			}
			res, err = e.finishCommit(ctx, tok, hold, outcome, time.Time{}, attemptID)
		default:
			return settled, unavailable("checking sale", err)
		}
		if err != nil {
			return settled, err
		}
		if !res.Replayed {
			settled++
			e.log.Info().Str("token", tok).Str("sku", hold.SKU).Str("status", string(res.Status)).Msg("reconciled a half-done commit")
		}
	}
	return settled, nil
}

// OldestHolds returns Redis' clock and, for each of partitions, when its
// oldest HELD hold is due (ZRANGE ... 0 0 WITHSCORES on its expiry index, one
// pipeline for all). A partition with no hold, or whose index could not be
// read (one partition's failure, its owner's to report), is absent; it fails
// only when Redis itself does.
func (m *Maintenance) OldestHolds(ctx context.Context, partitions []int) (time.Time, map[int]time.Time, error) {
	e := m.e
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("reading Redis time: %w", err)
	}
	cmds := make(map[int]*redis.ZSliceCmd, len(partitions))
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, p := range partitions {
			cmds[p] = pipe.ZRangeWithScores(ctx, e.keys.Expiry(p), 0, 0)
		}
		return nil
	})
	if err != nil && len(cmds) > 0 && !slices.ContainsFunc(slices.Collect(maps.Values(cmds)), func(c *redis.ZSliceCmd) bool { return c.Err() == nil }) {
		return time.Time{}, nil, fmt.Errorf("reading the oldest holds: %w", err) // Redis itself failed
	}
	out := make(map[int]time.Time, len(cmds))
	for p, c := range cmds {
		z, err := c.Result()
		if err != nil || len(z) == 0 {
			continue
		}
		out[p] = time.UnixMilli(int64(z[0].Score))
	}
	return now, out, nil
}

// RebuildMissing rebuilds sku from the ledger unless Redis has it, and says
// whether it tried: false when the lazy path or another process was first.
// A SKU the ledger does not know counts as tried.
func (m *Maintenance) RebuildMissing(ctx context.Context, sku string) (bool, error) {
	e := m.e
	present, err := e.rdb.Exists(ctx, e.keys.SKU(sku)).Result()
	if err != nil {
		return false, fmt.Errorf("checking %s: %w", sku, err)
	}
	if present == 1 {
		return false, nil
	}
	if err := e.Rebuild(ctx, sku); err != nil && !errors.Is(err, ErrNotFound) {
		return false, fmt.Errorf("rebuilding %s: %w", sku, err)
	}
	return true, nil
}
