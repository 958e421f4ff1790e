// Package core is what the engine's aggregates share, and all they may
// reach of the engine: its Redis client, ledger, key layout and script
// runner (Core), the holds' hand-offs they need (Holds), the validation,
// errors and reply codes every path speaks, and the settings of an
// admission queue. Package inventory builds the Core and hands it to each
// aggregate (inventory/drop, inventory/waitlist, ...); an aggregate imports
// this package, the script layer, the policy and the outcomes, never
// another aggregate and never inventory itself.
package core

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
)

// Core is the engine's shared machinery, as the aggregates see it.
type Core struct {
	// Redis is the engine's client, for the reads that run no script.
	Redis  redis.UniversalClient
	Ledger *db.Ledger
	Keys   script.Keys
	Log    zerolog.Logger
	// Run runs one script (by SHA, loading it on NOSCRIPT); a Redis error
	// comes back as ErrUnavailable with its cause.
	Run script.Runner
	// RunMany runs calls of one script, pipelined, and returns each
	// call's reply or error.
	RunMany func(ctx context.Context, name string, calls []script.Call) ([]script.Reply, []error)
	Metrics *Metrics
	Limits  Limits
	Holds   Holds
}

// Limits are the engine's settings an aggregate checks a request against.
type Limits struct {
	MaxQuantity int
	MinHold     time.Duration
	MaxHold     time.Duration
	WaitlistMax int
}

// Holds is what an aggregate asks of the holds and the rebuilds, which live
// in package inventory above the aggregates.
type Holds interface {
	// Rebuild loads a SKU into Redis from the ledger (read-repair).
	Rebuild(ctx context.Context, sku string) error
	// CheckReserve checks a reserve's principal, SKU, quantity, hold
	// duration and idempotency key ("" for none) as Reserve does, and
	// returns the hold duration (the default when holdFor is 0).
	CheckReserve(p Principal, sku string, quantity int, holdFor time.Duration, idempotencyKey string) (time.Duration, error)
	// Reservation reads one of the principal's holds.
	Reservation(ctx context.Context, p Principal, token string) (Reservation, error)
}

// Principal is who is calling: the subject of a verified token.
type Principal struct {
	ID    string
	Admin bool
}

// SyncReleaseTimeout bounds a best-effort ledger write made before the
// reply (a cancel's, a waitlist join's): a slow Postgres delays the reply
// by at most this, never fails it.
const SyncReleaseTimeout = 500 * time.Millisecond
