package inventory

import (
	"time"

	"github.com/dropline/dropline/db"
)

// Status is where a reservation is in its life:
//
//	reserve --> HELD --commit--> COMMITTED
//	             |  \--cancel--> CANCELLED
//	             \----expiry---> EXPIRED
type Status string

// The statuses a client sees. A hold that is being committed shows as HELD.
const (
	StatusHeld      Status = "HELD"
	StatusCommitted Status = "COMMITTED"
	StatusCancelled Status = "CANCELLED"
	StatusExpired   Status = "EXPIRED"
)

// Reservation is a hold on units of one SKU by one principal.
type Reservation struct {
	Token       string
	SKU         string
	Principal   string
	Quantity    int
	Status      Status
	ExpiresAt   time.Time
	CreatedAt   time.Time
	CommittedAt *time.Time
	// EndedAt is when a CANCELLED or EXPIRED reservation released its units.
	EndedAt *time.Time
	// Replayed is true when the call changed nothing and returned an earlier
	// outcome (an idempotent replay or a repeated commit).
	Replayed bool
}

func statusFrom(s string) Status {
	if s == "COMMITTING" {
		return StatusHeld
	}
	return Status(s)
}

// holdFromReply parses hold_reply: {code, token, sku, who, qty, status,
// expires_ms, created_ms, committed_ms, ended_ms, replayed}.
func holdFromReply(r reply) Reservation {
	return Reservation{
		Token: r.str(1), SKU: r.str(2), Principal: r.str(3), Quantity: int(r.int(4)),
		Status: statusFrom(r.str(5)), ExpiresAt: msTime(r.int(6)), CreatedAt: msTime(r.int(7)),
		CommittedAt: msTimePtr(r.int(8)), EndedAt: msTimePtr(r.int(9)), Replayed: r.int(10) == 1,
	}
}

func holdFromHash(token string, h map[string]string) Reservation {
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
	return Reservation{
		Token: token, SKU: h["sku"], Principal: h["who"], Quantity: int(num("qty")), Status: statusFrom(h["st"]),
		ExpiresAt: msTime(num("exp")), CreatedAt: msTime(num("ctd")),
		CommittedAt: msTimePtr(num("cmt")), EndedAt: msTimePtr(num("end")),
	}
}

func holdFromLedger(r db.Reservation) Reservation {
	return Reservation{
		Token: r.Token, SKU: r.SKU, Principal: r.Principal, Quantity: r.Quantity, Status: Status(r.Status),
		ExpiresAt: r.ExpiresAt.UTC(), CreatedAt: r.CreatedAt.UTC(), CommittedAt: utcPtr(r.CommittedAt), EndedAt: utcPtr(r.EndedAt),
	}
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
