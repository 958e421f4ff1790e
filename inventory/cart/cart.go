// Package cart reserves, commits, cancels and extends carts: several SKUs
// held together or not at all (see Carts in package inventory's doc). A
// cart's lines are holds, in their SKUs' partitions; what a cart needs of
// the holds (releasing, committing, extending one, reading it, claiming an
// idempotency key, spending the mutation budget) it asks of package
// inventory through Holds, and the rest of the engine through package core.
package cart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// MaxLines is the most lines one cart may have.
const MaxLines = 50

// DefaultSettle is Config.CartSettle's default.
const DefaultSettle = 2 * time.Second

// cartSweepMargin is how long past its deadline a PENDING cart waits before
// the cart sweep lets it go: room for the clocks of two Redis nodes to
// differ, so that no line can still be held or confirmed on a node whose
// clock is behind (see AbandonStaleCarts).
const cartSweepMargin = 250 * time.Millisecond

// Pause is a test-only pause of ReserveCart at one step (see
// Config.CartPause).
type Pause struct {
	// At is where: PauseHeld (every partition's lines held
	// provisionally, none confirmed) or PauseConfirmed (the first
	// partition's lines confirmed, the others not yet); "" never pauses.
	At string
	// For is how long.
	For time.Duration
}

// The steps a Pause may stop at.
const (
	PauseHeld      = "held"
	PauseConfirmed = "confirmed"
)

// Validate refuses a pause at an unknown step or for a negative time.
func (c Pause) Validate() error {
	if (c.At != "" && c.At != PauseHeld && c.At != PauseConfirmed) || c.For < 0 {
		return fmt.Errorf("cart pause %q for %s: the step must be %q or %q, the time not negative", c.At, c.For, PauseHeld, PauseConfirmed)
	}
	return nil
}

// cartClaim is what an idempotency key used for a cart is claimed for, in
// place of a SKU: it is no valid SKU, so the key can serve one cart and
// never a reserve as well.
const cartClaim = "#cart"

// Line asks for units of one SKU as part of a cart.
type Line struct {
	SKU      string
	Quantity int
}

// Request asks for every line of a cart, or none.
type Request struct {
	// Lines are 1 to MaxLines; lines of the same SKU are added up before
	// anything is checked.
	Lines []Line
	// IdempotencyKey works as for ReserveRequest: the same key from the same
	// principal returns the first outcome (the same cart for
	// IdempotencyTTL, the same refusal for RejectionTTL).
	IdempotencyKey string
	// HoldFor is how long the cart's lines are held; 0 means the default.
	HoldFor time.Duration
	// AdmissionPass is the caller's admission pass, for lines of a queued
	// product or drop: one pass serves the lines of its queue, and holding
	// them spends it. "" for none.
	AdmissionPass string
	// RateLimit, when set, is the caller's mutation budget: the cart spends
	// one unit per line it holds (its lines after those of one SKU are
	// added up), before anything else, and is refused with
	// *RateLimitedError when they are not left; an invalid request spends
	// one unit, as any mutation. A cart of more lines than the budget's
	// burst could never be afforded and is refused with *InvalidInputError.
	RateLimit *core.RateLimit
}

// Cart is a set of holds made, committed and cancelled together: one
// reservation per SKU, all with the cart's expiry.
type Cart struct {
	Token     string
	Principal string
	// Status is HELD while any line is held, COMMITTED once every line is
	// sold, CANCELLED or EXPIRED once its lines were let go.
	Status    core.Status
	CreatedAt time.Time
	ExpiresAt time.Time
	Lines     []core.Reservation
	// Replayed is true when the call changed nothing and returned an
	// earlier outcome.
	Replayed bool
}

// RefusedError says why a cart was not held: one entry per input line
// that could not be had (a SKU asked for on several lines names each of
// them). Nothing was held.
type RefusedError struct {
	Lines []LineError
}

// LineError is the refusal of one input line of a cart: Index is its
// position in Request.Lines, Err one of *OutOfStockError,
// *QuotaExceededError (the SKU's limit, or its drop's), *SaleNotActiveError,
// *NotFoundError, *InvalidInputError or ErrDrawOnly.
type LineError struct {
	Index int
	Err   error
}

func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Lines))
	for i, l := range e.Lines {
		parts[i] = fmt.Sprintf("line %d: %v", l.Index, l.Err)
	}
	return "the cart cannot be held: " + strings.Join(parts, "; ")
}

