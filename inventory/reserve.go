package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
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
	// RateLimit, when set, is the caller's mutation budget: the reserve
	// spends one unit of it before anything else, and is refused with
	// *RateLimitedError when none is left. With a single Redis it is spent
	// in the same run of reserve.lua that decides the reserve; otherwise
	// (see SpendRateLimit) in its own script just before.
	RateLimit *RateLimit
	// AdmissionPass is the pass the caller's admission queue gave it, for
	// a queued product (or a SKU of a queued drop); "" for none. The hold
	// spends it.
	AdmissionPass string
}

// ValidSKU reports whether s may name a product: 1–64 of A–Z a–z 0–9 . _ -
func ValidSKU(s string) bool { return core.ValidSKU(s) }

func checkPrincipal(p Principal) error { return core.CheckPrincipal(p) }

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
	if err := checkIdempotencyKey(req.IdempotencyKey); err != nil {
		return 0, err
	}
	return hold, nil
}

// checkIdempotencyKey checks a client's idempotency key ("" is none).
func checkIdempotencyKey(k string) error {
	if k != "" && (len(k) > 128 || !utf8.ValidString(k)) {
		return &InvalidInputError{Field: "idempotencyKey", Reason: "must be valid UTF-8 of at most 128 bytes"}
	}
	return nil
}

// Reserve holds units of a SKU for a principal, or returns why not:
// *InvalidInputError, ErrIdempotencyKeyReused, *NotFoundError, *SaleNotActiveError,
// *QuotaExceededError, *OutOfStockError, or ErrUnavailable when Redis is down.
// The decision and the deduction are one Lua script (reserve.lua), run for a
// batch of the partition's concurrent reserves at once (reserveBatcher);
// Postgres is only touched when the SKU must first be rebuilt from it. When
// the SKU's waitlist walk is unfinished (walk.go), the units may still be a
// waiter's: Reserve finishes the walk, then asks again.
func (e *Engine) Reserve(ctx context.Context, p Principal, req ReserveRequest) (res Reservation, err error) {
	began := time.Now()
	defer func() {
		e.metrics.reserveOutcome(err)
		e.metrics.reserveDur.Observe(time.Since(began).Seconds())
	}()
	hold, err := e.checkReserve(p, req)
	if err != nil {
		// Refused before any script: the budget is spent on its own.
		if req.RateLimit != nil {
			if lerr := e.SpendRateLimit(ctx, *req.RateLimit); lerr != nil {
				return Reservation{}, lerr
			}
		}
		return Reservation{}, err
	}
	if answered, err := e.reserveFromMemory(req, began); answered {
		return Reservation{}, err
	}
	// reserve.lua spends the budget in the same run, except with an
	// idempotency key (whose claim must not be made for a refused request)
	// or on a cluster (where the budget's key lives in another slot than the
	// SKU's): then it is spent on its own first.
	budget := req.RateLimit
	if budget != nil && (req.IdempotencyKey != "" || !e.foldsRateLimit()) {
		if err := e.SpendRateLimit(ctx, *budget); err != nil {
			return Reservation{}, err
		}
		budget = nil
	}
	var idem, fp string
	if req.IdempotencyKey != "" {
		idem = idempotencyHash(p.ID, req.IdempotencyKey)
		fp = requestHash(req.SKU, req.Quantity, hold.Milliseconds())
		if err := e.claimIdempotencyKey(ctx, idem, req.SKU); err != nil {
			return Reservation{}, err
		}
	}
	var partition int
	prepare := func() *reserveCall {
		// The SKU's partition is known once it has been rebuilt here, if
		// it belongs to a drop this process had not heard of.
		partition = e.keys.PartitionOf(req.SKU)
		token := newToken(partition)
		budgetKey := ""
		if budget != nil {
			budgetKey = budget.Key
		}
		return &reserveCall{req: script.ReserveRequest{
			SKU: req.SKU, Principal: p.ID, Quantity: req.Quantity, HoldMs: hold.Milliseconds(), Token: token,
			Fingerprint: fp, Idem: idem, BudgetKey: budgetKey, Budget: budget.Args(), Pass: req.AdmissionPass,
		}}
	}
	// A SKU of a drop may need the drop's other SKUs rebuilt too: each at
	// most once per call.
	rebuilt := map[string]bool{}
	walks := 0
	for c := prepare(); ; c = prepare() {
		res, err := e.reserveInBatch(ctx, partition, c)
		if err != nil {
			return Reservation{}, fmt.Errorf("reserving %s: %w", req.SKU, err)
		}
		switch code := replyCode(res.Code); code {
		case codeOK, codeHeld:
			if idem != "" {
				if err := e.keepIdempotencyClaim(ctx, idem, req.SKU); err != nil {
					// The hold is made; a retry with the same key replays it
					// and keeps the claim then.
					return Reservation{}, err
				}
			}
			if code == codeHeld {
				return newHold(res, c.token(), req.SKU, p.ID, req.Quantity).reservation(), nil
			}
			return holdOf(res.Hold).reservation(), nil
		case replyOf(ErrRateLimited):
			return Reservation{}, rateLimited(res.Rejection.A)
		case codeNeedsHydration:
			missing := res.Missing
			if rebuilt[missing] {
				return Reservation{}, fmt.Errorf("reserving %s: SKU %s still missing after rebuild", req.SKU, missing)
			}
			rebuilt[missing] = true
			if err := e.Rebuild(ctx, missing); err != nil {
				return Reservation{}, fmt.Errorf("reserving %s: %w", req.SKU, err)
			}
		case codeWalkPending:
			// The units may still be a waiter's: the walk decides, then
			// the same request is asked again.
			if walks++; walks > maxWalkRetries {
				return Reservation{}, unavailable("reserving "+req.SKU, errWalkRestarts)
			}
			if _, err := e.finishWalk(ctx, partition, req.SKU); err != nil {
				return Reservation{}, fmt.Errorf("reserving %s: %w", req.SKU, err)
			}
		default:
			if err := rejectionError(res.Rejection); err != nil {
				if code == replyOf(ErrOutOfStock) && idem == "" {
					if m := e.soldOutMemory(); m != nil {
						m.Refused(req.SKU)
					}
				}
				return Reservation{}, err
			}
			return Reservation{}, fmt.Errorf("reserving %s: unexpected script reply %q", req.SKU, res.Code)
		}
	}
}

