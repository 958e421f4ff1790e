package inventory

import (
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// The scripts' reply codes are package core's (see core.ReplyCode), which
// every aggregate reads them from.
type replyCode = core.ReplyCode

func replyOf(o *outcome.Outcome) replyCode { return core.ReplyOf(o) }

// The protocol codes, by their names in this package.
const (
	codeOK               = core.CodeOK
	codeHeld             = core.CodeHeld
	codeNeedsHydration   = core.CodeNeedsHydration
	codeCommitInProgress = core.CodeCommitInProgress
	codeNotDue           = core.CodeNotDue
	codeReserveError     = core.CodeReserveError
	codeWalkPending      = core.CodeWalkPending
	codePending          = core.CodePending
	codeSkip             = core.CodeSkip
	codeExists           = core.CodeExists
	codeStale            = core.CodeStale
	codeDone             = core.CodeDone
	codeReused           = core.CodeReused
	codeMark             = core.CodeMark
	codeCheck            = core.CodeCheck
	codeRefused          = core.CodeRefused
	codeLate             = core.CodeLate
	codeAgrees           = core.CodeAgrees
	codeReleased         = core.CodeReleased
	codeAdopted          = core.CodeAdopted
	codeClosed           = core.CodeClosed
	codeRestated         = core.CodeRestated
)

var protocolCodes = core.ProtocolCodes

// The outcomes finish_commit.lua takes (ARGV[2]), besides the ledger's
// CANCELLED and EXPIRED.
const (
	outcomeCommitted = core.OutcomeCommitted
	outcomeRestore   = core.OutcomeRestore
	outcomeRefused   = core.OutcomeRefused
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

// newHold is reserve.lua's reply for a hold its run made (its expiry, and
// the run's clock as its creation): the token, SKU, principal and quantity are the
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

func rejectionError(r script.Rejection) error { return core.RejectionError(r) }

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

func msTime(ms int64) time.Time { return core.MsTime(ms) }

func msTimePtr(ms int64) *time.Time { return core.MsTimePtr(ms) }