// Unwrap gives each line's refusal, so errors.Is finds any of them.
func (e *RefusedError) Unwrap() []error {
	out := make([]error, len(e.Lines))
	for i, l := range e.Lines {
		out[i] = l.Err
	}
	return out
}

// Available is how many units of the line's SKU the line could have had:
// the stock left for OUT_OF_STOCK, what the limit still allows for
// QUOTA_EXCEEDED, 0 otherwise.
func (l LineError) Available() int {
	var (
		oos *outcome.OutOfStockError
		qe  *outcome.QuotaExceededError
	)
	switch {
	case errors.As(l.Err, &oos):
		return max(oos.Available, 0)
	case errors.As(l.Err, &qe):
		return max(qe.Limit-qe.Held, 0)
	}
	return 0
}

// errCartLate is a cart whose lines were not all held and confirmed by its
// deadline.
var errCartLate = errors.New("the cart's deadline passed before every line was held")

// cartLine is one SKU of a cart, its quantities added up.
type cartLine struct {
	SKU      string `json:"s"`
	Quantity int    `json:"q"`
	Token    string `json:"t"`
	indexes  []int  // the input lines that asked for it
}

// scriptLines is lines as the cart scripts take them.
func scriptLines(lines []cartLine) []script.CartLine {
	out := make([]script.CartLine, len(lines))
	for i, l := range lines {
		out[i] = script.CartLine{SKU: l.SKU, Quantity: l.Quantity, Token: l.Token}
	}
	return out
}

