package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Commit turns a principal's hold into a sale. It is durable first: the hold
// is moved out of reach of expiry (begin_commit.lua), the sale is written to
// Postgres (idempotent on the token), and only then is Redis marked
// (finish_commit.lua). A success is in Postgres before it is returned.
//
// Committing the same token again returns the same reservation with Replayed
// set and writes nothing. Other outcomes: ErrExpired, ErrAlreadyCancelled,
// *NotFoundError, ErrForbidden, *OutOfStockError (Postgres refused the sale
// after Redis lost state), ErrUnavailable (retry: Postgres was unreachable and
// the hold is back to HELD with its original expiry, or the outcome is not
// known yet and the hold waits, out of reach of expiry, for a retry or the
// commit reconciler).
func (e *Engine) Commit(ctx context.Context, p Principal, token string) (res Reservation, err error) {
	defer func() { e.metrics.outcome("commit", err) }()
	partition, err := parseToken(token)
	if err != nil {
		return Reservation{}, err
	}
	if isCartLine(token) {
		return Reservation{}, errCartLine
	}
	if err := checkPrincipal(p); err != nil {
		return Reservation{}, err
	}
	// One id for this attempt, sent with every begin_commit call: a call the
	// Redis client repeats after a lost reply is recognised as this attempt.
	attemptID := newAttemptID()
	nonce := newNonce()
	for try := 0; ; try++ {
		res, err := script.RunBeginCommit(ctx, e.run, e.keys, script.BeginCommit{Partition: partition, Token: token,
			Principal: p.ID, Retention: int64(e.cfg.Retention.Seconds()), Attempt: attemptID, Nonce: nonce})
		if err != nil {
			return Reservation{}, fmt.Errorf("committing %s: %w", token, err)
		}
		switch replyCode(res.Code) {
		case codeOK:
			h := holdOf(res.Hold).reservation()
			if h.Status == StatusCommitted {
				return h, nil
			}
			return e.writeSale(ctx, token, h, attemptOf(res))
		case replyOf(ErrForbidden):
			return Reservation{}, ErrForbidden
		case replyOf(ErrExpired), replyOf(ErrAlreadyCancelled):
			return e.refusedUnlessSold(ctx, token, replyCode(res.Code))
		case codeNeedsHydration:
			if try > 0 {
				return Reservation{}, fmt.Errorf("committing %s: SKU still missing after rebuild", token)
			}
			if err := e.Rebuild(ctx, res.Missing); err != nil {
				return Reservation{}, fmt.Errorf("committing %s: %w", token, err)
			}
		case replyOf(ErrNotFound):
			if try > 0 {
				return Reservation{}, reservationNotFound(token)
			}
			rebuilt, h, err := e.fromLedger(ctx, p, token)
			if err != nil || !rebuilt {
				return e.commitAnswerFromLedger(h, err)
			}
			continue // the SKU was rebuilt with this hold: try again
		default:
			return Reservation{}, fmt.Errorf("committing %s: unexpected script reply %q", token, res.Code)
		}
	}
}

// attempt identifies one commit attempt of a hold (begin_commit.lua's cst).
// Only the attempt that moved the hold out of HELD may put it back, and only
// while no other attempt has joined since.
type attempt struct {
	id    string
	moved bool
	// idem and fp are the hold's idempotency hash and request fingerprint:
	// the sale row records them, so the key replays the sale even when the
	// reserve event never reached the ledger.
	idem, fp string
}

func newAttemptID() string { return core.NewAttemptID() }

