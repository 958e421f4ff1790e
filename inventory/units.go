package inventory

import (
	"context"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/cart"
	"github.com/dropline/dropline/inventory/draw"
	"github.com/dropline/dropline/inventory/drop"
	"github.com/dropline/dropline/inventory/waitlist"
)

// The engine is cut by what it sells. Engine itself keeps the holds
// (reserve, commit, cancel, extend, and reading them) and what every part
// shares (configuration, keys, scripts, the ledger, rebuilds, the mutation
// budget); each other aggregate is a type of its own, reached through its
// accessor: e.Carts().ReserveCart(...), e.Catalog().Stock(...). An
// aggregate that is a package of its own (inventory/cart, inventory/draw,
// inventory/drop, inventory/waitlist) is handed the engine's core (package
// inventory/core, built in shared.go) and imports nothing of this package
// or of another aggregate (internal/archtest's layers). The catalog is
// still files of this package (product.go, stock.go, status.go), and
// TestAggregatesStayApart checks that the engine's own code calls none of
// its exported methods: they meet only in the engine's shared parts, the
// sale policy and the script layer.

// Carts reserves, commits, cancels and extends carts: several SKUs held
// together or not at all (see Carts in doc.go). Package inventory/cart has
// them.
type Carts = cart.Carts

// Carts is the engine's carts.
func (e *Engine) Carts() Carts { return e.carts }

func (e *Engine) newCarts() Carts {
	return cart.New(e.core, holds{e: e}, cart.Settings{CartSettle: e.cfg.CartSettle, IdempotencyTTL: e.cfg.IdempotencyTTL,
		RejectionTTL: e.cfg.RejectionTTL, Retention: e.cfg.Retention, CommitTimeout: e.cfg.CommitTimeout, Pause: e.cfg.CartPause})
}

// A cart and what makes one, as package cart has them.
type (
	// Cart is several SKUs held together or not at all.
	Cart = cart.Cart
	// CartLine is one SKU of a cart and its quantity.
	CartLine = cart.Line
	// CartRequest asks for a cart.
	CartRequest = cart.Request
	// CartRefusedError is a cart refused for its lines' refusals.
	CartRefusedError = cart.RefusedError
	// CartLineError is one line's refusal.
	CartLineError = cart.LineError
	// CartPause is a test-only pause of ReserveCart at one step.
	CartPause = cart.Pause
)

// The bounds of a cart, and the steps a CartPause may stop at.
const (
	MaxCartLines       = cart.MaxLines
	DefaultCartSettle  = cart.DefaultSettle
	CartPauseHeld      = cart.PauseHeld
	CartPauseConfirmed = cart.PauseConfirmed
)

// AbandonStaleCarts is the cart sweep (see cart.Carts.AbandonStaleCarts).
func (m *Maintenance) AbandonStaleCarts(ctx context.Context, limit int) (int, error) {
	return m.e.carts.AbandonStaleCarts(ctx, limit)
}

// SweepCarts is AbandonStaleCarts for at most carts carts in all (see
// cart.Carts.SweepCarts).
func (m *Maintenance) SweepCarts(ctx context.Context, perPartition, carts int) (n int, more bool, err error) {
	return m.e.carts.SweepCarts(ctx, perPartition, carts)
}

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
// doc.go). Package inventory/draw has them.
type Draws = draw.Draws

// Draws is the engine's draws.
func (e *Engine) Draws() Draws { return e.draws }

func (e *Engine) newDraws() Draws {
	return draw.New(e.core, holds{e: e}, draw.Settings{Pause: e.cfg.DrawPause}, e.metrics.draws)
}

// A draw, its entries and what makes one, as package draw has them.
type (
	// DrawInput makes a new product sold by draw.
	DrawInput = draw.Input
	// Draw is a product's draw as anyone may see it.
	Draw = draw.Draw
	// DrawEntry is a principal's entry in a draw.
	DrawEntry = draw.Entry
	// DrawReport is what one RunDraw did.
	DrawReport = draw.Report
	// DrawStage names a point of RunDrawSteps.
	DrawStage = draw.Stage
	// DrawPause is a test-only pause of RunDraw at one step.
	DrawPause = draw.Pause
)

// The statuses of a draw and of an entry, the stages RunDrawSteps reports,
// the steps a DrawPause may stop at, and the bound of MyDrawEntries.
const (
	DrawOpen         = draw.Open
	DrawDrawn        = draw.Drawn
	EntryEntered     = draw.Entered
	EntryWon         = draw.Won
	EntryLost        = draw.Lost
	DrawDecided      = draw.Decided
	DrawApplying     = draw.Applying
	DrawPauseDecided = draw.PauseDecided
	DrawPauseApplied = draw.PauseApplied
	MaxMyDrawEntries = draw.MaxMine
)

// DrawDecision computes a draw's outcome (see draw.Decision).
func DrawDecision(seed []byte, stock int, quantities []int) (places []int, won []bool) {
	return draw.Decision(seed, stock, quantities)
}

// DrawWinners is the draw's walk of the shuffled entries (see draw.Winners).
func DrawWinners(seed []byte, stock int, quantities []int) (order []int, won []bool) {
	return draw.Winners(seed, stock, quantities)
}

// DrawOrder is the draw's shuffle of n entries (see draw.Order).
func DrawOrder(seed []byte, n int) []int { return draw.Order(seed, n) }

// DueDraws lists up to limit SKUs whose draw should run now (see
// draw.Draws.DueDraws).
func (m *Maintenance) DueDraws(ctx context.Context, limit int) ([]string, error) {
	return m.e.draws.DueDraws(ctx, limit)
}

// checkDraw validates a new product's draw (draw.Check).
func (e *Engine) checkDraw(in ProductInput) error {
	return draw.Check(*in.Draw, in.SaleStartsAt, in.SaleEndsAt, e.core.Limits)
}

// newDraw is a new product's draw with its seed (draw.Seeded).
func newDraw(d DrawInput) *db.NewDraw { return draw.Seeded(d) }

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
