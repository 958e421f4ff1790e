package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/lua"
)

// ReserveRequest asks for units of one SKU.
type ReserveRequest struct {
	SKU      string
	Quantity int
	// IdempotencyKey, when set, makes the call replayable for IdempotencyTTL:
	// the same key from the same principal returns the first outcome. Without
	// it every call is a new attempt.
	IdempotencyKey string
	// HoldFor is how long the hold lasts; 0 means the configured default.
	HoldFor time.Duration
}

var (
	skuPattern       = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	principalPattern = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,128}$`)
)

// ValidSKU reports whether s may name a product: 1–64 of A–Z a–z 0–9 . _ -
func ValidSKU(s string) bool { return skuPattern.MatchString(s) }

func checkPrincipal(p Principal) error {
	if !principalPattern.MatchString(p.ID) {
		return &InvalidInputError{Field: "principal", Reason: "not a valid principal id"}
	}
	return nil
}

func (e *Engine) checkReserve(p Principal, req ReserveRequest) (time.Duration, error) {
	if err := checkPrincipal(p); err != nil {
		return 0, err
	}
	if !ValidSKU(req.SKU) {
		return 0, &InvalidInputError{Field: "sku", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	if req.Quantity < 1 || req.Quantity > e.cfg.MaxQuantity {
		return 0, &InvalidInputError{Field: "quantity", Reason: fmt.Sprintf("must be between 1 and %d", e.cfg.MaxQuantity)}
	}
	hold := req.HoldFor
	if hold == 0 {
		hold = e.cfg.DefaultHold
	}
	if hold < e.cfg.MinHold || hold > e.cfg.MaxHold {
		return 0, &InvalidInputError{Field: "holdSeconds", Reason: fmt.Sprintf("must be between %d and %d",
			int(e.cfg.MinHold.Seconds()), int(e.cfg.MaxHold.Seconds()))}
	}
	if k := req.IdempotencyKey; k != "" && (len(k) > 128 || !utf8.ValidString(k)) {
		return 0, &InvalidInputError{Field: "idempotencyKey", Reason: "must be valid UTF-8 of at most 128 bytes"}
	}
	return hold, nil
}

// Reserve holds units of a SKU for a principal, or returns why not:
// *InvalidInputError, ErrIdempotencyKeyReused, *NotFoundError, *SaleNotActiveError,
// *QuotaExceededError, *OutOfStockError, or ErrUnavailable when Redis is down.
// The decision and the deduction are one Lua script (reserve.lua); Postgres is
// only touched when the SKU must first be rebuilt from it.
func (e *Engine) Reserve(ctx context.Context, p Principal, req ReserveRequest) (res Reservation, err error) {
	defer func() { e.metrics.outcome("reserve", err) }()
	hold, err := e.checkReserve(p, req)
	if err != nil {
		return Reservation{}, err
	}
	var idem, fp string
	if req.IdempotencyKey != "" {
		idem = idempotencyHash(p.ID, req.IdempotencyKey)
		fp = requestHash(req.SKU, req.Quantity, hold.Milliseconds())
		if err := e.claimIdempotencyKey(ctx, idem, req.SKU); err != nil {
			return Reservation{}, err
		}
	}
	partition := PartitionOf(req.SKU)
	token := newToken(partition)
	idemKey := e.keys.Idempotency(req.SKU, idem)
	keys := []string{e.keys.SKU(req.SKU), e.keys.Hold(partition, token), e.keys.Quota(req.SKU), idemKey}
	args := []any{
		e.keys.Base(partition), req.SKU, p.ID, req.Quantity, hold.Milliseconds(), token, fp, idem,
		int64(e.cfg.IdempotencyTTL.Seconds()), e.cfg.MaxQuantity, e.cfg.MaxHold.Milliseconds(),
		int64(e.cfg.RejectionTTL.Seconds()),
	}
	for attempt := 0; ; attempt++ {
		r, err := e.run(ctx, lua.Reserve, keys, args...)
		if err != nil {
			return Reservation{}, fmt.Errorf("reserving %s: %w", req.SKU, err)
		}
		res := reply(r)
		switch res.code() {
		case "OK":
			if idem != "" {
				if err := e.keepIdempotencyClaim(ctx, idem, req.SKU); err != nil {
					// The hold is made; a retry with the same key replays it
					// and keeps the claim then.
					return Reservation{}, err
				}
			}
			return holdFromReply(res), nil
		case "NEEDS_HYDRATION":
			if attempt > 0 {
				return Reservation{}, fmt.Errorf("reserving %s: SKU still missing after rebuild", req.SKU)
			}
			if err := e.Rebuild(ctx, req.SKU); err != nil {
				return Reservation{}, fmt.Errorf("reserving %s: %w", req.SKU, err)
			}
			continue
		case "OUT_OF_STOCK":
			return Reservation{}, &OutOfStockError{Available: int(res.int(1))}
		case "QUOTA_EXCEEDED":
			return Reservation{}, &QuotaExceededError{Limit: int(res.int(1)), Held: int(res.int(2))}
		case "SALE_NOT_ACTIVE":
			return Reservation{}, &SaleNotActiveError{StartsAt: msTimePtr(res.int(1)), EndsAt: msTimePtr(res.int(2))}
		case "IDEMPOTENCY_KEY_REUSED":
			return Reservation{}, ErrIdempotencyKeyReused
		case "INVALID_INPUT":
			return Reservation{}, &InvalidInputError{Field: res.str(1), Reason: res.str(2)}
		default:
			return Reservation{}, fmt.Errorf("reserving %s: unexpected script reply %q", req.SKU, res.code())
		}
	}
}

// claimIdempotencyKey pins an idempotency key to the first SKU it is used
// with. The key's records live in that SKU's partition, so reuse with another
// SKU could not be seen there; this claim makes it visible. SET NX GET is one
// atomic step: of two concurrent first uses with different SKUs, one loses.
// A new claim lives RejectionTTL, like the record of a rejection: a key that
// only ever got refused (or never reached the script) keeps nothing in Redis
// for longer; keepIdempotencyClaim extends it once the key holds units.
func (e *Engine) claimIdempotencyKey(ctx context.Context, idem, sku string) error {
	prev, err := e.rdb.SetArgs(ctx, e.keys.IdempotencyClaim(idem), sku, redis.SetArgs{
		Mode: "NX", Get: true, TTL: e.cfg.RejectionTTL,
	}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil // first use
	case err != nil:
		return fmt.Errorf("reserving %s: %w", sku, unavailable("claiming idempotency key", err))
	case prev != sku:
		return ErrIdempotencyKeyReused
	}
	return nil
}

// keepIdempotencyClaim makes the claim of a key that got a hold last as long
// as the hold's idempotency record (IdempotencyTTL), so the key stays pinned to
// its SKU for as long as it replays the hold.
func (e *Engine) keepIdempotencyClaim(ctx context.Context, idem, sku string) error {
	err := e.rdb.SetArgs(ctx, e.keys.IdempotencyClaim(idem), sku, redis.SetArgs{TTL: e.cfg.IdempotencyTTL}).Err()
	if err != nil {
		return fmt.Errorf("reserving %s: %w", sku, unavailable("keeping idempotency claim", err))
	}
	return nil
}
