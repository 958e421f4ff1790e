package inventory

import (
	"context"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// The engine hands its aggregates (inventory/drop, inventory/waitlist, ...)
// one core.Core: its Redis client, ledger, key layout, script runner and
// metrics, and the hand-offs of the holds they need (holds below). The
// aggregates import package core and never this package.

// QueueSettings put a product, or a drop, behind an admission queue (see
// core.QueueSettings).
type QueueSettings = core.QueueSettings

// The bounds of QueueSettings.
const (
	DefaultPassLife    = core.DefaultPassLife
	MinPassLife        = core.MinPassLife
	MaxPassLife        = core.MaxPassLife
	MaxAdmitPerMinute  = core.MaxAdmitPerMinute
	MaxProofOfWorkBits = core.MaxProofOfWorkBits
	MaxAccessCodes     = core.MaxAccessCodes
)

func newQueue(q *QueueSettings, field string) (*db.NewQueue, error) { return core.NewQueue(q, field) }

// newCore is what the engine hands its aggregates.
func (e *Engine) newCore() *core.Core {
	return &core.Core{
		Redis: e.rdb, Ledger: e.ledger, Keys: e.keys, Log: e.log, Run: e.run, RunMany: e.runMany, Metrics: e.metrics.shared,
		Limits: core.Limits{MaxQuantity: e.cfg.MaxQuantity, MinHold: e.cfg.MinHold, MaxHold: e.cfg.MaxHold,
			WaitlistMax: e.cfg.WaitlistMax},
		Holds: holds{e: e},
	}
}

// holds is what the aggregates ask of the engine's holds (core.Holds, and
// cart.Holds for carts, whose lines are holds).
type holds struct{ e *Engine }

func (h holds) Rebuild(ctx context.Context, sku string) error { return h.e.Rebuild(ctx, sku) }

func (h holds) CheckReserve(p Principal, sku string, quantity int, holdFor time.Duration, idempotencyKey string) (time.Duration, error) {
	return h.e.checkReserve(p, ReserveRequest{SKU: sku, Quantity: quantity, HoldFor: holdFor, IdempotencyKey: idempotencyKey})
}

func (h holds) Reservation(ctx context.Context, p Principal, token string) (Reservation, error) {
	return h.e.Reservation(ctx, p, token)
}

// finishWalk finishes sku's unfinished waitlist walk (core.FinishWalk).
func (e *Engine) finishWalk(ctx context.Context, p int, sku string) (int, error) {
	return e.core.FinishWalk(ctx, p, sku)
}

// ContinueWalks finishes the unfinished waitlist walks of every partition,
// up to limit SKUs per partition, and returns how many offers they made
// (see core.ContinueWalks).
func (m *Maintenance) ContinueWalks(ctx context.Context, limit int) (int, error) {
	return m.e.core.ContinueWalks(ctx, limit)
}

// The bound of a reserve's retries after finishing a walk (core.MaxWalkRetries).
const maxWalkRetries = core.MaxWalkRetries

var errWalkRestarts = core.ErrWalkRestarts

// The tokens' kinds and shapes are package core's (core.NewToken, ...).
const (
	tokenLen  = core.TokenLen
	tokenHold = core.TokenHold
	tokenLine = core.TokenLine
	tokenCart = core.TokenCart
)

func newToken(partition int) string        { return core.NewToken(partition) }
func parseToken(token string) (int, error) { return core.ParseToken(token) }
func isCartLine(token string) bool         { return core.IsCartLine(token) }
func newNonce() string                     { return core.NewNonce() }

func (h holds) SpendUnits(ctx context.Context, l RateLimit, cost int) error {
	return h.e.spendUnits(ctx, l, cost)
}

func (h holds) ClaimIdempotencyKey(ctx context.Context, idem, claim string) error {
	return h.e.claimIdempotencyKey(ctx, idem, claim)
}

func (h holds) KeepIdempotencyClaim(ctx context.Context, idem, claim string) error {
	return h.e.keepIdempotencyClaim(ctx, idem, claim)
}

func (h holds) HoldFromHash(token string, m map[string]string) Reservation {
	return holdFromHash(token, m).reservation()
}

func (h holds) HoldOf(r script.Hold) Reservation { return holdOf(r).reservation() }

func (h holds) FinishCommit(ctx context.Context, token string, r Reservation, outcome string, committedAt time.Time, attemptID string) (Reservation, error) {
	return h.e.finishCommit(ctx, token, r, outcome, committedAt, attemptID)
}

func (h holds) Release(ctx context.Context, partition int, token string, p Principal, status string) (script.Hold, error) {
	return h.e.release(ctx, partition, token, p, status)
}

func (h holds) ReleaseArgs(partition int, token string, p Principal, status string) script.ReleaseHold {
	return h.e.releaseArgs(partition, token, p, status)
}

func (h holds) RecordRelease(ctx context.Context, r Reservation) { h.e.recordRelease(ctx, r) }

func (h holds) CheckExtension(ctx context.Context, p Principal, token string, req ExtendRequest) (string, error) {
	return h.e.checkExtension(ctx, p, token, req)
}

func (h holds) ExtendHold(ctx context.Context, p Principal, token string, holdFor time.Duration, idem string) (Reservation, error) {
	return h.e.extendHold(ctx, p, token, holdFor, idem)
}

var errCartLine = core.ErrCartLine