// checkCart validates a cart request and adds up its lines per SKU, in the
// order of their first appearance.
func (e *engine) checkCart(p core.Principal, req Request) (time.Duration, []cartLine, error) {
	if err := core.CheckPrincipal(p); err != nil {
		return 0, nil, err
	}
	if len(req.Lines) < 1 || len(req.Lines) > MaxLines {
		return 0, nil, &outcome.InvalidInputError{Field: "lines", Reason: fmt.Sprintf("a cart has 1 to %d lines", MaxLines)}
	}
	hold, err := e.holds.CheckReserve(p, req.Lines[0].SKU, 1, req.HoldFor, req.IdempotencyKey)
	if err != nil {
		var inv *outcome.InvalidInputError
		if errors.As(err, &inv) && inv.Field == "sku" {
			return 0, nil, &outcome.InvalidInputError{Field: "lines.0.sku", Reason: inv.Reason}
		}
		return 0, nil, err
	}
	var lines []cartLine
	at := map[string]int{}
	for i, l := range req.Lines {
		if !core.ValidSKU(l.SKU) {
			return 0, nil, &outcome.InvalidInputError{Field: fmt.Sprintf("lines.%d.sku", i), Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
		}
		if l.Quantity < 1 || l.Quantity > e.core.Limits.MaxQuantity {
			return 0, nil, &outcome.InvalidInputError{Field: fmt.Sprintf("lines.%d.quantity", i), Reason: fmt.Sprintf("must be between 1 and %d", e.core.Limits.MaxQuantity)}
		}
		j, ok := at[l.SKU]
		if !ok {
			j = len(lines)
			at[l.SKU] = j
			lines = append(lines, cartLine{SKU: l.SKU})
		}
		lines[j].Quantity += l.Quantity
		lines[j].indexes = append(lines[j].indexes, i)
		if lines[j].Quantity > e.core.Limits.MaxQuantity {
			return 0, nil, &outcome.InvalidInputError{Field: fmt.Sprintf("lines.%d.quantity", i),
				Reason: fmt.Sprintf("the lines of %s add up to more than %d", l.SKU, e.core.Limits.MaxQuantity)}
		}
	}
	return hold, lines, nil
}

// cartRequestHash fingerprints a cart request: its SKUs and summed
// quantities in SKU order, and its hold time.
func cartRequestHash(lines []cartLine, holdMillis int64) string {
	parts := make([]string, len(lines))
	for i, l := range lines {
		parts[i] = l.SKU + "\x00" + strconv.Itoa(l.Quantity)
	}
	slices.Sort(parts)
	return core.RequestHash("cart\x00"+strings.Join(parts, "\x00"), len(lines), holdMillis)
}

// ReserveCart holds every line of a cart for a principal, or none of them.
//
// The lines may live in many partitions (and Redis Cluster slots), which no
// one script can touch together, so the cart is held in steps, each one
// script: open_cart.lua records the cart as PENDING in its home partition
// with a deadline CartSettle away; hold_cart_lines.lua holds each
// partition's lines (all of that partition or none), provisionally, until
// that deadline; once every partition has, confirm_cart_lines.lua gives the
// lines the cart's expiry and records them in the ledger, and
// finish_cart.lua records the cart as HELD. When any line is refused, every
// held line is let go before the refusal is answered. A caller that dies on
// the way leaves provisional holds that the sweeper releases at the
// deadline, and a PENDING cart that the cart sweep (AbandonStaleCarts) lets
// go of shortly after it: no unit is kept from other buyers by an unfinished
// cart for longer than about CartSettle (docs/design.md, G10).
//
// Refusals: *RefusedError (every line that cannot be had, nothing held),
// *InvalidInputError, ErrIdempotencyKeyReused, ErrUnavailable (retry: Redis
// could not be reached, or the cart could not be held within CartSettle).
func (a Carts) ReserveCart(ctx context.Context, p core.Principal, req Request) (cart Cart, err error) {
	e := a.e
	defer func() { e.core.Metrics.Outcome("reserve_cart", err) }()
	hold, lines, err := e.checkCart(p, req)
	if l := req.RateLimit; l != nil {
		// What a cart leaves in Redis grows with its lines, so it pays for
		// each: the budget bounds holds, not calls (docs/design.md, G9).
		cost := len(lines)
		if err == nil && cost > l.Burst {
			err = &outcome.InvalidInputError{Field: "lines", Reason: fmt.Sprintf(
				"a cart spends one mutation per line, and a buyer may send at most %d at once", l.Burst)}
		}
		if err != nil {
			cost = 1 // refused before any script, as any mutation
		}
		if lerr := e.holds.SpendUnits(ctx, *l, cost); lerr != nil {
			return Cart{}, lerr
		}
	}
	if err != nil {
		return Cart{}, err
	}
	var idem, fp string
	home := rand.IntN(script.Partitions) //nolint:gosec // spreads carts over partitions; nothing secret depends on it
	if req.IdempotencyKey != "" {
		idem = core.IdempotencyHash(p.ID, req.IdempotencyKey)
		fp = cartRequestHash(lines, hold.Milliseconds())
		home = int(crc32.ChecksumIEEE([]byte(idem)) % script.Partitions)
		if err := e.holds.ClaimIdempotencyKey(ctx, idem, cartClaim); err != nil {
			return Cart{}, err
		}
	}
	if err := e.loadCartSKUs(ctx, lines); err != nil {
		return Cart{}, err
	}
	for attempt := 0; attempt < 3; attempt++ {
		cart, retry, err := e.tryCart(ctx, p, home, lines, hold, idem, fp, req.AdmissionPass)
		if !retry {
			if err == nil && idem != "" && !cart.Replayed {
				if err := e.holds.KeepIdempotencyClaim(ctx, idem, cartClaim); err != nil {
					return Cart{}, err
				}
			}
			return cart, err
		}
	}
	return Cart{}, core.Unavailable("reserving cart", errCartLate)
}

// loadCartSKUs rebuilds from the ledger every SKU of the cart Redis does not
// have, so the scripts of the cart find them; a SKU the ledger does not
// know either refuses its lines.
func (e *engine) loadCartSKUs(ctx context.Context, lines []cartLine) error {
	cmds := make([]*redis.IntCmd, len(lines))
	_, err := e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, l := range lines {
			cmds[i] = pipe.Exists(ctx, e.keys.SKU(l.SKU))
		}
		return nil
	})
	if err != nil {
		return core.Unavailable("reserving cart", err)
	}
	var refused []LineError
	for i, c := range cmds {
		if c.Val() == 1 {
			continue
		}
		err := e.holds.Rebuild(ctx, lines[i].SKU)
		switch {
		case errors.Is(err, outcome.ErrNotFound):
			for _, idx := range lines[i].indexes {
				refused = append(refused, LineError{Index: idx, Err: &outcome.NotFoundError{Kind: "product", Key: lines[i].SKU, Field: fmt.Sprintf("lines.%d.sku", idx)}})
			}
		case err != nil:
			return fmt.Errorf("reserving cart: %w", err)
		}
	}
	if len(refused) > 0 {
		slices.SortFunc(refused, func(a, b LineError) int { return a.Index - b.Index })
		return &RefusedError{Lines: refused}
	}
	return nil
}

