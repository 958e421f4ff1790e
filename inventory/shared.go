package inventory

import (
	"context"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
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
		Redis: e.rdb, Ledger: e.ledger, Keys: e.keys, Log: e.log, Run: e.run, Metrics: e.metrics.shared,
		Limits: core.Limits{MaxQuantity: e.cfg.MaxQuantity, MinHold: e.cfg.MinHold, MaxHold: e.cfg.MaxHold,
			WaitlistMax: e.cfg.WaitlistMax},
		Holds: holds{e: e},
	}
}

// holds is what the aggregates ask of the engine's holds (core.Holds).
type holds struct{ e *Engine }

func (h holds) Rebuild(ctx context.Context, sku string) error { return h.e.Rebuild(ctx, sku) }

func (h holds) CheckReserve(p Principal, sku string, quantity int, holdFor time.Duration) (time.Duration, error) {
	return h.e.checkReserve(p, ReserveRequest{SKU: sku, Quantity: quantity, HoldFor: holdFor})
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
