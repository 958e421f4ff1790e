package core

import (
	"time"

	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// Script replies. Every script answers a list whose first element is a code
// (ReplyCode); what follows depends on the script and the code, as each
// script's header in lua/ says, and package script decodes it.
//
// A code is either a business outcome, which package outcome defines once
// (ReplyOf names it here), or one of the protocol codes below, which tell
// the engine what to do next and never reach a client.
// TestEveryScriptCodeMapsToOne checks that each code a script can answer is
// exactly one of the two.

// ReplyCode is what a script says happened: the first element of its reply.
type ReplyCode string

// ReplyOf is the code a script answers for a business outcome.
func ReplyOf(o *outcome.Outcome) ReplyCode { return ReplyCode(o.Code()) }

// The protocol codes of lua/'s scripts.
const (
	CodeOK             ReplyCode = "OK"
	CodeHeld           ReplyCode = "HELD"            // reserve.lua made the hold: {code, expires_ms, created_ms}
	CodeNeedsHydration ReplyCode = "NEEDS_HYDRATION" // the SKU is not loaded: {code, sku}

	// begin_commit.lua, release_hold.lua and extend_hold.lua, with a
	// hold_reply, besides their business outcomes (FORBIDDEN, EXPIRED,
	// ALREADY_CANCELLED, ALREADY_COMMITTED, EXTENSION_LIMIT, NOT_FOUND: no
	// live hold under the token).
	CodeCommitInProgress ReplyCode = "COMMIT_IN_PROGRESS"
	CodeNotDue           ReplyCode = "NOT_DUE"

	// reserve.lua's rejections are business outcomes, {code, a, b,
	// replayed} (rejection); RATE_LIMITED is {code, retry_after seconds}.
	// This one says deciding one request of a batch raised an error,
	// {code, message}; the batch's other requests have their own replies.
	CodeReserveError ReplyCode = "ERR"

	// reserve.lua and hold_cart_lines.lua: the units are there but the
	// SKU's waitlist walk is unfinished, {code, sku}: finish it, ask again.
	CodeWalkPending ReplyCode = "WALK_PENDING"
	// continue_walk.lua: the walk is still unfinished after this run, {code, offers}
	// (DONE: it ended).
	CodePending ReplyCode = "PENDING"

	// apply_draw.lua: the batch was applied before, {code, done}.
	CodeSkip ReplyCode = "SKIP"

	// stage_rebuild.lua, hydrate_sku.lua, publish_sku.lua, apply_product.lua.
	CodeExists ReplyCode = "EXISTS" // the SKU is loaded already
	CodeStale  ReplyCode = "STALE"  // a newer rebuild or product version is there
	CodeDone   ReplyCode = "DONE"   // this rebuild chunk was written before

	// claim_idempotency_key.lua.
	CodeReused ReplyCode = "REUSED" // claimed for another SKU: {code, sku}
	CodeMark   ReplyCode = "MARK"   // the partition's marker is missing
	CodeCheck  ReplyCode = "CHECK"  // check the ledger before claiming

	// The cart scripts (open_cart.lua, hold_cart_lines.lua, confirm_cart_lines.lua,
	// finish_cart.lua, abandon_cart.lua).
	CodeRefused ReplyCode = "REFUSED" // a line (or the key's first cart) was refused
	CodeLate    ReplyCode = "LATE"    // past the cart's deadline

	// reconcile_hold.lua.
	CodeAgrees   ReplyCode = "AGREES"
	CodeReleased ReplyCode = "RELEASED"
	CodeAdopted  ReplyCode = "ADOPTED"
	CodeClosed   ReplyCode = "CLOSED"
	CodeRestated ReplyCode = "RESTATED"
)

// ProtocolCodes lists the codes above, for the test that ties every code a
// script answers to exactly one meaning.
var ProtocolCodes = []ReplyCode{CodeOK, CodeHeld, CodeNeedsHydration, CodeCommitInProgress, CodeNotDue,
	CodeReserveError, CodeWalkPending, CodePending, CodeSkip, CodeExists, CodeStale, CodeDone, CodeReused, CodeMark, CodeCheck, CodeRefused,
	CodeLate, CodeAgrees, CodeReleased, CodeAdopted, CodeClosed, CodeRestated}

// RejectionError is the error of a refusal of reserve.lua (or
// join_waitlist.lua), {code, a, b, replayed}; nil when the code is not one
// of its rejections.
func RejectionError(r script.Rejection) error {
	switch ReplyCode(r.Code) {
	case ReplyOf(outcome.ErrOutOfStock):
		return &outcome.OutOfStockError{Available: int(r.IntA())}
	case ReplyOf(outcome.ErrQuotaExceeded):
		return &outcome.QuotaExceededError{Limit: int(r.IntA()), Held: int(r.IntB())}
	case ReplyOf(outcome.ErrSaleNotActive):
		return &outcome.SaleNotActiveError{StartsAt: MsTimePtr(r.IntA()), EndsAt: MsTimePtr(r.IntB())}
	case ReplyOf(outcome.ErrIdempotencyKeyReused):
		return outcome.ErrIdempotencyKeyReused
	case ReplyOf(outcome.ErrInvalidInput):
		return &outcome.InvalidInputError{Field: r.A, Reason: r.B}
	case ReplyOf(outcome.ErrWaitlistFull):
		return &outcome.WaitlistFullError{Limit: int(r.IntA())}
	case ReplyOf(outcome.ErrDrawOnly):
		return outcome.ErrDrawOnly
	case ReplyOf(outcome.ErrQueueRequired):
		return outcome.ErrQueueRequired
	case ReplyOf(outcome.ErrPassExpired):
		return outcome.ErrPassExpired
	case ReplyOf(outcome.ErrPassInvalid):
		return outcome.ErrPassInvalid
	}
	return nil
}

// MsTime is a time in Unix milliseconds as a UTC time.
func MsTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// MsTimePtr is MsTime(ms), nil when ms is 0 (never happened).
func MsTimePtr(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := MsTime(ms)
	return &t
}

// UTCPtr is t in UTC, nil when t is.
func UTCPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// TimeMs is t in Unix milliseconds, 0 when t is nil or zero.
func TimeMs(t *time.Time) int64 {
	if t == nil || t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