// refusedUnlessSold answers a commit that Redis refuses as expired or
// cancelled, unless Postgres has the sale: a Redis that came back with older
// state (a stale replica, an old snapshot) must not deny a durable sale.
func (e *Engine) refusedUnlessSold(ctx context.Context, token string, code replyCode) (Reservation, error) {
	sale, err := e.ledger.Sales().Sale(ctx, token)
	if err == nil {
		e.log.Warn().Str("token", token).Str("sku", sale.SKU).Msg("Redis refused a commit Postgres has: Redis state is older than the ledger")
		return Reservation{Token: token, SKU: sale.SKU, Principal: sale.Principal, Quantity: sale.Quantity,
			Status: StatusCommitted, CommittedAt: utcPtr(&sale.CommittedAt), Replayed: true}, nil
	}
	if !errors.Is(err, db.ErrNotFound) {
		return Reservation{}, unavailable("checking sale", err)
	}
	if code == replyOf(ErrExpired) {
		return Reservation{}, ErrExpired
	}
	return Reservation{}, ErrAlreadyCancelled
}

func nothingSent(err error) bool { return core.NothingSent(err) }

// writeSale is the durable middle of a commit and its ending in Redis.
func (e *Engine) writeSale(ctx context.Context, token string, h Reservation, a attempt) (Reservation, error) {
	wctx, cancel := context.WithTimeout(ctx, e.cfg.CommitTimeout)
	sale, err := e.ledger.Sales().RecordSale(wctx, db.Reservation{
		Token: token, SKU: h.SKU, Principal: h.Principal, Quantity: h.Quantity,
		ExpiresAt: h.ExpiresAt, CreatedAt: h.CreatedAt, IdempotencyHash: a.idem, RequestHash: a.fp,
	})
	cancel()
	var ended *db.EndedError
	switch {
	case err == nil:
		return e.finishCommit(ctx, token, h, outcomeCommitted, sale.CommittedAt, a.id)
	case errors.As(err, &ended):
		// The ledger has the hold as finished: its cancel or expiry reached
		// Postgres after Redis was rebuilt without it. Redis gives the units
		// back, and the buyer hears what the ledger says.
		e.log.Warn().Str("token", token).Str("sku", h.SKU).Str("ledger", ended.Status).
			Msg("refused the sale of a hold the ledger has as finished; releasing it in Redis")
		if _, ferr := e.finishCommit(ctx, token, h, ended.Status, time.Time{}, a.id); ferr != nil {
			return Reservation{}, ferr
		}
		if ended.Status == db.StatusExpired {
			return Reservation{}, ErrExpired
		}
		return Reservation{}, ErrAlreadyCancelled
	case errors.Is(err, db.ErrWouldOversell):
		e.log.Error().Str("token", token).Str("sku", h.SKU).Msg("Postgres refused a sale beyond the total; releasing the hold")
		if a.moved {
			if _, ferr := e.finishCommit(ctx, token, h, outcomeRefused, time.Time{}, a.id); ferr != nil {
				return Reservation{}, ferr
			}
		}
		return Reservation{}, &OutOfStockError{Available: 0}
	case nothingSent(err) && a.moved:
		// Nothing reached Postgres: put the hold back as it was, unless
		// another attempt has joined and may be writing.
		if _, ferr := e.finishCommit(ctx, token, h, outcomeRestore, time.Time{}, a.id); ferr != nil {
			e.log.Warn().Err(ferr).Str("token", token).Msg("could not restore hold after a failed commit; the reconciler will")
		}
		return Reservation{}, unavailable("committing "+token, err)
	default:
		// The sale may or may not have reached Postgres. The hold stays
		// COMMITTING, out of reach of expiry: a retried commit or the commit
		// reconciler asks Postgres and finishes it either way.
		return Reservation{}, unavailable("committing "+token, err)
	}
}

