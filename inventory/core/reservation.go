package core

import "time"

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
	// Extensions is how many times the hold was extended (Extend); ExpiresAt
	// is the latest expiry.
	Extensions int
	// Replayed is true when the call changed nothing and returned an earlier
	// outcome (an idempotent replay or a repeated commit).
	Replayed bool
}
