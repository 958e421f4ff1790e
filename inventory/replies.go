package inventory

import (
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// Script replies. Every script answers a list whose first element is a code
// (replyCode); what follows depends on the script and the code, as each
// script's header in lua/ says. The positions are read here and nowhere
// else: one decoder per reply shape.
//
// A code is either a business outcome, which package outcome defines once
// (replyOf names it here), or one of the protocol codes below, which tell
// the engine what to do next and never reach a client.
// TestEveryScriptCodeMapsToOne checks that each code a script can answer is
// exactly one of the two.

// replyCode is what a script says happened: the first element of its reply.
type replyCode string

// replyOf is the code a script answers for a business outcome.
func replyOf(o *outcome.Outcome) replyCode { return replyCode(o.Code()) }

// The protocol codes of lua/'s scripts.
const (
	codeOK             replyCode = "OK"
	codeHeld           replyCode = "HELD"            // reserve.lua made the hold: {code, expires_ms, created_ms}
	codeNeedsHydration replyCode = "NEEDS_HYDRATION" // the SKU is not loaded: {code, sku}

	// begin_commit.lua, release_hold.lua and extend_hold.lua, with a
	// hold_reply, besides their business outcomes (FORBIDDEN, EXPIRED,
	// ALREADY_CANCELLED, ALREADY_COMMITTED, EXTENSION_LIMIT, NOT_FOUND: no
	// live hold under the token).
	codeCommitInProgress replyCode = "COMMIT_IN_PROGRESS"
	codeNotDue           replyCode = "NOT_DUE"

	// reserve.lua's rejections are business outcomes, {code, a, b,
	// replayed} (rejection); RATE_LIMITED is {code, retry_after seconds}.
	// This one says deciding one request of a batch raised an error,
	// {code, message}; the batch's other requests have their own replies.
	codeReserveError replyCode = "ERR"

	// reserve.lua and hold_cart_lines.lua: the units are there but the
	// SKU's waitlist walk is unfinished, {code, sku}: finish it, ask again.
	codeWalkPending replyCode = "WALK_PENDING"
	// continue_walk.lua: the walk is still unfinished after this run, {code, offers}
	// (DONE: it ended).
	codePending replyCode = "PENDING"

	// apply_draw.lua: the batch was applied before, {code, done}.
	codeSkip replyCode = "SKIP"

	// stage_rebuild.lua, hydrate_sku.lua, publish_sku.lua, apply_product.lua.
	codeExists replyCode = "EXISTS" // the SKU is loaded already
	codeStale  replyCode = "STALE"  // a newer rebuild or product version is there
	codeDone   replyCode = "DONE"   // this rebuild chunk was written before

	// claim_idempotency_key.lua.
	codeReused replyCode = "REUSED" // claimed for another SKU: {code, sku}
	codeMark   replyCode = "MARK"   // the partition's marker is missing
	codeCheck  replyCode = "CHECK"  // check the ledger before claiming

	// The cart scripts (open_cart.lua, hold_cart_lines.lua, confirm_cart_lines.lua,
	// finish_cart.lua, abandon_cart.lua).
	codeRefused replyCode = "REFUSED" // a line (or the key's first cart) was refused
	codeLate    replyCode = "LATE"    // past the cart's deadline

	// reconcile_hold.lua.
	codeAgrees   replyCode = "AGREES"
	codeReleased replyCode = "RELEASED"
	codeAdopted  replyCode = "ADOPTED"
	codeClosed   replyCode = "CLOSED"
)

// protocolCodes lists the codes above, for the test that ties every code a
// script answers to exactly one meaning.
var protocolCodes = []replyCode{codeOK, codeHeld, codeNeedsHydration, codeCommitInProgress, codeNotDue,
	codeReserveError, codeWalkPending, codePending, codeSkip, codeExists, codeStale, codeDone, codeReused, codeMark, codeCheck, codeRefused,
	codeLate, codeAgrees, codeReleased, codeAdopted, codeClosed}

// The outcomes finish_commit.lua takes (ARGV[2]), besides the ledger's
// CANCELLED and EXPIRED.
const (
	outcomeCommitted = "COMMITTED"
	outcomeRestore   = "RESTORE"
	outcomeRefused   = "REFUSED"
)

// holdReply is a hold_reply as the engine reads it.
type holdReply struct {
	hold     storedHold
	replayed bool // the script changed nothing and returned an earlier outcome
}

// holdOf is a decoded hold_reply.
func holdOf(h script.Hold) holdReply {
	return holdReply{hold: storedHold{
		token: h.Token, sku: h.SKU, who: h.Who, qty: h.Qty, status: h.Status,
		exp: h.Exp, ctd: h.Ctd, cmt: h.Cmt, end: h.End, ext: h.Extensions,
	}, replayed: h.Replayed}
}

// newHold is reserve.lua's reply for a hold its run made, {HELD,
// expires_ms, created_ms}: the token, SKU, principal and quantity are the
// request's, and nothing else of a new hold is set yet.
func newHold(r script.ReserveReply, token, sku, who string, qty int) holdReply {
	return holdReply{hold: storedHold{token: token, sku: sku, who: who, qty: qty, status: string(StatusHeld),
		exp: r.ExpiresMs, ctd: r.CreatedMs}}
}

// reservation is the hold of the reply as callers see it.
func (h holdReply) reservation() Reservation {
	res := h.hold.reservation()
	res.Replayed = h.replayed
	return res
}

// attemptOf is what begin_commit.lua's OK reply says of the attempt.
func attemptOf(r script.BeginCommitReply) attempt {
	return attempt{id: r.AttemptID, moved: r.Moved, idem: r.Idem, fp: r.FP}
}

// rejectionError is the error of a refusal of reserve.lua (or
// join_waitlist.lua), {code, a, b, replayed}; nil when the code is not one
// of its rejections.
func rejectionError(r script.Rejection) error {
	switch replyCode(r.Code) {
	case replyOf(ErrOutOfStock):
		return &OutOfStockError{Available: int(r.IntA())}
	case replyOf(ErrQuotaExceeded):
		return &QuotaExceededError{Limit: int(r.IntA()), Held: int(r.IntB())}
	case replyOf(ErrSaleNotActive):
		return &SaleNotActiveError{StartsAt: msTimePtr(r.IntA()), EndsAt: msTimePtr(r.IntB())}
	case replyOf(ErrIdempotencyKeyReused):
		return ErrIdempotencyKeyReused
	case replyOf(ErrInvalidInput):
		return &InvalidInputError{Field: r.A, Reason: r.B}
	case replyOf(ErrWaitlistFull):
		return &WaitlistFullError{Limit: int(r.IntA())}
	case replyOf(ErrDrawOnly):
		return ErrDrawOnly
	case replyOf(ErrQueueRequired):
		return ErrQueueRequired
	case replyOf(ErrPassExpired):
		return ErrPassExpired
	case replyOf(ErrPassInvalid):
		return ErrPassInvalid
	}
	return nil
}

// waitEntryOf is a decoded wait_reply as callers see it.
func waitEntryOf(w script.Wait) WaitlistEntry {
	st := map[string]WaitStatus{"W": WaitWaiting, "O": WaitOffered, "L": WaitLeft}[w.Status]
	return WaitlistEntry{
		SKU: w.SKU, Principal: w.Who, Seq: w.Seq, Quantity: w.Qty,
		HoldFor: time.Duration(w.HoldMs) * time.Millisecond, Status: st, Token: w.Token,
		Position: w.Position, JoinedAt: msTime(w.JoinedMs), Replayed: w.Replayed,
	}
}

// endedHold reads the ending a CLOSED reply of reconcile_hold.lua made, or
// an AGREES reply found (Redis has the ledger's HELD row ended in the SKU's
// current generation). It returns the ending as the event Redis wrote for
// it (the same id, so both record one movement); false when the reply names
// no ending.
func endedHold(r script.ReconcileReply, row db.Reservation) (db.Event, bool) {
	kind := map[string]string{db.StatusCancelled: "cancel", db.StatusExpired: "expire"}[r.Status]
	if kind == "" || row.Status != db.StatusHeld {
		return db.Event{}, false
	}
	ev := db.Event{
		ID: kind + ":" + row.Token, Kind: kind, Token: row.Token, SKU: row.SKU, Principal: row.Principal,
		Quantity: row.Quantity, ExpiresAt: row.ExpiresAt, CreatedAt: row.CreatedAt, At: msTime(r.EndedMs),
		IdempotencyHash: row.IdempotencyHash, RequestHash: row.RequestHash, Extensions: row.Extensions,
	}
	if r.Extensions > row.Extensions {
		ev.ExpiresAt, ev.Extensions = msTime(r.ExpiresMs), r.Extensions
	}
	if r.EndedMs == 0 {
		ev.At = time.Now()
	}
	return ev, true
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func msTimePtr(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := msTime(ms)
	return &t
}