// claimIdempotencyKey pins an idempotency key to the first SKU it is used
// with. The key's records live in that SKU's partition, so reuse with another
// SKU could not be seen there; this claim makes it visible. The claim is one
// script (claim_idempotency_key.lua): of two concurrent first uses with
// different SKUs, one loses. A new claim lives RejectionTTL, like the record
// of a rejection: a key that only ever got refused (or never reached the
// script) keeps nothing in Redis for longer; keepIdempotencyClaim extends it
// once the key holds units.
//
// Redis can lose the claims (a flush, a restart, a failover). A per-partition
// marker that lives as long as the claims says until when a claim that looks
// new must be checked against the ledger: when it is missing, it is set to the
// latest use of any key the ledger has within the idempotency TTL, plus the
// TTL (nothing to check on a fresh ledger). Within that window a new-looking
// claim costs one indexed lookup of the key's hash and is pinned to the SKU
// the ledger has; outside it the reserve path never touches Postgres. If
// Postgres cannot answer, the claim is taken as new (availability over a
// double failure).
func (e *Engine) claimIdempotencyKey(ctx context.Context, idem, sku string) error {
	ttl := int64(e.cfg.RejectionTTL.Seconds())
	mark := ""
	claim := func(sku string, ttl int64, checked bool) (script.ClaimReply, error) {
		r, err := script.RunClaimIdempotencyKey(ctx, e.run, e.keys,
			script.ClaimIdempotencyKey{Idem: idem, SKU: sku, TTL: ttl, Checked: checked, Mark: mark})
		if err != nil {
			return r, fmt.Errorf("reserving %s: claiming idempotency key: %w", sku, err)
		}
		return r, nil
	}
	res, err := claim(sku, ttl, false)
	if err != nil {
		return err
	}
	if replyCode(res.Code) == codeMark {
		mark = strconv.FormatInt(e.claimCheckUntil(ctx), 10)
		e.markClaimPartitions(ctx, mark)
		if res, err = claim(sku, ttl, false); err != nil {
			return err
		}
	}
	claimed := sku
	if replyCode(res.Code) == codeCheck {
		first, err := e.ledger.Reservations().IdempotencyUse(ctx, idem, time.Now().Add(-e.cfg.IdempotencyTTL))
		switch {
		case err == nil:
			claimed = first.SKU
			ttl = max(int64(time.Until(first.CreatedAt.Add(e.cfg.IdempotencyTTL)).Seconds()), 1)
		case errors.Is(err, db.ErrNotFound):
		default:
			e.log.Warn().Err(err).Msg("could not check a new idempotency claim against the ledger; taking it as new")
		}
		if res, err = claim(claimed, ttl, true); err != nil {
			return err
		}
	}
	switch replyCode(res.Code) {
	case codeOK:
		if claimed != sku {
			return ErrIdempotencyKeyReused
		}
		return nil
	case codeReused:
		if res.SKU != sku {
			return ErrIdempotencyKeyReused
		}
		return nil
	}
	return fmt.Errorf("reserving %s: unexpected claim reply %q", sku, res.Code)
}

// markClaimPartitions gives every partition whose marker of claims is
// missing the marker one partition's first claim has just worked out from
// the ledger. The ledger's latest use is that of any key, whatever its
// partition, so every partition would work out no less; and a partition's
// claims made after this are in Redis, to be lost only with its marker.
// Without it, each partition worked its marker out at its own first claim:
// on a fresh Redis beside a ledger that had taken keyed reserves since the
// first partition's (a new deployment's first day, or a drop rehearsal
// after its warm-up), every later partition was marked until a day after
// those, and each new key there cost a lookup in the ledger and a second
// claim for that day. A marker that cannot be set here is worked out at
// its partition's own first claim, as before.
func (e *Engine) markClaimPartitions(ctx context.Context, mark string) {
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range script.Partitions {
			p.SetNX(ctx, e.keys.IdempotencyClaimsIn(i), mark, 0)
		}
		return nil
	})
	if err != nil {
		e.log.Warn().Err(err).Msg("could not mark every partition's idempotency claims; each will be marked at its first claim")
	}
}

// claimCheckUntil is until when (Unix ms) claims must be checked against the
// ledger after Redis lost a partition's claims: the latest use of an
// idempotency key the ledger has, plus the TTL; 0 when it has none within the
// TTL. When Postgres cannot answer, a whole TTL from now.
func (e *Engine) claimCheckUntil(ctx context.Context) int64 {
	latest, err := e.ledger.Reservations().LatestIdempotencyUse(ctx, time.Now().Add(-e.cfg.IdempotencyTTL))
	switch {
	case errors.Is(err, db.ErrNotFound):
		return 0
	case err != nil:
		e.log.Warn().Err(err).Msg("could not read the ledger's latest idempotency key; checking new claims for a whole TTL")
		return time.Now().Add(e.cfg.IdempotencyTTL).UnixMilli()
	}
	return latest.Add(e.cfg.IdempotencyTTL).UnixMilli()
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
