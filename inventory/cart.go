package inventory

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
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// MaxCartLines is the most lines one cart may have.
const MaxCartLines = 50

// DefaultCartSettle is Config.CartSettle's default.
const DefaultCartSettle = 2 * time.Second

// cartSweepMargin is how long past its deadline a PENDING cart waits before
// the cart sweep lets it go: room for the clocks of two Redis nodes to
// differ, so that no line can still be held or confirmed on a node whose
// clock is behind (see AbandonStaleCarts).
const cartSweepMargin = 250 * time.Millisecond

// CartPause is a test-only pause of ReserveCart at one step (see
// Config.CartPause).
type CartPause struct {
	// At is where: CartPauseHeld (every partition's lines held
	// provisionally, none confirmed) or CartPauseConfirmed (the first
	// partition's lines confirmed, the others not yet); "" never pauses.
	At string
	// For is how long.
	For time.Duration
}

// The steps a CartPause may stop at.
const (
	CartPauseHeld      = "held"
	CartPauseConfirmed = "confirmed"
)

func (c CartPause) validate() error {
	if (c.At != "" && c.At != CartPauseHeld && c.At != CartPauseConfirmed) || c.For < 0 {
		return fmt.Errorf("cart pause %q for %s: the step must be %q or %q, the time not negative", c.At, c.For, CartPauseHeld, CartPauseConfirmed)
	}
	return nil
}

// cartClaim is what an idempotency key used for a cart is claimed for, in
// place of a SKU: it is no valid SKU, so the key can serve one cart and
// never a reserve as well.
const cartClaim = "#cart"

// CartLine asks for units of one SKU as part of a cart.
type CartLine struct {
	SKU      string
	Quantity int
}

// CartRequest asks for every line of a cart, or none.
type CartRequest struct {
	// Lines are 1 to MaxCartLines; lines of the same SKU are added up before
	// anything is checked.
	Lines []CartLine
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
	RateLimit *RateLimit
}

// Cart is a set of holds made, committed and cancelled together: one
// reservation per SKU, all with the cart's expiry.
type Cart struct {
	Token     string
	Principal string
	// Status is HELD while any line is held, COMMITTED once every line is
	// sold, CANCELLED or EXPIRED once its lines were let go.
	Status    Status
	CreatedAt time.Time
	ExpiresAt time.Time
	Lines     []Reservation
	// Replayed is true when the call changed nothing and returned an
	// earlier outcome.
	Replayed bool
}

// CartRefusedError says why a cart was not held: one entry per input line
// that could not be had (a SKU asked for on several lines names each of
// them). Nothing was held.
type CartRefusedError struct {
	Lines []CartLineError
}

// CartLineError is the refusal of one input line of a cart: Index is its
// position in CartRequest.Lines, Err one of *OutOfStockError,
// *QuotaExceededError (the SKU's limit, or its drop's), *SaleNotActiveError,
// *NotFoundError, *InvalidInputError or ErrDrawOnly.
type CartLineError struct {
	Index int
	Err   error
}

func (e *CartRefusedError) Error() string {
	parts := make([]string, len(e.Lines))
	for i, l := range e.Lines {
		parts[i] = fmt.Sprintf("line %d: %v", l.Index, l.Err)
	}
	return "the cart cannot be held: " + strings.Join(parts, "; ")
}

// Unwrap gives each line's refusal, so errors.Is finds any of them.
func (e *CartRefusedError) Unwrap() []error {
	out := make([]error, len(e.Lines))
	for i, l := range e.Lines {
		out[i] = l.Err
	}
	return out
}

