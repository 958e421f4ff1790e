package inventory

import (
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/outcome"
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

// reply is a script's raw reply.
type reply []any

func (r reply) code() replyCode { return replyCode(r.str(0)) }

// missingSKU is the SKU of a NEEDS_HYDRATION reply: {NEEDS_HYDRATION, sku}.
func (r reply) missingSKU() string { return r.str(1) }

// retryAfter is the seconds to wait of a RATE_LIMITED reply of reserve.lua,
// {RATE_LIMITED, retry_after, "", 0}, as a string.
func (r reply) retryAfter() string { return r.str(1) }

// holdReply is lib.lua's hold_reply: {code, token, sku, who, qty, status,
// expires_ms, created_ms, committed_ms, ended_ms, replayed, extensions}.
type holdReply struct {
	hold     storedHold
	replayed bool // the script changed nothing and returned an earlier outcome
}

// hold decodes a hold_reply.
func (r reply) hold() holdReply {
	return holdReply{hold: storedHold{
		token: r.str(1), sku: r.str(2), who: r.str(3), qty: int(r.int(4)), status: r.str(5),
		exp: r.int(6), ctd: r.int(7), cmt: r.int(8), end: r.int(9), ext: int(r.int(11)),
	}, replayed: r.int(10) == 1}
}

// newHold decodes reserve.lua's reply for a hold its run made, {HELD,
// expires_ms, created_ms}: the token, SKU, principal and quantity are the
// request's, and nothing else of a new hold is set yet.
func (r reply) newHold(token, sku, who string, qty int) holdReply {
	return holdReply{hold: storedHold{token: token, sku: sku, who: who, qty: qty, status: string(StatusHeld),
		exp: r.int(1), ctd: r.int(2)}}
}

// reservation is the hold of the reply as callers see it.
func (h holdReply) reservation() Reservation {
	res := h.hold.reservation()
	res.Replayed = h.replayed
	return res
}

// attempt decodes what begin_commit.lua's OK reply adds to hold_reply:
// {..., attempt id, moved (1/0), idempotency hash, request fingerprint}.
func (r reply) attempt() attempt {
	return attempt{id: r.str(12), moved: r.int(13) == 1, idem: r.str(14), fp: r.str(15)}
}

// rejection decodes a refusal of reserve.lua (or join_waitlist.lua), {code, a, b, replayed}, into
// its error; nil when the code is not one of its rejections.
func (r reply) rejection() error {
	switch r.code() {
	case replyOf(ErrOutOfStock):
		return &OutOfStockError{Available: int(r.int(1))}
	case replyOf(ErrQuotaExceeded):
		return &QuotaExceededError{Limit: int(r.int(1)), Held: int(r.int(2))}
	case replyOf(ErrSaleNotActive):
		return &SaleNotActiveError{StartsAt: msTimePtr(r.int(1)), EndsAt: msTimePtr(r.int(2))}
	case replyOf(ErrIdempotencyKeyReused):
		return ErrIdempotencyKeyReused
	case replyOf(ErrInvalidInput):
		return &InvalidInputError{Field: r.str(1), Reason: r.str(2)}
	case replyOf(ErrWaitlistFull):
		return &WaitlistFullError{Limit: int(r.int(1))}
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

// waitEntry decodes lib.lua's wait_reply: {code, sku, who, seq, qty, hold_ms,
// status, token, position, joined_ms, replayed}.
func (r reply) waitEntry() WaitlistEntry {
	st := map[string]WaitStatus{"W": WaitWaiting, "O": WaitOffered, "L": WaitLeft}[r.str(6)]
	return WaitlistEntry{
		SKU: r.str(1), Principal: r.str(2), Seq: r.int(3), Quantity: int(r.int(4)),
		HoldFor: time.Duration(r.int(5)) * time.Millisecond, Status: st, Token: r.str(7),
		Position: int(r.int(8)), JoinedAt: msTime(r.int(9)), Replayed: r.int(10) == 1,
	}
}

// openedCart is open_cart.lua's OK reply: {OK, token, who, status,
// created_ms, deadline_ms, expires_ms, lines, replayed}.
type openedCart struct {
	token, who, status string
	ctd, deadline, exp int64
	lines              string
	replayed           bool
}

func (r reply) openedCart() openedCart {
	return openedCart{token: r.str(1), who: r.str(2), status: r.str(3), ctd: r.int(4), deadline: r.int(5),
		exp: r.int(6), lines: r.str(7), replayed: r.int(8) == 1}
}

// recordedRefusals is the refusals in open_cart.lua's {REFUSED, refusals, 1},
// as finish_cart.lua recorded them.
func (r reply) recordedRefusals() string { return r.str(1) }

// lineRefusal is one refused line of hold_cart_lines.lua's reply: its
// 1-based position among the call's lines, and reserve's refusal {code, a, b}.
type lineRefusal struct {
	line       int
	code, a, b string
}

// lineRefusals decodes hold_cart_lines.lua's {REFUSED, n, (line, code, a, b) x n}.
func (r reply) lineRefusals() []lineRefusal {
	n := int(r.int(1))
	out := make([]lineRefusal, 0, n)
	for j := range n {
		at := 2 + 4*j
		out = append(out, lineRefusal{line: int(r.int(at)), code: r.str(at + 1), a: r.str(at + 2), b: r.str(at + 3)})
	}
	return out
}

// endedHold reads the ending a CLOSED reply of reconcile_hold.lua made, or
// an AGREES reply found (Redis has the ledger's HELD row ended in the SKU's
// current generation): {code, status, ended_ms, expires_ms, extensions}. It
// returns the ending as the event Redis wrote for it (the same id, so both
// record one movement); false when the reply names no ending.
func (r reply) endedHold(row db.Reservation) (db.Event, bool) {
	kind := map[string]string{db.StatusCancelled: "cancel", db.StatusExpired: "expire"}[r.str(1)]
	if kind == "" || row.Status != db.StatusHeld {
		return db.Event{}, false
	}
	ev := db.Event{
		ID: kind + ":" + row.Token, Kind: kind, Token: row.Token, SKU: row.SKU, Principal: row.Principal,
		Quantity: row.Quantity, ExpiresAt: row.ExpiresAt, CreatedAt: row.CreatedAt, At: msTime(r.int(2)),
		IdempotencyHash: row.IdempotencyHash, RequestHash: row.RequestHash, Extensions: row.Extensions,
	}
	if ext := int(r.int(4)); ext > row.Extensions {
		ev.ExpiresAt, ev.Extensions = msTime(r.int(3)), ext
	}
	if r.int(2) == 0 {
		ev.At = time.Now()
	}
	return ev, true
}

// reserveError is the message of reserve.lua's {ERR, message}: deciding
// that request of the batch raised an error.
func (r reply) reserveError() string { return r.str(1) }

// abandonedCart decodes abandon_cart.lua's {OK, who, lines}.
func (r reply) abandonedCart() (who, lines string) { return r.str(1), r.str(2) }

// generation is the generation in stage_rebuild.lua's {OK, gen}.
func (r reply) generation() string { return r.str(1) }

// claimedSKU is the SKU in claim_idempotency_key.lua's {REUSED, sku}.
func (r reply) claimedSKU() string { return r.str(1) }

// dueTokens decodes due_holds.lua's {now_ms, token...}.
func (r reply) dueTokens() []string {
	if len(r) <= 1 {
		return nil
	}
	tokens := make([]string, 0, len(r)-1)
	for _, t := range r[1:] {
		if s, ok := t.(string); ok {
			tokens = append(tokens, s)
		}
	}
	return tokens
}

func (r reply) str(i int) string {
	if i >= len(r) {
		return ""
	}
	switch v := r[i].(type) {
	case string:
		return v
	case int64:
		return fmt.Sprint(v)
	}
	return ""
}

func (r reply) int(i int) int64 {
	if i >= len(r) {
		return 0
	}
	switch v := r[i].(type) {
	case int64:
		return v
	case string:
		var n int64
		_, _ = fmt.Sscan(v, &n)
		return n
	}
	return 0
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func msTimePtr(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := msTime(ms)
	return &t
}

// drawApplied decodes apply_draw.lua's OK reply: {OK, holds, queued,
// winners not held}.
func (r reply) drawApplied() (holds, queued, unheld int) {
	return int(r.int(1)), int(r.int(2)), int(r.int(3))
}

// drawDone decodes apply_draw.lua's SKIP reply: the entries applied so far.
func (r reply) drawDone() int { return int(r.int(1)) }

// walkOffers decodes continue_walk.lua's reply: {DONE or PENDING, offers
// made by this run}.
func (r reply) walkOffers() int { return int(r.int(1)) }