// cartRefusal is one refused SKU, as a cart's record keeps it for replay.
type cartRefusal struct {
	SKU  string `json:"s"`
	Code string `json:"c"`
	A    string `json:"a"`
	B    string `json:"b"`
}

// refusalsError turns the refusals of SKUs into the refusal of the input
// lines that asked for them.
func refusalsError(lines []cartLine, refusals []cartRefusal) error {
	bySKU := map[string][]int{}
	for _, l := range lines {
		bySKU[l.SKU] = l.indexes
	}
	var out []LineError
	for _, r := range refusals {
		err := core.RejectionError(script.Rejection{Code: r.Code, A: r.A, B: r.B})
		if err == nil {
			err = fmt.Errorf("unexpected refusal %q", r.Code)
		}
		for _, idx := range bySKU[r.SKU] {
			out = append(out, LineError{Index: idx, Err: err})
		}
	}
	slices.SortFunc(out, func(a, b LineError) int { return a.Index - b.Index })
	return &RefusedError{Lines: out}
}

// CartOf returns a cart by token: its holder's or, for an admin, anyone's.
// A cart that never held (refused, or let go before it was) is not found.
func (a Carts) CartOf(ctx context.Context, p core.Principal, token string) (Cart, error) {
	e := a.e
	return e.readCart(ctx, p, token)
}
func cartNotFound(token string) error {
	return &outcome.NotFoundError{Kind: "cart", Key: token, Field: "token"}
}

// readCart reads a cart and its lines: one round trip for the cart, one
// pipeline for the lines; a line Redis no longer has is read as a
// reservation (from the ledger).
func (e *engine) readCart(ctx context.Context, p core.Principal, token string) (Cart, error) {
	home, err := core.ParseCartToken(token)
	if err != nil {
		return Cart{}, err
	}
	if err := core.CheckPrincipal(p); err != nil {
		return Cart{}, err
	}
	h, err := e.rdb.HGetAll(ctx, e.keys.Cart(home, token)).Result()
	if err != nil {
		return Cart{}, core.Unavailable("reading cart", err)
	}
	if len(h) == 0 || h["st"] != "HELD" {
		return Cart{}, cartNotFound(token)
	}
	if h["who"] != p.ID && !p.Admin {
		return Cart{}, outcome.ErrForbidden
	}
	var lines []cartLine
	if err := json.Unmarshal([]byte(h["lines"]), &lines); err != nil {
		return Cart{}, fmt.Errorf("reading cart %s: %w", token, err)
	}
	holds := make([]*redis.MapStringStringCmd, len(lines))
	gens := make([]*redis.StringCmd, len(lines))
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, l := range lines {
			holds[i] = pipe.HGetAll(ctx, e.keys.Hold(e.keys.PartitionOf(l.SKU), l.Token))
			gens[i] = pipe.HGet(ctx, e.keys.SKU(l.SKU), "gen")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Cart{}, core.Unavailable("reading cart", err)
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(h[k], 10, 64); return n }
	cart := Cart{Token: token, Principal: h["who"], CreatedAt: core.MsTime(num("ctd")), ExpiresAt: core.MsTime(num("exp"))}
	for i, l := range lines {
		lh := holds[i].Val()
		var r core.Reservation
		if len(lh) > 0 && lh["gen"] == gens[i].Val() {
			r = e.holds.HoldFromHash(l.Token, lh)
		} else if r, err = e.holds.Reservation(ctx, p, l.Token); err != nil {
			return Cart{}, fmt.Errorf("reading cart %s: %w", token, err)
		}
		cart.Lines = append(cart.Lines, r)
	}
	cart.Status = cartStatus(cart.Lines)
	return cart, nil
}

// cartStatus is a cart's status from its lines': COMMITTED when every line
// is sold, HELD while any is held, else CANCELLED if any was cancelled, else
// EXPIRED.
func cartStatus(lines []core.Reservation) core.Status {
	count := map[core.Status]int{}
	for _, l := range lines {
		count[l.Status]++
	}
	switch {
	case count[core.StatusCommitted] == len(lines):
		return core.StatusCommitted
	case count[core.StatusHeld] > 0 || count[core.StatusCommitted] > 0:
		return core.StatusHeld
	case count[core.StatusCancelled] > 0:
		return core.StatusCancelled
	}
	return core.StatusExpired
}
