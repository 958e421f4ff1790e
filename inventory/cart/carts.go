package cart

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Carts reserves, commits, cancels and extends carts; package inventory's
// Engine.Carts hands them out, and its Maintenance sweeps them.
type Carts struct{ e *engine }

// Settings are the engine's settings a cart is held to (package
// inventory's Config).
type Settings struct {
	CartSettle     time.Duration
	IdempotencyTTL time.Duration
	RejectionTTL   time.Duration
	Retention      time.Duration
	CommitTimeout  time.Duration
	Pause          Pause
}

// Holds is what a cart asks of the holds its lines are, which live in
// package inventory above the aggregates.
type Holds interface {
	core.Holds
	// SpendUnits spends cost units of the principal's mutation budget.
	SpendUnits(ctx context.Context, l core.RateLimit, cost int) error
	// ClaimIdempotencyKey and KeepIdempotencyClaim claim a key for claim
	// (a SKU, or what a cart or an extension uses in its place), first for
	// a rejection's time, then for the key's.
	ClaimIdempotencyKey(ctx context.Context, idem, claim string) error
	KeepIdempotencyClaim(ctx context.Context, idem, claim string) error
	// HoldFromHash and HoldOf read a hold from its Redis hash or from a
	// script's hold reply.
	HoldFromHash(token string, h map[string]string) core.Reservation
	HoldOf(h script.Hold) core.Reservation
	// FinishCommit ends a commit attempt of a hold (finish_commit.lua).
	FinishCommit(ctx context.Context, token string, h core.Reservation, outcome string, committedAt time.Time, attemptID string) (core.Reservation, error)
	// Release lets a hold go (release_hold.lua), ReleaseArgs are its
	// arguments for a pipelined run, RecordRelease writes it to the ledger.
	Release(ctx context.Context, partition int, token string, p core.Principal, status string) (script.Hold, error)
	ReleaseArgs(partition int, token string, p core.Principal, status string) script.ReleaseHold
	RecordRelease(ctx context.Context, r core.Reservation)
	// CheckExtension checks an extension and claims its key; ExtendHold
	// extends one hold.
	CheckExtension(ctx context.Context, p core.Principal, token string, req core.ExtendRequest) (string, error)
	ExtendHold(ctx context.Context, p core.Principal, token string, holdFor time.Duration, idem string) (core.Reservation, error)
}

// New is the carts of the engine whose shared parts c are.
func New(c *core.Core, h Holds, s Settings) Carts {
	return Carts{e: &engine{core: c, holds: h, cfg: s, rdb: c.Redis, ledger: c.Ledger, keys: c.Keys, log: c.Log}}
}

// engine is what the carts' code reaches through e: the core, the holds
// and the settings.
type engine struct {
	core   *core.Core
	holds  Holds
	cfg    Settings
	rdb    redis.UniversalClient
	ledger *db.Ledger
	keys   script.Keys
	log    zerolog.Logger
}

func (e *engine) run(ctx context.Context, c script.Call) (script.Reply, error) {
	return e.core.Run(ctx, c)
}

// attempt is the commit attempt begin_commit.lua started on a line.
type attempt struct {
	id    string
	moved bool
}

func attemptOf(r script.BeginCommitReply) attempt { return attempt{id: r.AttemptID, moved: r.Moved} }
