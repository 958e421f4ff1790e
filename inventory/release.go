package inventory

import (
	"context"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Cancel releases a principal's hold and returns its units to stock. An admin
// may cancel anyone's hold. Cancelling twice restocks once: the second call
// returns the reservation with Replayed set. A hold that reached its expiry
// first is reported as EXPIRED. Refusals: ErrAlreadyCommitted, ErrForbidden,
// *NotFoundError.
//
// The release is Redis' (release_hold.lua, which appends the outbox event);
// the ledger row is then written at once, best effort, before the reply, so
// the cancel is in Postgres before the buyer (or anyone who takes the freed
// units) can act on it. The outbox stays the guarantee: if the write fails,
// the write-behind records the cancel as usual.
func (e *Engine) Cancel(ctx context.Context, p Principal, token string) (res Reservation, err error) {
	res, err = e.cancel(ctx, p, token)
	if err == nil && !res.Replayed {
		e.recordRelease(ctx, res)
	}
	return res, err
}

// syncReleaseTimeout bounds the best-effort ledger write of a cancel: a slow
// Postgres delays the reply by at most this, never fails it.
const syncReleaseTimeout = core.SyncReleaseTimeout

// recordRelease writes a release Redis has just made to the ledger, best
// effort (see Cancel).
func (e *Engine) recordRelease(ctx context.Context, r Reservation) {
	kind := "cancel"
	if r.Status == StatusExpired {
		kind = "expire"
	}
	at := time.Now()
	if r.EndedAt != nil {
		at = *r.EndedAt
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), syncReleaseTimeout)
	defer cancel()
	err := e.ledger.ApplyEvents(wctx, nil, []db.Event{{
		ID: kind + ":" + r.Token, Kind: kind, Token: r.Token, SKU: r.SKU, Principal: r.Principal,
		Quantity: r.Quantity, ExpiresAt: r.ExpiresAt, CreatedAt: r.CreatedAt, At: at,
	}})
	if err != nil {
		e.log.Warn().Err(err).Str("token", r.Token).Msg("could not record a cancel in the ledger at once; the write-behind will")
	}
}

func (e *Engine) cancel(ctx context.Context, p Principal, token string) (res Reservation, err error) {
	defer func() { e.metrics.outcome("cancel", err) }()
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
	for attempt := 0; ; attempt++ {
		res, err := e.release(ctx, partition, token, p, string(StatusCancelled))
		if err != nil {
			return Reservation{}, fmt.Errorf("cancelling %s: %w", token, err)
		}
		switch replyCode(res.Code) {
		case codeOK:
			return holdOf(res).reservation(), nil
		case replyOf(ErrForbidden):
			return Reservation{}, ErrForbidden
		case replyOf(ErrAlreadyCommitted):
			return Reservation{}, ErrAlreadyCommitted
		case codeCommitInProgress:
			return Reservation{}, unavailable("cancelling "+token, errCommitInProgress)
		case codeNeedsHydration:
			if attempt > 0 {
				return Reservation{}, fmt.Errorf("cancelling %s: SKU still missing after rebuild", token)
			}
			if err := e.Rebuild(ctx, res.Missing); err != nil {
				return Reservation{}, fmt.Errorf("cancelling %s: %w", token, err)
			}
		case replyOf(ErrNotFound):
			if attempt > 0 {
				return Reservation{}, reservationNotFound(token)
			}
			rebuilt, r, err := e.fromLedger(ctx, p, token)
			if err != nil {
				return Reservation{}, err
			}
			if rebuilt {
				continue
			}
			if r.Status == StatusCommitted {
				return Reservation{}, ErrAlreadyCommitted
			}
			r.Replayed = true
			return r, nil
		default:
			return Reservation{}, fmt.Errorf("cancelling %s: unexpected script reply %q", token, res.Code)
		}
	}
}

// errCommitInProgress is why a cancel of a hold being committed is refused
// as retryable: the commit's outcome decides, within seconds.
var errCommitInProgress = core.ErrCommitInProgress

// release runs release_hold.lua, shared by cancel and expiry.
func (e *Engine) release(ctx context.Context, partition int, token string, p Principal, status string) (script.Hold, error) {
	return script.RunReleaseHold(ctx, e.run, e.keys, e.releaseArgs(partition, token, p, status))
}

// releaseArgs is release_hold.lua's arguments for a release of token by p
// (the zero Principal for the sweeper) with status CANCELLED or EXPIRED.
func (e *Engine) releaseArgs(partition int, token string, p Principal, status string) script.ReleaseHold {
	return script.ReleaseHold{Partition: partition, Token: token, Principal: p.ID, Admin: p.Admin, Status: status,
		Retention: int64(e.cfg.Retention.Seconds()), Nonce: newNonce(), RejectionTTL: int64(e.cfg.RejectionTTL.Seconds())}
}
