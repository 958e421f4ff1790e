package inventory

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/lua"
)

// Extend gives a principal's HELD hold a new expiry, now + holdFor, when the
// buyer needs more time (payment has started). A hold may be extended
// MaxExtensions times, and never past MaxHold after its creation: beyond
// that the answer is *ExtensionLimitError and nothing changes. A hold past
// its expiry is ErrExpired, even before the sweeper has released it; other
// refusals: ErrForbidden, ErrAlreadyCancelled, ErrAlreadyCommitted,
// *NotFoundError, *InvalidInputError, and ErrUnavailable while a commit of
// the hold is under way.
//
// The extension is one script (extend_hold.lua), atomic against the expiry
// sweeper: of an extension and an expiry racing, exactly one wins. Its
// outbox event is the guarantee that the ledger records it; like a cancel,
// it is also written to the ledger at once, best effort, so a rebuild after
// Redis lost its data restores the hold with its new expiry.
func (e *Engine) Extend(ctx context.Context, p Principal, token string, holdFor time.Duration) (res Reservation, err error) {
	defer func() { e.metrics.outcome("extend", err) }()
	if isCartLine(token) {
		return Reservation{}, errCartLine
	}
	return e.extendHold(ctx, p, token, holdFor)
}

// extendHold is Extend of any hold, a cart's line included.
func (e *Engine) extendHold(ctx context.Context, p Principal, token string, holdFor time.Duration) (Reservation, error) {
	partition, err := parseToken(token)
	if err != nil {
		return Reservation{}, err
	}
	if err := checkPrincipal(p); err != nil {
		return Reservation{}, err
	}
	if holdFor < e.cfg.MinHold || holdFor > e.cfg.MaxHold {
		return Reservation{}, &InvalidInputError{Field: "holdSeconds", Reason: fmt.Sprintf("must be between %d and %d",
			int(e.cfg.MinHold.Seconds()), int(e.cfg.MaxHold.Seconds()))}
	}
	limit := max(e.cfg.MaxExtensions, 0)
	// One id for this call, sent with every try: a script the Redis client
	// sends again after a lost reply finds it on the hold and replays.
	call := newAttemptID()
	args := []any{e.keys.Base(partition), token, p.ID, holdFor.Milliseconds(), limit,
		e.cfg.MaxHold.Milliseconds(), call, int64(e.cfg.Retention.Seconds())}
	for try := 0; ; try++ {
		r, err := e.run(ctx, lua.ExtendHold, e.keys.extendHoldKeys(partition, token), args...)
		if err != nil {
			return Reservation{}, fmt.Errorf("extending %s: %w", token, err)
		}
		switch r.code() {
		case codeOK:
			res := r.hold().reservation()
			if !res.Replayed {
				e.recordExtension(ctx, res)
			}
			return res, nil
		case codeForbidden:
			return Reservation{}, ErrForbidden
		case codeExpired:
			return Reservation{}, ErrExpired
		case codeAlreadyCancelled:
			return Reservation{}, ErrAlreadyCancelled
		case codeAlreadyCommitted:
			return Reservation{}, ErrAlreadyCommitted
		case codeCommitInProgress:
			return Reservation{}, unavailable("extending "+token, errCommitInProgress)
		case codeExtensionLimit:
			h := r.hold().reservation()
			return Reservation{}, &ExtensionLimitError{Limit: limit, Used: h.Extensions, Latest: h.CreatedAt.Add(e.cfg.MaxHold)}
		case codeInvalidInput:
			return Reservation{}, &InvalidInputError{Field: "holdSeconds", Reason: "out of range"}
		case codeNeedsHydration:
			if try > 0 {
				return Reservation{}, fmt.Errorf("extending %s: SKU still missing after rebuild", token)
			}
			if err := e.Rebuild(ctx, r.missingSKU()); err != nil {
				return Reservation{}, fmt.Errorf("extending %s: %w", token, err)
			}
		case codeNotFound:
			if try > 0 {
				return Reservation{}, reservationNotFound(token)
			}
			rebuilt, h, err := e.fromLedger(ctx, p, token)
			if err != nil {
				return Reservation{}, err
			}
			if rebuilt {
				continue // the SKU was rebuilt with this hold: try again
			}
			switch h.Status {
			case StatusCommitted:
				return Reservation{}, ErrAlreadyCommitted
			case StatusCancelled:
				return Reservation{}, ErrAlreadyCancelled
			default:
				return Reservation{}, ErrExpired
			}
		default:
			return Reservation{}, fmt.Errorf("extending %s: unexpected script reply %q", token, r.code())
		}
	}
}

// extensionEventID is the ledger id of a hold's n-th extension, as
// extend_hold.lua names it.
func extensionEventID(token string, n int) string {
	return "extend:" + token + ":" + strconv.Itoa(n)
}

// recordExtension writes an extension Redis has just made to the ledger,
// best effort and bounded like a cancel's (see Extend): the outbox event,
// with the same id, is the guarantee.
func (e *Engine) recordExtension(ctx context.Context, r Reservation) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), syncReleaseTimeout)
	defer cancel()
	err := e.ledger.ApplyEvents(wctx, nil, []db.Event{{
		ID: extensionEventID(r.Token, r.Extensions), Kind: "extend", Token: r.Token, SKU: r.SKU,
		Principal: r.Principal, Quantity: r.Quantity, ExpiresAt: r.ExpiresAt, CreatedAt: r.CreatedAt,
		At: time.Now(), Extensions: r.Extensions,
	}})
	if err != nil {
		e.log.Warn().Err(err).Str("token", r.Token).Msg("could not record an extension in the ledger at once; the write-behind will")
	}
}
