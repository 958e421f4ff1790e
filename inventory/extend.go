package inventory

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// ExtendRequest asks for a later expiry (see core.ExtendRequest).
type ExtendRequest = core.ExtendRequest

// Extend gives a principal's HELD hold a new expiry, now + req.HoldFor, when
// the buyer needs more time (payment has started). A hold may be extended
// MaxExtensions times, and never past MaxHold after its creation: beyond
// that the answer is *ExtensionLimitError and nothing changes. A hold past
// its expiry is ErrExpired, even before the sweeper has released it; other
// refusals: ErrForbidden, ErrAlreadyCancelled, ErrAlreadyCommitted,
// ErrIdempotencyKeyReused, *NotFoundError, *InvalidInputError, and
// ErrUnavailable while a commit of the hold is under way.
//
// The extension is one script (extend_hold.lua), atomic against the expiry
// sweeper: of an extension and an expiry racing, exactly one wins. Its
// outbox event is the guarantee that the ledger records it; like a cancel,
// it is also written to the ledger at once, best effort, so a rebuild after
// Redis lost its data restores the hold with its new expiry. An idempotency
// key is recorded on the hold in the same script, so concurrent duplicates
// extend once; its claim (as for a reserve) pins it to this hold.
func (e *Engine) Extend(ctx context.Context, p Principal, token string, req ExtendRequest) (res Reservation, err error) {
	defer func() { e.metrics.outcome("extend", err) }()
	if isCartLine(token) {
		return Reservation{}, errCartLine
	}
	if _, err := parseToken(token); err != nil {
		return Reservation{}, err
	}
	idem, err := e.checkExtension(ctx, p, token, req)
	if err != nil {
		return Reservation{}, err
	}
	res, err = e.extendHold(ctx, p, token, req.HoldFor, idem)
	if err != nil {
		return Reservation{}, err
	}
	if idem != "" {
		if err := e.keepIdempotencyClaim(ctx, idem, extensionClaim(token)); err != nil {
			return Reservation{}, err
		}
	}
	return res, nil
}

func extensionClaim(token string) string { return core.ExtensionClaim(token) }

// checkExtension validates an extension of the hold or cart token and, when
// it carries an idempotency key, claims the key for it. It returns the key's
// hash, or "" without a key.
func (e *Engine) checkExtension(ctx context.Context, p Principal, token string, req ExtendRequest) (string, error) {
	if err := checkPrincipal(p); err != nil {
		return "", err
	}
	if req.HoldFor < e.cfg.MinHold || req.HoldFor > e.cfg.MaxHold {
		return "", &InvalidInputError{Field: "holdSeconds", Reason: fmt.Sprintf("must be between %d and %d",
			int(e.cfg.MinHold.Seconds()), int(e.cfg.MaxHold.Seconds()))}
	}
	if req.IdempotencyKey == "" {
		return "", nil
	}
	if err := checkIdempotencyKey(req.IdempotencyKey); err != nil {
		return "", err
	}
	idem := idempotencyHash(p.ID, req.IdempotencyKey)
	return idem, e.claimIdempotencyKey(ctx, idem, extensionClaim(token))
}

// extendHold is Extend of any hold, a cart's line included, once
// checkExtension has passed; idem is the idempotency key's hash, or "".
func (e *Engine) extendHold(ctx context.Context, p Principal, token string, holdFor time.Duration, idem string) (Reservation, error) {
	partition, err := parseToken(token)
	if err != nil {
		return Reservation{}, err
	}
	fp := ""
	if idem != "" {
		fp = strconv.FormatInt(holdFor.Milliseconds(), 10)
	}
	limit := max(e.cfg.MaxExtensions, 0)
	// One id for this call, sent with every try: a script the Redis client
	// sends again after a lost reply finds it on the hold and replays.
	call := newAttemptID()
	args := script.ExtendHold{Partition: partition, Token: token, Principal: p.ID, HoldMs: holdFor.Milliseconds(),
		MaxExtensions: limit, MaxHoldMs: e.cfg.MaxHold.Milliseconds(), CallID: call,
		Retention: int64(e.cfg.Retention.Seconds()), Idem: idem, FP: fp}
	for try := 0; ; try++ {
		r, err := script.RunExtendHold(ctx, e.run, e.keys, args)
		if err != nil {
			return Reservation{}, fmt.Errorf("extending %s: %w", token, err)
		}
		switch replyCode(r.Code) {
		case codeOK:
			res := holdOf(r).reservation()
			if !res.Replayed {
				e.recordExtension(ctx, res)
			}
			return res, nil
		case replyOf(ErrForbidden):
			return Reservation{}, ErrForbidden
		case replyOf(ErrIdempotencyKeyReused):
			return Reservation{}, ErrIdempotencyKeyReused
		case replyOf(ErrExpired):
			return Reservation{}, ErrExpired
		case replyOf(ErrAlreadyCancelled):
			return Reservation{}, ErrAlreadyCancelled
		case replyOf(ErrAlreadyCommitted):
			return Reservation{}, ErrAlreadyCommitted
		case codeCommitInProgress:
			return Reservation{}, unavailable("extending "+token, errCommitInProgress)
		case replyOf(ErrExtensionLimit):
			h := holdOf(r).reservation()
			return Reservation{}, &ExtensionLimitError{Limit: limit, Used: h.Extensions, Latest: h.CreatedAt.Add(e.cfg.MaxHold)}
		case replyOf(ErrInvalidInput):
			return Reservation{}, &InvalidInputError{Field: "holdSeconds", Reason: "out of range"}
		case codeNeedsHydration:
			if try > 0 {
				return Reservation{}, fmt.Errorf("extending %s: SKU still missing after rebuild", token)
			}
			if err := e.Rebuild(ctx, r.Missing); err != nil {
				return Reservation{}, fmt.Errorf("extending %s: %w", token, err)
			}
		case replyOf(ErrNotFound):
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
			return Reservation{}, fmt.Errorf("extending %s: unexpected script reply %q", token, r.Code)
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
