package cart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// tryCart makes one attempt at a cart; retry says a new attempt may work
// (the key's earlier cart never held, or a SKU had to be rebuilt).
func (e *engine) tryCart(ctx context.Context, p core.Principal, home int, lines []cartLine, hold time.Duration, idem, fp, pass string) (Cart, bool, error) {
	token := core.NewTokenOf(core.TokenCart, home)
	for i := range lines {
		lines[i].Token = core.NewTokenOf(core.TokenLine, e.keys.PartitionOf(lines[i].SKU))
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
	switch core.ReplyCode(oc.Code) {
	case core.ReplyOf(outcome.ErrIdempotencyKeyReused):
		return Cart{}, false, outcome.ErrIdempotencyKeyReused
	case core.CodeRefused:
		var refusals []cartRefusal
		if err := json.Unmarshal([]byte(oc.Refusals), &refusals); err != nil {
			return Cart{}, false, fmt.Errorf("reserving cart: reading a recorded refusal: %w", err)
		}
		return Cart{}, false, refusalsError(lines, refusals)
	case core.CodeOK:
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
				Principal: p.ID, Cart: token, DeadlineMs: oc.DeadlineMs, MaxQuantity: e.core.Limits.MaxQuantity, Pass: pass,
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
		case core.ReplyCode(results[i].Code) == core.CodeOK:
		case core.ReplyCode(results[i].Code) == core.CodeRefused:
			for _, lr := range results[i].Refusals {
				l := parts[pt][lr.Line-1]
				refusals = append(refusals, cartRefusal{SKU: l.SKU, Code: lr.Code, A: lr.A, B: lr.B})
			}
		case core.ReplyCode(results[i].Code) == core.CodeNeedsHydration:
			lost = append(lost, results[i].Missing)
		case core.ReplyCode(results[i].Code) == core.CodeWalkPending:
			walking[results[i].Missing] = pt
		case core.ReplyCode(results[i].Code) == core.CodeLate:
			failure = errCartLate
		default:
			failure = fmt.Errorf("holding lines: script reply %q", results[i].Code)
		}
	}
	if failure == nil && len(lost) == 0 && len(walking) == 0 && len(refusals) == 0 {
		e.cartPause(PauseHeld, "provisional holds made")
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
				return Cart{}, false, core.Unavailable("reserving cart", err)
			case out == core.CodeOK:
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
			if err := e.holds.Rebuild(ctx, sku); err != nil {
				return Cart{}, false, fmt.Errorf("reserving cart: %w", err)
			}
		}
		return Cart{}, true, nil
	}
	if failure == nil && len(walking) > 0 {
		// Units a line could have may still be a waiter's: the walks
		// decide, then a new cart asks again.
		for sku, pt := range walking {
			if _, err := e.core.FinishWalk(ctx, pt, sku); err != nil {
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
		return Cart{}, false, core.Unavailable("reserving cart", failure)
	}
	return Cart{}, false, refusalsError(lines, refusals)
}

// confirmCartLines is phase 2: each partition's provisional lines get the
// cart's expiry, partition after partition.
func (e *engine) confirmCartLines(ctx context.Context, token string, exp int64, order []int, parts map[int][]cartLine) error {
	for i, pt := range order {
		res, err := script.RunConfirmCartLines(ctx, e.run, e.keys,
			script.ConfirmCartLines{Partition: pt, Cart: token, ExpiresMs: exp, Lines: scriptLines(parts[pt])})
		if err != nil {
			return err
		}
		if core.ReplyCode(res.Code) == core.CodeLate {
			return errCartLate
		}
		if core.ReplyCode(res.Code) != core.CodeOK {
			return fmt.Errorf("confirming lines: script reply %q", res.Code)
		}
		if i == 0 && len(order) > 1 {
			e.cartPause(PauseConfirmed, "first partition's lines confirmed")
		}
	}
	return nil
}

// cartPause waits Config.CartPause at step; only the fault tests set it, to
// kill a server in the middle of a cart.
func (e *engine) cartPause(at, step string) {
	if e.cfg.Pause.At != at || e.cfg.Pause.For <= 0 {
		return
	}
	e.log.Warn().Str("step", step).Dur("pause", e.cfg.Pause.For).Msg("test-only pause between the steps of a cart")
	time.Sleep(e.cfg.Pause.For)
}

// finishCart runs finish_cart.lua and returns its code.
func (e *engine) finishCart(ctx context.Context, home int, token, idem, outcome, rej string) (core.ReplyCode, error) {
	res, err := script.RunFinishCart(ctx, e.run, e.keys, script.FinishCart{Home: home, Token: token, Idem: idem,
		Outcome: outcome, Refusals: rej, RejectionTTL: int64(e.cfg.RejectionTTL.Seconds()), Retention: int64(e.cfg.Retention.Seconds())})
	if err != nil {
		return "", fmt.Errorf("finishing cart %s: %w", token, err)
	}
	return core.ReplyCode(res.Code), nil
}

// letGoOfLines releases every line of a cart that did not come to be held
// whole. Releasing is idempotent, and a line never made is simply not
// found. A failure is only logged: the provisional expiry and the cart
// sweep release what is left.
func (e *engine) letGoOfLines(ctx context.Context, who string, lines []cartLine) {
	ctx = context.WithoutCancel(ctx)
	for _, l := range lines {
		if _, err := e.holds.Release(ctx, e.keys.PartitionOf(l.SKU), l.Token, core.Principal{ID: who}, string(core.StatusCancelled)); err != nil {
			e.log.Warn().Err(err).Str("sku", l.SKU).Msg("could not let go of a cart line; its provisional expiry or the cart sweep will")
		}
	}
}

// awaitCart answers a call whose idempotency key already opened a cart:
// that cart once it is held; retry once it is gone or abandoned, so that
// this call's open_cart.lua replays the key's refusal or, when the first
// call never held (its caller failed or died), opens a new cart.
func (e *engine) awaitCart(ctx context.Context, p core.Principal, home int, token string) (Cart, bool, error) {
	deadline := time.Now().Add(e.cfg.CartSettle + 2*cartSweepMargin + time.Second)
	for {
		h, err := e.rdb.HGetAll(ctx, e.keys.Cart(home, token)).Result()
		if err != nil {
			return Cart{}, false, core.Unavailable("reading cart", err)
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
			return Cart{}, false, core.Unavailable("reserving cart", errors.New("the first call with this key is still holding its cart"))
		}
		select {
		case <-ctx.Done():
			return Cart{}, false, core.Unavailable("reserving cart", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
