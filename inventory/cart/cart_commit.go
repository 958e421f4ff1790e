package cart

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

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
func (a Carts) CommitCart(ctx context.Context, p core.Principal, token string) (cart Cart, err error) {
	e := a.e
	defer func() { e.core.Metrics.Outcome("commit_cart", err) }()
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	if cart.Principal != p.ID {
		return Cart{}, outcome.ErrForbidden
	}
	switch cart.Status {
	case core.StatusCommitted:
		cart.Replayed = true
		return cart, nil
	case core.StatusCancelled:
		return Cart{}, outcome.ErrAlreadyCancelled
	case core.StatusExpired:
		return Cart{}, outcome.ErrExpired
	}
	type begun struct {
		line core.Reservation
		a    attempt
	}
	var taken []begun
	undo := func(cause error) (Cart, error) {
		for _, b := range taken {
			if b.a.moved {
				if _, err := e.holds.FinishCommit(ctx, b.line.Token, b.line, core.OutcomeRestore, time.Time{}, b.a.id); err != nil {
					e.log.Warn().Err(err).Str("token", b.line.Token).Msg("could not restore a cart line; the reconciler will")
				}
			}
		}
		return Cart{}, cause
	}
	attemptID := core.NewAttemptID()
	nonce := core.NewNonce()
	for _, l := range cart.Lines {
		pt := e.keys.PartitionOf(l.SKU)
		res, err := script.RunBeginCommit(ctx, e.run, e.keys, script.BeginCommit{Partition: pt, Token: l.Token,
			Principal: p.ID, Retention: int64(e.cfg.Retention.Seconds()), Attempt: attemptID, Nonce: nonce})
		if err != nil {
			return undo(fmt.Errorf("committing cart %s: %w", token, err))
		}
		switch core.ReplyCode(res.Code) {
		case core.CodeOK:
			h := e.holds.HoldOf(res.Hold)
			if h.Status != core.StatusCommitted {
				taken = append(taken, begun{line: h, a: attemptOf(res)})
			}
		case core.ReplyOf(outcome.ErrExpired):
			return undo(outcome.ErrExpired)
		case core.ReplyOf(outcome.ErrAlreadyCancelled):
			return undo(outcome.ErrAlreadyCancelled)
		case core.ReplyOf(outcome.ErrForbidden):
			return undo(outcome.ErrForbidden)
		case core.CodeNeedsHydration:
			if err := e.holds.Rebuild(ctx, res.Missing); err != nil {
				return undo(fmt.Errorf("committing cart %s: %w", token, err))
			}
			return undo(core.Unavailable("committing cart "+token, errors.New("a SKU was rebuilt")))
		case core.ReplyOf(outcome.ErrNotFound):
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
		sales, err := e.ledger.Sales().RecordCartSale(wctx, token, p.ID, rows)
		cancel()
		var ended *db.EndedError
		switch {
		case err == nil:
			at := map[string]time.Time{}
			for _, s := range sales {
				at[s.Token] = s.CommittedAt
			}
			for _, b := range taken {
				if _, err := e.holds.FinishCommit(ctx, b.line.Token, b.line, core.OutcomeCommitted, at[b.line.Token], b.a.id); err != nil {
					// The sale is durable; a retry or the reconciler finishes Redis.
					return Cart{}, err
				}
			}
		case errors.As(err, &ended):
			e.log.Warn().Str("cart", token).Str("ledger", ended.Status).Msg("refused the sale of a cart with a line the ledger has as finished; letting the cart go")
			for _, b := range taken {
				if _, ferr := e.holds.FinishCommit(ctx, b.line.Token, b.line, ended.Status, time.Time{}, b.a.id); ferr != nil {
					return Cart{}, ferr
				}
			}
			if ended.Status == db.StatusExpired {
				return Cart{}, outcome.ErrExpired
			}
			return Cart{}, outcome.ErrAlreadyCancelled
		case errors.Is(err, db.ErrWouldOversell):
			e.log.Error().Str("cart", token).Msg("Postgres refused a cart line beyond its total; letting the cart go")
			for _, b := range taken {
				if b.a.moved {
					if _, ferr := e.holds.FinishCommit(ctx, b.line.Token, b.line, core.OutcomeRefused, time.Time{}, b.a.id); ferr != nil {
						return Cart{}, ferr
					}
				}
			}
			return Cart{}, &outcome.OutOfStockError{Available: 0}
		case core.NothingSent(err):
			_, _ = undo(nil)
			return Cart{}, core.Unavailable("committing cart "+token, err)
		default:
			// Unknown outcome: the lines stay COMMITTING, and a retry or the
			// reconciler settles every one of them from the ledger.
			return Cart{}, core.Unavailable("committing cart "+token, err)
		}
	}
	return e.readCart(ctx, p, token)
}

// CancelCart lets go of every line of a cart; its holder or an admin may.
// Cancelling twice returns the cart with Replayed. A cart whose commit is
// under way cannot be cancelled: ErrUnavailable if the commit is still
// deciding after a moment (retry), ErrAlreadyCommitted once it sold.
func (a Carts) CancelCart(ctx context.Context, p core.Principal, token string) (cart Cart, err error) {
	e := a.e
	defer func() { e.core.Metrics.Outcome("cancel_cart", err) }()
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	switch cart.Status {
	case core.StatusCommitted:
		return Cart{}, outcome.ErrAlreadyCommitted
	case core.StatusCancelled, core.StatusExpired:
		cart.Replayed = true
		return cart, nil
	}
	pending := slices.Clone(cart.Lines)
	giveUp := time.Now().Add(2 * time.Second)
	for len(pending) > 0 {
		var again []core.Reservation
		for _, l := range pending {
			if l.Status != core.StatusHeld {
				continue
			}
			res, err := e.holds.Release(ctx, e.keys.PartitionOf(l.SKU), l.Token, p, string(core.StatusCancelled))
			if err != nil {
				return Cart{}, fmt.Errorf("cancelling cart %s: %w", token, err)
			}
			switch core.ReplyCode(res.Code) {
			case core.CodeOK:
				if r := e.holds.HoldOf(res); !r.Replayed {
					e.holds.RecordRelease(ctx, r)
				}
			case core.CodeCommitInProgress:
				again = append(again, l)
			case core.ReplyOf(outcome.ErrAlreadyCommitted):
				return Cart{}, outcome.ErrAlreadyCommitted
			case core.ReplyOf(outcome.ErrForbidden):
				return Cart{}, outcome.ErrForbidden
			case core.ReplyOf(outcome.ErrNotFound), core.CodeNeedsHydration:
			default:
				return Cart{}, fmt.Errorf("cancelling cart %s: unexpected script reply %q", token, res.Code)
			}
		}
		pending = again
		if len(pending) == 0 {
			break
		}
		if time.Now().After(giveUp) {
			return Cart{}, core.Unavailable("cancelling cart "+token, core.ErrCommitInProgress)
		}
		select {
		case <-ctx.Done():
			return Cart{}, core.Unavailable("cancelling cart "+token, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return e.readCart(ctx, p, token)
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
func (a Carts) ExtendCart(ctx context.Context, p core.Principal, token string, req core.ExtendRequest) (cart Cart, err error) {
	e := a.e
	defer func() { e.core.Metrics.Outcome("extend_cart", err) }()
	home, err := core.ParseCartToken(token)
	if err != nil {
		return Cart{}, err
	}
	idem, err := e.holds.CheckExtension(ctx, p, token, req)
	if err != nil {
		return Cart{}, err
	}
	cart, err = e.readCart(ctx, p, token)
	if err != nil {
		return Cart{}, err
	}
	if cart.Principal != p.ID {
		return Cart{}, outcome.ErrForbidden
	}
	if idem == "" {
		// With a key the lines answer: the key may have extended them before.
		switch cart.Status {
		case core.StatusCommitted:
			return Cart{}, outcome.ErrAlreadyCommitted
		case core.StatusCancelled:
			return Cart{}, outcome.ErrAlreadyCancelled
		case core.StatusExpired:
			return Cart{}, outcome.ErrExpired
		}
	}
	lines := slices.Clone(cart.Lines)
	slices.SortStableFunc(lines, func(a, b core.Reservation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	var latest time.Time
	replayed := idem != ""
	for _, l := range lines {
		r, err := e.holds.ExtendHold(ctx, p, l.Token, req.HoldFor, idem)
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
		switch core.ReplyCode(res.Code) {
		case core.CodeOK:
		case core.ReplyOf(outcome.ErrNotFound):
			return Cart{}, cartNotFound(token)
		default:
			return Cart{}, outcome.ErrExpired
		}
	}
	if idem != "" {
		if err := e.holds.KeepIdempotencyClaim(ctx, idem, core.ExtensionClaim(token)); err != nil {
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
