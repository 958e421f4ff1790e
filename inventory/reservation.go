package inventory

import (
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
)

// Status and Reservation are package core's, which the aggregates share.
type (
	// Status is where a reservation is in its life (see core.Status).
	Status = core.Status
	// Reservation is a hold on units of one SKU by one principal.
	Reservation = core.Reservation
)

// The statuses a client sees. A hold that is being committed shows as HELD.
const (
	StatusHeld      = core.StatusHeld
	StatusCommitted = core.StatusCommitted
	StatusCancelled = core.StatusCancelled
	StatusExpired   = core.StatusExpired
)

func statusFrom(s string) Status {
	if s == "COMMITTING" {
		return StatusHeld
	}
	return Status(s)
}

// storedHold is a hold as Redis keeps it, the fields of {p}hold:<token>:
// read with HGETALL (holdFromHash) or returned by a script (reply.hold).
// reservation is the one way from either to a Reservation.
type storedHold struct {
	token, sku, who, status string
	qty, ext                int
	exp, ctd, cmt, end      int64  // ms; cmt and end are 0 until they happen
	attempt                 string // cst: the commit attempt under way, in a hash only
}

// holdFromHash decodes a hold's hash.
func holdFromHash(token string, h map[string]string) storedHold {
	num := func(k string) int64 {
		var n int64
		for _, c := range h[k] {
			if c < '0' || c > '9' {
				return 0
			}
			n = n*10 + int64(c-'0')
		}
		return n
	}
	return storedHold{
		token: token, sku: h["sku"], who: h["who"], qty: int(num("qty")), ext: int(num("ext")), status: h["st"],
		exp: num("exp"), ctd: num("ctd"), cmt: num("cmt"), end: num("end"), attempt: h["cst"],
	}
}

func (h storedHold) reservation() Reservation {
	return Reservation{
		Token: h.token, SKU: h.sku, Principal: h.who, Quantity: h.qty, Status: statusFrom(h.status),
		ExpiresAt: msTime(h.exp), CreatedAt: msTime(h.ctd), CommittedAt: msTimePtr(h.cmt), EndedAt: msTimePtr(h.end),
		Extensions: h.ext,
	}
}

// holdFromLedger is a hold as the Postgres ledger has it.
func holdFromLedger(r db.Reservation) Reservation {
	return Reservation{
		Token: r.Token, SKU: r.SKU, Principal: r.Principal, Quantity: r.Quantity, Status: Status(r.Status),
		ExpiresAt: r.ExpiresAt.UTC(), CreatedAt: r.CreatedAt.UTC(), CommittedAt: utcPtr(r.CommittedAt), EndedAt: utcPtr(r.EndedAt),
		Extensions: r.Extensions,
	}
}

func utcPtr(t *time.Time) *time.Time { return core.UTCPtr(t) }