// finishCommit runs finish_commit.lua; attemptID is begin_commit's cst for
// RESTORE and REFUSED. Replayed on the result means the script changed nothing.
func (e *Engine) finishCommit(ctx context.Context, token string, h Reservation, outcome string, committedAt time.Time, attemptID string) (Reservation, error) {
	partition, _ := parseToken(token)
	nonce := ""
	if outcome != outcomeCommitted && outcome != outcomeRestore {
		nonce = newNonce() // the outcome releases: the units go to the waiters first
	}
	rebuilt := false
	for {
		raw, err := e.runReplicated(ctx, script.FinishCommit{Partition: partition, Token: token, Outcome: outcome,
			Retention: int64(e.cfg.Retention.Seconds()), SKU: h.SKU, Principal: h.Principal, Quantity: h.Quantity,
			CommittedMs: committedAt.UnixMilli(), Attempt: attemptID, Nonce: nonce}.Call(e.keys))
		if err != nil {
			return Reservation{}, fmt.Errorf("finishing commit of %s: %w", token, err)
		}
		res := script.HoldOf(raw)
		switch replyCode(res.Code) {
		case codeOK:
			r := holdOf(res).reservation()
			r.Replayed = r.Replayed && !rebuilt
			return r, nil
		case codeNeedsHydration:
			if rebuilt {
				return Reservation{}, fmt.Errorf("finishing commit of %s: SKU still missing after rebuild", token)
			}
			// Redis lost the SKU. The rebuild need not have read this outcome
			// (a snapshot that lost its lock before its publish did not), so
			// the script runs again on what it published: it changes nothing
			// when the rebuild has the sale already.
			if err := e.Rebuild(ctx, h.SKU); err != nil {
				return Reservation{}, fmt.Errorf("finishing commit of %s: %w", token, err)
			}
			rebuilt = true
		case replyOf(ErrNotFound):
			h.Replayed = h.Replayed && !rebuilt
			return h, nil
		default:
			return Reservation{}, fmt.Errorf("finishing commit of %s: unexpected script reply %q", token, res.Code)
		}
	}
}

// fromLedger handles a token that Redis does not know. If Postgres has it as
// HELD and the SKU is missing from Redis, the SKU is rebuilt (rebuilt = true)
// and the caller tries again. Otherwise it returns the ledger's view for the
// caller to answer from (a *NotFoundError when Postgres has never seen it).
func (e *Engine) fromLedger(ctx context.Context, p Principal, token string) (rebuilt bool, r Reservation, err error) {
	row, err := e.ledger.Reservations().Reservation(ctx, token)
	if errors.Is(err, db.ErrNotFound) {
		return false, Reservation{}, reservationNotFound(token)
	}
	if err != nil {
		return false, Reservation{}, unavailable("reading reservation", err)
	}
	r = holdFromLedger(row)
	if r.Principal != p.ID && !p.Admin {
		return false, r, ErrForbidden
	}
	if r.Status != StatusHeld {
		return false, r, nil
	}
	n, err := e.rdb.Exists(ctx, e.keys.SKU(r.SKU)).Result()
	if err != nil {
		return false, r, unavailable("checking SKU", err)
	}
	if n == 1 {
		// The SKU is loaded. Either a rebuild published it since the caller
		// missed the hold (its chunks are all written before the SKU goes
		// live, so the hold is there now), or the rebuild did not know the
		// hold (its reserve reached the ledger afterwards). Tell Redis what
		// the ledger says: a hold it has is left alone, one it lacks is
		// adopted if it still fits, else recorded as expired. The row may
		// be of a batch the write-behind committed without waiting for its
		// WAL: it is made durable first, so that a crash of PostgreSQL
		// cannot take back a hold Redis adopted.
		if err := e.ledger.FlushWAL(ctx); err != nil {
			return false, r, unavailable("flushing the ledger", err)
		}
		code, err := e.reconcileHold(ctx, e.keys.PartitionOf(r.SKU), row)
		if err != nil {
			return false, r, err
		}
		if code == codeAdopted || code == codeAgrees || code == codeNeedsHydration {
			return true, r, nil // Redis has it now (or must be rebuilt): try again
		}
		r.Status = StatusExpired
		return false, r, nil
	}
	if err := e.Rebuild(ctx, r.SKU); err != nil {
		return false, r, err
	}
	return true, r, nil
}

func (e *Engine) commitAnswerFromLedger(r Reservation, err error) (Reservation, error) {
	if err != nil {
		return Reservation{}, err
	}
	switch r.Status {
	case StatusCommitted:
		r.Replayed = true
		return r, nil
	case StatusCancelled:
		return Reservation{}, ErrAlreadyCancelled
	default:
		return Reservation{}, ErrExpired
	}
}