// Available is how many units of the line's SKU the line could have had:
// the stock left for OUT_OF_STOCK, what the limit still allows for
// QUOTA_EXCEEDED, 0 otherwise.
func (l CartLineError) Available() int {
	var (
		oos *OutOfStockError
		qe  *QuotaExceededError
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

// errCartLine refuses a commit, cancel or extension of one line of a cart on
// its own: a cart is sold, let go and extended whole.
var errCartLine = &InvalidInputError{Field: "token", Reason: "this reservation is a line of a cart: commit, cancel or extend the cart"}

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
func (e *Engine) checkCart(p Principal, req CartRequest) (time.Duration, []cartLine, error) {
	if err := checkPrincipal(p); err != nil {
		return 0, nil, err
	}
	if len(req.Lines) < 1 || len(req.Lines) > MaxCartLines {
		return 0, nil, &InvalidInputError{Field: "lines", Reason: fmt.Sprintf("a cart has 1 to %d lines", MaxCartLines)}
	}
	hold, err := e.checkReserve(p, ReserveRequest{SKU: req.Lines[0].SKU, Quantity: 1, IdempotencyKey: req.IdempotencyKey, HoldFor: req.HoldFor})
	if err != nil {
		var inv *InvalidInputError
		if errors.As(err, &inv) && inv.Field == "sku" {
			return 0, nil, &InvalidInputError{Field: "lines.0.sku", Reason: inv.Reason}
		}
		return 0, nil, err
	}
	var lines []cartLine
	at := map[string]int{}
	for i, l := range req.Lines {
		if !ValidSKU(l.SKU) {
			return 0, nil, &InvalidInputError{Field: fmt.Sprintf("lines.%d.sku", i), Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
		}
		if l.Quantity < 1 || l.Quantity > e.cfg.MaxQuantity {
			return 0, nil, &InvalidInputError{Field: fmt.Sprintf("lines.%d.quantity", i), Reason: fmt.Sprintf("must be between 1 and %d", e.cfg.MaxQuantity)}
		}
		j, ok := at[l.SKU]
		if !ok {
			j = len(lines)
			at[l.SKU] = j
			lines = append(lines, cartLine{SKU: l.SKU})
		}
		lines[j].Quantity += l.Quantity
		lines[j].indexes = append(lines[j].indexes, i)
		if lines[j].Quantity > e.cfg.MaxQuantity {
			return 0, nil, &InvalidInputError{Field: fmt.Sprintf("lines.%d.quantity", i),
				Reason: fmt.Sprintf("the lines of %s add up to more than %d", l.SKU, e.cfg.MaxQuantity)}
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
	return requestHash("cart\x00"+strings.Join(parts, "\x00"), len(lines), holdMillis)
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
// Refusals: *CartRefusedError (every line that cannot be had, nothing held),
// *InvalidInputError, ErrIdempotencyKeyReused, ErrUnavailable (retry: Redis
// could not be reached, or the cart could not be held within CartSettle).
func (e *Engine) ReserveCart(ctx context.Context, p Principal, req CartRequest) (cart Cart, err error) {
	defer func() { e.metrics.outcome("reserve_cart", err) }()
	hold, lines, err := e.checkCart(p, req)
	if l := req.RateLimit; l != nil {
		// What a cart leaves in Redis grows with its lines, so it pays for
		// each: the budget bounds holds, not calls (docs/design.md, G9).
		cost := len(lines)
		if err == nil && cost > l.Burst {
			err = &InvalidInputError{Field: "lines", Reason: fmt.Sprintf(
				"a cart spends one mutation per line, and a buyer may send at most %d at once", l.Burst)}
		}
		if err != nil {
			cost = 1 // refused before any script, as any mutation
		}
		if lerr := e.spendUnits(ctx, *l, cost); lerr != nil {
			return Cart{}, lerr
		}
	}
	if err != nil {
		return Cart{}, err
	}
	var idem, fp string
	home := rand.IntN(Partitions) //nolint:gosec // spreads carts over partitions; nothing secret depends on it
	if req.IdempotencyKey != "" {
		idem = idempotencyHash(p.ID, req.IdempotencyKey)
		fp = cartRequestHash(lines, hold.Milliseconds())
		home = int(crc32.ChecksumIEEE([]byte(idem)) % Partitions)
		if err := e.claimIdempotencyKey(ctx, idem, cartClaim); err != nil {
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
				if err := e.keepIdempotencyClaim(ctx, idem, cartClaim); err != nil {
					return Cart{}, err
				}
			}
			return cart, err
		}
	}
	return Cart{}, unavailable("reserving cart", errCartLate)
}

// loadCartSKUs rebuilds from the ledger every SKU of the cart Redis does not
// have, so the scripts of the cart find them; a SKU the ledger does not
// know either refuses its lines.
func (e *Engine) loadCartSKUs(ctx context.Context, lines []cartLine) error {
	cmds := make([]*redis.IntCmd, len(lines))
	_, err := e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, l := range lines {
			cmds[i] = pipe.Exists(ctx, e.keys.SKU(l.SKU))
		}
		return nil
	})
	if err != nil {
		return unavailable("reserving cart", err)
	}
	var refused []CartLineError
	for i, c := range cmds {
		if c.Val() == 1 {
			continue
		}
		err := e.Rebuild(ctx, lines[i].SKU)
		switch {
		case errors.Is(err, ErrNotFound):
			for _, idx := range lines[i].indexes {
				refused = append(refused, CartLineError{Index: idx, Err: &NotFoundError{Kind: "product", Key: lines[i].SKU, Field: fmt.Sprintf("lines.%d.sku", idx)}})
			}
		case err != nil:
			return fmt.Errorf("reserving cart: %w", err)
		}
	}
	if len(refused) > 0 {
		slices.SortFunc(refused, func(a, b CartLineError) int { return a.Index - b.Index })
		return &CartRefusedError{Lines: refused}
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
	var out []CartLineError
	for _, r := range refusals {
		err := rejectionError(script.Rejection{Code: r.Code, A: r.A, B: r.B})
		if err == nil {
			err = fmt.Errorf("unexpected refusal %q", r.Code)
		}
		for _, idx := range bySKU[r.SKU] {
			out = append(out, CartLineError{Index: idx, Err: err})
		}
	}
	slices.SortFunc(out, func(a, b CartLineError) int { return a.Index - b.Index })
	return &CartRefusedError{Lines: out}
}

// tryCart makes one attempt at a cart; retry says a new attempt may work
// (the key's earlier cart never held, or a SKU had to be rebuilt).
func (e *Engine) tryCart(ctx context.Context, p Principal, home int, lines []cartLine, hold time.Duration, idem, fp, pass string) (Cart, bool, error) {
	token := newTokenOf(tokenCart, home)
	for i := range lines {
		lines[i].Token = newTokenOf(tokenLine, e.keys.PartitionOf(lines[i].SKU))
	}
	enc, err := json.Marshal(lines)
	if err != nil {
		return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
	}
	oc, err := script.RunOpenCart(ctx, e.run, e.keys, script.OpenCart{Home: home, Token: token, Principal: p.ID, FP: fp,
		Idem: idem, SettleMs: e.cfg.CartSettle.Milliseconds(), HoldMs: hold.Milliseconds(), Lines: string(enc),
		IdempotencyTTL: int64(e.cfg.IdempotencyTTL.Seconds()), Retention: int64(e.cfg.Retention.Seconds())})
	if err != nil {
		return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
	}
	switch replyCode(oc.Code) {
	case replyOf(ErrIdempotencyKeyReused):
		return Cart{}, false, ErrIdempotencyKeyReused
	case codeRefused:
		var refusals []cartRefusal
		if err := json.Unmarshal([]byte(oc.Refusals), &refusals); err != nil {
			return Cart{}, false, fmt.Errorf("reserving cart: reading a recorded refusal: %w", err)
		}
		return Cart{}, false, refusalsError(lines, refusals)
	case codeOK:
	default:
		return Cart{}, false, fmt.Errorf("reserving cart: unexpected script reply %q", oc.Code)
	}
	if oc.Token != token {
		// The key's first call opened another cart: answer what it got.
		return e.awaitCart(ctx, p, home, oc.Token)
	}
	// Phase 1: every partition's lines, held provisionally, all at once.
	parts := map[int][]cartLine{}
	var order []int
	for _, l := range lines {
		pt := e.keys.PartitionOf(l.SKU)
		if parts[pt] == nil {
			order = append(order, pt)
		}
		parts[pt] = append(parts[pt], l)
	}
	slices.Sort(order)
	results := make([]script.HoldCartLinesReply, len(order))
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, pt := range order {
		wg.Go(func() {
			results[i], errs[i] = script.RunHoldCartLines(ctx, e.run, e.keys, script.HoldCartLines{Partition: pt,
				Principal: p.ID, Cart: token, DeadlineMs: oc.DeadlineMs, MaxQuantity: e.cfg.MaxQuantity, Pass: pass,
				Lines: scriptLines(parts[pt])})
		})
	}
	wg.Wait()
	var refusals []cartRefusal
	var failure error
	var lost []string
	walking := map[string]int{} // SKUs whose waitlist walk is unfinished, by partition
	for i, pt := range order {
		switch {
		case errs[i] != nil:
			failure = errs[i]
		case replyCode(results[i].Code) == codeOK:
		case replyCode(results[i].Code) == codeRefused:
			for _, lr := range results[i].Refusals {
				l := parts[pt][lr.Line-1]
				refusals = append(refusals, cartRefusal{SKU: l.SKU, Code: lr.Code, A: lr.A, B: lr.B})
			}
		case replyCode(results[i].Code) == codeNeedsHydration:
			lost = append(lost, results[i].Missing)
		case replyCode(results[i].Code) == codeWalkPending:
			walking[results[i].Missing] = pt
		case replyCode(results[i].Code) == codeLate:
			failure = errCartLate
		default:
			failure = fmt.Errorf("holding lines: script reply %q", results[i].Code)
		}
	}
	if failure == nil && len(lost) == 0 && len(walking) == 0 && len(refusals) == 0 {
		e.cartPause(CartPauseHeld, "provisional holds made")
		failure = e.confirmCartLines(ctx, token, oc.Exp, order, parts)
		if failure == nil {
			out, err := e.finishCart(ctx, home, token, idem, "HELD", "")
			if err != nil {
				// The script may have run and its reply been lost (or the
				// caller gave up): letting the lines go now could leave a
				// cart recorded HELD without them. finish_cart.lua is safe
				// to run twice, and says how the cart stands.
				out, err = e.finishCart(context.WithoutCancel(ctx), home, token, idem, "HELD", "")
			}
			switch {
			case err != nil:
				// Still unknown, so the lines stay: with a HELD cart, or
				// with a PENDING one the cart sweep lets go with them.
				return Cart{}, false, unavailable("reserving cart", err)
			case out == codeOK:
				cart, err := e.readCart(ctx, p, token)
				return cart, false, err
			default:
				failure = fmt.Errorf("the cart sweep let it go first (%s)", out)
			}
		}
	}
	// Not held: let go of every line before answering.
	e.letGoOfLines(ctx, p.ID, lines)
	outcome, rej := "FAILED", ""
	if failure == nil && len(lost) == 0 && len(walking) == 0 {
		outcome = "REFUSED"
		b, err := json.Marshal(refusals)
		if err != nil {
			return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
		}
		rej = string(b)
	}
	if _, err := e.finishCart(ctx, home, token, idem, outcome, rej); err != nil && failure == nil {
		failure = err
	}
	if len(lost) > 0 {
		for _, sku := range lost {
			if err := e.Rebuild(ctx, sku); err != nil {
				return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
			}
		}
		return Cart{}, true, nil
	}
	if failure == nil && len(walking) > 0 {
		// Units a line could have may still be a waiter's: the walks
		// decide, then a new cart asks again.
		for sku, pt := range walking {
			if _, err := e.finishWalk(ctx, pt, sku); err != nil {
				return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
			}
		}
		return Cart{}, true, nil
	}
	if errors.Is(failure, errCartLate) {
		// Too slow this time (a loaded Redis or a paused process): a new
		// cart, with a new deadline, may make it.
		return Cart{}, true, nil
	}
	if failure != nil {
		return Cart{}, false, unavailable("reserving cart", failure)
	}
	return Cart{}, false, refusalsError(lines, refusals)
}

// confirmCartLines is phase 2: each partition's provisional lines get the
// cart's expiry, partition after partition.
func (e *Engine) confirmCartLines(ctx context.Context, token string, exp int64, order []int, parts map[int][]cartLine) error {
	for i, pt := range order {
		res, err := script.RunConfirmCartLines(ctx, e.run, e.keys,
			script.ConfirmCartLines{Partition: pt, Cart: token, ExpiresMs: exp, Lines: scriptLines(parts[pt])})
		if err != nil {
			return err
		}
		if replyCode(res.Code) == codeLate {
			return errCartLate
		}
		if replyCode(res.Code) != codeOK {
			return fmt.Errorf("confirming lines: script reply %q", res.Code)
		}
		if i == 0 && len(order) > 1 {
			e.cartPause(CartPauseConfirmed, "first partition's lines confirmed")
		}
	}
	return nil
}

// cartPause waits Config.CartPause at step; only the fault tests set it, to
// kill a server in the middle of a cart.
func (e *Engine) cartPause(at, step string) {
	if e.cfg.CartPause.At != at || e.cfg.CartPause.For <= 0 {
		return
	}
	e.log.Warn().Str("step", step).Dur("pause", e.cfg.CartPause.For).Msg("test-only pause between the steps of a cart")
	time.Sleep(e.cfg.CartPause.For)
}

// finishCart runs finish_cart.lua and returns its code.
func (e *Engine) finishCart(ctx context.Context, home int, token, idem, outcome, rej string) (replyCode, error) {
	res, err := script.RunFinishCart(ctx, e.run, e.keys, script.FinishCart{Home: home, Token: token, Idem: idem,
		Outcome: outcome, Refusals: rej, RejectionTTL: int64(e.cfg.RejectionTTL.Seconds()), Retention: int64(e.cfg.Retention.Seconds())})
	if err != nil {
		return "", fmt.Errorf("finishing cart %s: %w", token, err)
	}
	return replyCode(res.Code), nil
}

// letGoOfLines releases every line of a cart that did not come to be held
// whole. Releasing is idempotent, and a line never made is simply not
// found. A failure is only logged: the provisional expiry and the cart
// sweep release what is left.
func (e *Engine) letGoOfLines(ctx context.Context, who string, lines []cartLine) {
	ctx = context.WithoutCancel(ctx)
	for _, l := range lines {
		if _, err := e.release(ctx, e.keys.PartitionOf(l.SKU), l.Token, Principal{ID: who}, string(StatusCancelled)); err != nil {
			e.log.Warn().Err(err).Str("sku", l.SKU).Msg("could not let go of a cart line; its provisional expiry or the cart sweep will")
		}
	}
}

// awaitCart answers a call whose idempotency key already opened a cart:
// that cart once it is held; retry once it is gone or abandoned, so that
// this call's open_cart.lua replays the key's refusal or, when the first
// call never held (its caller failed or died), opens a new cart.
func (e *Engine) awaitCart(ctx context.Context, p Principal, home int, token string) (Cart, bool, error) {
	deadline := time.Now().Add(e.cfg.CartSettle + 2*cartSweepMargin + time.Second)
	for {
		h, err := e.rdb.HGetAll(ctx, e.keys.Cart(home, token)).Result()
		if err != nil {
			return Cart{}, false, unavailable("reading cart", err)
		}
		switch h["st"] {
		case "HELD":
			cart, err := e.readCart(ctx, p, token)
			cart.Replayed = true
			return cart, false, err
		case "PENDING":
		default:
			return Cart{}, true, nil
		}
		if time.Now().After(deadline) {
			return Cart{}, false, unavailable("reserving cart", errors.New("the first call with this key is still holding its cart"))
		}
		select {
		case <-ctx.Done():
			return Cart{}, false, unavailable("reserving cart", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CartOf returns a cart by token: its holder's or, for an admin, anyone's.
// A cart that never held (refused, or let go before it was) is not found.
func (e *Engine) CartOf(ctx context.Context, p Principal, token string) (Cart, error) {
	return e.readCart(ctx, p, token)
}

func cartNotFound(token string) error {
	return &NotFoundError{Kind: "cart", Key: token, Field: "token"}
}

// readCart reads a cart and its lines: one round trip for the cart, one
// pipeline for the lines; a line Redis no longer has is read as a
// reservation (from the ledger).
func (e *Engine) readCart(ctx context.Context, p Principal, token string) (Cart, error) {
	home, err := parseCartToken(token)
	if err != nil {
		return Cart{}, err
	}
	if err := checkPrincipal(p); err != nil {
		return Cart{}, err
	}
	h, err := e.rdb.HGetAll(ctx, e.keys.Cart(home, token)).Result()
	if err != nil {
		return Cart{}, unavailable("reading cart", err)
	}
	if len(h) == 0 || h["st"] != "HELD" {
		return Cart{}, cartNotFound(token)
	}
	if h["who"] != p.ID && !p.Admin {
		return Cart{}, ErrForbidden
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
		return Cart{}, unavailable("reading cart", err)
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(h[k], 10, 64); return n }
	cart := Cart{Token: token, Principal: h["who"], CreatedAt: msTime(num("ctd")), ExpiresAt: msTime(num("exp"))}
	for i, l := range lines {
		lh := holds[i].Val()
		var r Reservation
		if len(lh) > 0 && lh["gen"] == gens[i].Val() {
			r = holdFromHash(l.Token, lh).reservation()
		} else if r, err = e.Reservation(ctx, p, l.Token); err != nil {
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
func cartStatus(lines []Reservation) Status {
	count := map[Status]int{}
	for _, l := range lines {
		count[l.Status]++
	}
	switch {
	case count[StatusCommitted] == len(lines):
		return StatusCommitted
	case count[StatusHeld] > 0 || count[StatusCommitted] > 0:
		return StatusHeld
	case count[StatusCancelled] > 0:
		return StatusCancelled
	}
	return StatusExpired
}

// CommitCart sells every line of a principal's cart in one Postgres
// transaction, or none. Each line is first taken out of reach of expiry
// (begin_commit.lua, as for Commit); then one transaction writes every sale
// and the cart's row; then each line is marked sold in Redis
// (finish_commit.lua). A crash after the transaction leaves lines
// COMMITTING, and the commit reconciler settles each of them from the
// ledger, where the transaction put all or none. A success is in Postgres
// before it is returned; committing again returns the cart with Replayed.
//
// Refusals: ErrExpired or ErrAlreadyCancelled (a line had ended: every line
// this call took goes back as it was), ErrForbidden, *NotFoundError,
// *OutOfStockError (Postgres refused a line beyond its total: the cart is
// let go), ErrUnavailable (retry).
func (e *Engine) CommitCart(ctx context.Context, p Principal, token string) (cart Cart, err error) {
	defer func() { e.metrics.outcome("commit_cart", err) }()
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	if cart.Principal != p.ID {
		return Cart{}, ErrForbidden
	}
	switch cart.Status {
	case StatusCommitted:
		cart.Replayed = true
		return cart, nil
	case StatusCancelled:
		return Cart{}, ErrAlreadyCancelled
	case StatusExpired:
		return Cart{}, ErrExpired
	}
	type begun struct {
		line Reservation
		a    attempt
	}
	var taken []begun
	undo := func(cause error) (Cart, error) {
		for _, b := range taken {
			if b.a.moved {
				if _, err := e.finishCommit(ctx, b.line.Token, b.line, outcomeRestore, time.Time{}, b.a.id); err != nil {
					e.log.Warn().Err(err).Str("token", b.line.Token).Msg("could not restore a cart line; the reconciler will")
				}
			}
		}
		return Cart{}, cause
	}
	attemptID := newAttemptID()
	nonce := newNonce()
	for _, l := range cart.Lines {
		pt := e.keys.PartitionOf(l.SKU)
		res, err := script.RunBeginCommit(ctx, e.run, e.keys, script.BeginCommit{Partition: pt, Token: l.Token,
			Principal: p.ID, Retention: int64(e.cfg.Retention.Seconds()), Attempt: attemptID, Nonce: nonce})
		if err != nil {
			return undo(fmt.Errorf("committing cart %s: %w", token, err))
		}
		switch replyCode(res.Code) {
		case codeOK:
			h := holdOf(res.Hold).reservation()
			if h.Status != StatusCommitted {
				taken = append(taken, begun{line: h, a: attemptOf(res)})
			}
		case replyOf(ErrExpired):
			return undo(ErrExpired)
		case replyOf(ErrAlreadyCancelled):
			return undo(ErrAlreadyCancelled)
		case replyOf(ErrForbidden):
			return undo(ErrForbidden)
		case codeNeedsHydration:
			if err := e.Rebuild(ctx, res.Missing); err != nil {
				return undo(fmt.Errorf("committing cart %s: %w", token, err))
			}
			return undo(unavailable("committing cart "+token, errors.New("a SKU was rebuilt")))
		case replyOf(ErrNotFound):
			return undo(cartNotFound(token))
		default:
			return undo(fmt.Errorf("committing cart %s: unexpected script reply %q", token, res.Code))
		}
	}
	if len(taken) > 0 {
		rows := make([]db.Reservation, len(taken))
		for i, b := range taken {
			rows[i] = db.Reservation{Token: b.line.Token, SKU: b.line.SKU, Principal: b.line.Principal, Quantity: b.line.Quantity,
				ExpiresAt: b.line.ExpiresAt, CreatedAt: b.line.CreatedAt}
		}
		wctx, cancel := context.WithTimeout(ctx, e.cfg.CommitTimeout)
		sales, err := e.ledger.RecordCartSale(wctx, token, p.ID, rows)
		cancel()
		var ended *db.EndedError
		switch {
		case err == nil:
			at := map[string]time.Time{}
			for _, s := range sales {
				at[s.Token] = s.CommittedAt
			}
			for _, b := range taken {
				if _, err := e.finishCommit(ctx, b.line.Token, b.line, outcomeCommitted, at[b.line.Token], b.a.id); err != nil {
					// The sale is durable; a retry or the reconciler finishes Redis.
					return Cart{}, err
				}
			}
		case errors.As(err, &ended):
			e.log.Warn().Str("cart", token).Str("ledger", ended.Status).Msg("refused the sale of a cart with a line the ledger has as finished; letting the cart go")
			for _, b := range taken {
				if _, ferr := e.finishCommit(ctx, b.line.Token, b.line, ended.Status, time.Time{}, b.a.id); ferr != nil {
					return Cart{}, ferr
				}
			}
			if ended.Status == db.StatusExpired {
				return Cart{}, ErrExpired
			}
			return Cart{}, ErrAlreadyCancelled
		case errors.Is(err, db.ErrWouldOversell):
			e.log.Error().Str("cart", token).Msg("Postgres refused a cart line beyond its total; letting the cart go")
			for _, b := range taken {
				if b.a.moved {
					if _, ferr := e.finishCommit(ctx, b.line.Token, b.line, outcomeRefused, time.Time{}, b.a.id); ferr != nil {
						return Cart{}, ferr
					}
				}
			}
			return Cart{}, &OutOfStockError{Available: 0}
		case nothingSent(err):
			_, _ = undo(nil)
			return Cart{}, unavailable("committing cart "+token, err)
		default:
			// Unknown outcome: the lines stay COMMITTING, and a retry or the
			// reconciler settles every one of them from the ledger.
			return Cart{}, unavailable("committing cart "+token, err)
		}
	}
	return e.readCart(ctx, p, token)
}

// CancelCart lets go of every line of a cart; its holder or an admin may.
// Cancelling twice returns the cart with Replayed. A cart whose commit is
// under way cannot be cancelled: ErrUnavailable if the commit is still
// deciding after a moment (retry), ErrAlreadyCommitted once it sold.
func (e *Engine) CancelCart(ctx context.Context, p Principal, token string) (cart Cart, err error) {
	defer func() { e.metrics.outcome("cancel_cart", err) }()
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	switch cart.Status {
	case StatusCommitted:
		return Cart{}, ErrAlreadyCommitted
	case StatusCancelled, StatusExpired:
		cart.Replayed = true
		return cart, nil
	}
	pending := slices.Clone(cart.Lines)
	giveUp := time.Now().Add(2 * time.Second)
	for len(pending) > 0 {
		var again []Reservation
		for _, l := range pending {
			if l.Status != StatusHeld {
				continue
			}
			res, err := e.release(ctx, e.keys.PartitionOf(l.SKU), l.Token, p, string(StatusCancelled))
			if err != nil {
				return Cart{}, fmt.Errorf("cancelling cart %s: %w", token, err)
			}
			switch replyCode(res.Code) {
			case codeOK:
				if r := holdOf(res).reservation(); !r.Replayed {
					e.recordRelease(ctx, r)
				}
			case codeCommitInProgress:
				again = append(again, l)
			case replyOf(ErrAlreadyCommitted):
				return Cart{}, ErrAlreadyCommitted
			case replyOf(ErrForbidden):
				return Cart{}, ErrForbidden
			case replyOf(ErrNotFound), codeNeedsHydration:
			default:
				return Cart{}, fmt.Errorf("cancelling cart %s: unexpected script reply %q", token, res.Code)
			}
		}
		pending = again
		if len(pending) == 0 {
			break
		}
		if time.Now().After(giveUp) {
			return Cart{}, unavailable("cancelling cart "+token, errCommitInProgress)
		}
		select {
		case <-ctx.Done():
			return Cart{}, unavailable("cancelling cart "+token, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return e.readCart(ctx, p, token)
}

// AbandonStaleCarts is the cart sweep: it lets go of carts left PENDING more
// than a moment past their deadline in any partition, because the call that
// opened them died or stalled before it finished, and of the lines of HELD
// carts past their expiry. Each such cart is marked ABANDONED
// (abandon_cart.lua: from then on its caller can no longer record it as
// held), then every line it named is released, then it leaves the pending
// index. By its deadline no line of it can be held or confirmed any more, so
// the lines it names are all it will ever have. Every step is idempotent, so
// any number of processes may sweep at once, with no lease: a process that
// dies mid-sweep leaves the cart in the index for the next.
//
// The sweep is batched: the carts due are marked in one pipelined round
// trip, then all their lines are released in pipelined chunks (each line
// its own run of release_hold.lua, as a cancel), then the carts leave the
// index in one more; 600 carts of 50 lines cost about 62 round trips, not
// 30,600 one after the other. It takes at most limit carts per partition
// and returns how many carts it let go.
func (m *Maintenance) AbandonStaleCarts(ctx context.Context, limit int) (int, error) {
	n, _, err := m.SweepCarts(ctx, limit, limit*Partitions)
	return n, err
}

// SweepCarts is AbandonStaleCarts for at most carts carts in all (the
// oldest-listed of each partition first, up to perPartition each), so one
// call's work, and so its time, stays bounded however many carts fall due
// together; more says it left due carts for another call.
func (m *Maintenance) SweepCarts(ctx context.Context, perPartition, carts int) (n int, more bool, err error) {
	e := m.e
	limit := perPartition
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return 0, false, unavailable("reading Redis time", err)
	}
	cutoff := strconv.FormatInt(now.Add(-cartSweepMargin).UnixMilli(), 10)
	cmds := make([]*redis.StringSliceCmd, Partitions)
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for pt := range Partitions {
			cmds[pt] = pipe.ZRangeByScore(ctx, e.keys.CartsPending(pt), &redis.ZRangeBy{Min: "-inf", Max: cutoff, Count: int64(limit)})
		}
		return nil
	})
	if err != nil {
		return 0, false, unavailable("listing stale carts", err)
	}
	type staleCart struct {
		home          int
		token, who    string
		expired, busy bool
		err           error
		lines         []cartLine
	}
	var stale []*staleCart
	var marks []script.Call
	for pt, c := range cmds {
		more = more || len(c.Val()) == limit
		for _, tok := range c.Val() {
			if len(stale) == carts {
				more = true
				break
			}
			stale = append(stale, &staleCart{home: pt, token: tok})
			marks = append(marks, script.AbandonCart{Home: pt, Token: tok}.Call(e.keys))
		}
	}
	if len(stale) == 0 {
		return 0, false, nil
	}

	// 1. Every cart marked ABANDONED (or found HELD past its expiry).
	replies, errs := e.runMany(ctx, lua.AbandonCart, marks)
	var releases []script.Call
	var owners []*staleCart
	for i, c := range stale {
		if errs[i] != nil {
			c.err = fmt.Errorf("abandoning cart %s: %w", c.token, errs[i])
			continue
		}
		ab := script.AbandonCartReplyOf(replies[i])
		if replyCode(ab.Code) != codeOK && replyCode(ab.Code) != replyOf(ErrExpired) {
			c.busy = true // finished meanwhile, or not due: nothing to let go, and it is not ours to unlist
			continue
		}
		c.expired = replyCode(ab.Code) == replyOf(ErrExpired)
		var enc string
		c.who, enc = ab.Who, ab.Lines
		if err := json.Unmarshal([]byte(enc), &c.lines); err != nil {
			c.err = fmt.Errorf("abandoning cart %s: %w", c.token, err)
			continue
		}
		for _, l := range c.lines {
			pt := e.keys.PartitionOf(l.SKU)
			releases = append(releases, e.releaseArgs(pt, l.Token, Principal{ID: c.who}, string(StatusCancelled)).Call(e.keys))
			owners = append(owners, c)
		}
	}

	// 2. Every line of every cart released, as a cancel by its owner.
	replies, errs = e.runMany(ctx, lua.ReleaseHold, releases)
	for i, c := range owners {
		r := script.HoldOf(replies[i])
		switch {
		case errs[i] != nil:
			if c.err == nil {
				c.err = fmt.Errorf("abandoning cart %s: %w", c.token, errs[i])
			}
		case replyCode(r.Code) == codeCommitInProgress:
			c.busy = true // the commit settles it; look again next time
		case replyCode(r.Code) == codeOK && !r.Replayed && c.expired && r.Exp > r.End:
			// Released before its own expiry: a line the cart's expiry
			// outlived (one already due is the hold sweeper's work, done
			// here first).
			e.log.Warn().Str("cart", c.token).Str("sku", r.SKU).
				Msg("let go of a cart line still held past its cart's expiry (an extension of the cart was interrupted)")
		}
	}

	// 3. The carts let go leave the index; the others stay for the next sweep.
	abandoned := 0
	var failures []error
	_, err = e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range stale {
			if c.err != nil {
				failures = append(failures, c.err)
				continue
			}
			if c.busy {
				continue
			}
			pipe.ZRem(ctx, e.keys.CartsPending(c.home), c.token)
			if !c.expired {
				abandoned++
				e.log.Warn().Str("cart", c.token).Int("lines", len(c.lines)).Msg("let go of a cart its caller left unfinished past its deadline")
			}
		}
		return nil
	})
	if err != nil {
		failures = append(failures, unavailable("abandoning carts", err))
		abandoned = 0
	}
	return abandoned, more, errors.Join(failures...)
}

// ExtendCart gives every line of a principal's HELD cart a new expiry, now
// + req.HoldFor, as Extend does for one hold (the same bounds: MaxExtensions,
// and never past MaxHold after the lines were made), then records it as the
// cart's (extend_cart.lua). The lines live in several partitions, so they
// are extended one after the other, oldest first (the one MaxHold would
// refuse first). A refusal or a crash part-way leaves the cart with its old
// expiry; at that time the cart sweep lets go of any line still held, so a
// cart's lines always end together, by the expiry the cart last recorded.
// With an idempotency key each line records it (as Extend's hold does), so a
// retry extends only the lines the first call did not, and a call whose
// every line had been extended by the key answers the cart with Replayed.
//
// Refusals: Extend's (*ExtensionLimitError, ErrExpired, ErrAlreadyCancelled,
// ErrAlreadyCommitted, ErrForbidden, ErrIdempotencyKeyReused,
// *InvalidInputError, ErrUnavailable), and *NotFoundError for an unknown
// cart.
func (e *Engine) ExtendCart(ctx context.Context, p Principal, token string, req ExtendRequest) (cart Cart, err error) {
	defer func() { e.metrics.outcome("extend_cart", err) }()
	home, err := parseCartToken(token)
	if err != nil {
		return Cart{}, err
	}
	idem, err := e.checkExtension(ctx, p, token, req)
	if err != nil {
		return Cart{}, err
	}
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	if cart.Principal != p.ID {
		return Cart{}, ErrForbidden
	}
	if idem == "" {
		// With a key the lines answer: the key may have extended them before.
		switch cart.Status {
		case StatusCommitted:
			return Cart{}, ErrAlreadyCommitted
		case StatusCancelled:
			return Cart{}, ErrAlreadyCancelled
		case StatusExpired:
			return Cart{}, ErrExpired
		}
	}
	lines := slices.Clone(cart.Lines)
	slices.SortStableFunc(lines, func(a, b Reservation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	var latest time.Time
	replayed := idem != ""
	for _, l := range lines {
		r, err := e.extendHold(ctx, p, l.Token, req.HoldFor, idem)
		if err != nil {
			return Cart{}, err
		}
		replayed = replayed && r.Replayed
		if r.ExpiresAt.After(latest) {
			latest = r.ExpiresAt
		}
	}
	if !replayed || cart.ExpiresAt.Before(latest) {
		res, err := script.RunExtendCart(ctx, e.run, e.keys, script.ExtendCart{Home: home, Token: token,
			ExpiresMs: latest.UnixMilli(), Retention: int64(e.cfg.Retention.Seconds())})
		if err != nil {
			return Cart{}, fmt.Errorf("extending cart %s: %w", token, err)
		}
		switch replyCode(res.Code) {
		case codeOK:
		case replyOf(ErrNotFound):
			return Cart{}, cartNotFound(token)
		default:
			return Cart{}, ErrExpired
		}
	}
	if idem != "" {
		if err := e.keepIdempotencyClaim(ctx, idem, extensionClaim(token)); err != nil {
			return Cart{}, err
		}
	}
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	cart.Replayed = replayed
	return cart, nil
}
