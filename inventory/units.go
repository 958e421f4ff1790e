package inventory

import (
	"context"

	"github.com/dropline/dropline/inventory/drop"
	"github.com/dropline/dropline/inventory/waitlist"
)

// The engine is cut by what it sells. Engine itself keeps the holds
// (reserve, commit, cancel, extend, and reading them) and what every part
// shares (configuration, keys, scripts, the ledger, rebuilds, the mutation
// budget); each other aggregate is a type of its own, reached through its
// accessor: e.Carts().ReserveCart(...), e.Catalog().Stock(...). An
// aggregate that is a package of its own (inventory/drop) is handed the
// engine's core (package inventory/core) and imports nothing of this
// package or of another aggregate (internal/archtest's layers). The others
// are still files of this package (carts: cart*.go; waitlists:
// waitlist.go, walk.go; draws: draw*.go; the catalog: product.go,
// stock.go, status.go), and TestAggregatesStayApart checks that no
// aggregate's code calls another's exported methods: they meet only in the
// engine's shared parts, the sale policy and the script layer.

// Carts reserves, commits, cancels and extends carts: several SKUs held
// together or not at all (see Carts in doc.go).
type Carts struct{ e *Engine }

// Carts is the engine's carts.
func (e *Engine) Carts() Carts { return Carts{e: e} }

// Waitlists puts buyers in a SKU's waitlist and reads it (see Waitlist in
// doc.go); freed units reach waiters inside the scripts that free them.
// Package inventory/waitlist has them.
type Waitlists = waitlist.Waitlists

// Waitlists is the engine's waitlists.
func (e *Engine) Waitlists() Waitlists { return waitlist.New(e.core) }

// A waitlist's entries and requests, as package waitlist has them.
type (
	// WaitStatus is where a waitlist entry is.
	WaitStatus = waitlist.Status
	// WaitlistEntry is one principal's place in a SKU's waitlist.
	WaitlistEntry = waitlist.Entry
	// JoinWaitlistRequest asks to be handed units of a SKU when they come back.
	JoinWaitlistRequest = waitlist.JoinRequest
)

// The statuses of a waitlist entry.
const (
	WaitWaiting = waitlist.Waiting
	WaitOffered = waitlist.Offered
	WaitLeft    = waitlist.Left
)

// MaxMyWaitlist bounds the entries MyWaitlist lists.
const MaxMyWaitlist = waitlist.MaxMine

// Draws takes a draw's entries, runs it and reads its result (see Draws in
// doc.go).
type Draws struct{ e *Engine }

// Draws is the engine's draws.
func (e *Engine) Draws() Draws { return Draws{e: e} }

// Drops creates and reads drops: SKUs under one per-person limit and one
// sale window (see Drops in doc.go). Package inventory/drop has them.
type Drops = drop.Drops

// Drops is the engine's drops.
func (e *Engine) Drops() Drops { return drop.New(e.core) }

// A Drop and what creates one, as package drop has them.
type (
	// Drop groups SKUs under one per-person limit and one sale window.
	Drop = drop.Drop
	// DropInput creates a drop.
	DropInput = drop.Input
)

// MaxDropSKUs is the most SKUs one drop may have.
const MaxDropSKUs = drop.MaxSKUs

// applyDrop writes the ledger's drop to Redis (drop.Apply).
func (e *Engine) applyDrop(ctx context.Context, id string) error { return drop.Apply(ctx, e.core, id) }

// Catalog creates, changes and reads products and their stock.
type Catalog struct{ e *Engine }

// Catalog is the engine's products and their stock.
func (e *Engine) Catalog() Catalog { return Catalog{e: e} }
