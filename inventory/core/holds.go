package core

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dropline/dropline/inventory/outcome"
)

// What the holds and the carts, whose lines are holds, share.

// ExtendRequest asks for more time on a hold (Extend) or on every line of a
// cart (ExtendCart).
type ExtendRequest struct {
	// HoldFor is the new length from now: MinHold to MaxHold.
	HoldFor time.Duration
	// IdempotencyKey, when set, makes the call safe to retry: the same key
	// from the same principal, for the same hold (or cart) and HoldFor,
	// answers the hold as it is, with Replayed, and extends nothing again,
	// for as long as Redis keeps the hold (Retention after it ends). The key
	// with another hold, another HoldFor or any other mutation is
	// ErrIdempotencyKeyReused. Without it a retried call is another
	// extension, and spends one more of MaxExtensions.
	IdempotencyKey string
}

// ExtensionClaim is what an idempotency key used to extend the hold or cart
// token is claimed for, in place of a SKU: no SKU looks like it, so the key
// serves this extension and nothing else.
func ExtensionClaim(token string) string { return "#extend:" + token }

// NewAttemptID returns a commit attempt's id: 64 random bits.
func NewAttemptID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// NothingSent reports a Postgres failure that certainly wrote nothing: the
// connection could not even be made, or pgx knows the request never left.
func NothingSent(err error) bool {
	var connect *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &connect)
}

// ErrCommitInProgress is why a hold (or a cart line) being committed cannot
// be cancelled.
var ErrCommitInProgress = errors.New("a commit of this reservation is in progress")

// The outcomes finish_commit.lua takes (ARGV[2]), besides the ledger's
// CANCELLED and EXPIRED.
const (
	OutcomeCommitted = "COMMITTED"
	OutcomeRestore   = "RESTORE"
	OutcomeRefused   = "REFUSED"
)

// ErrCartLine refuses a commit, cancel or extension of one line of a cart on
// its own: a cart is sold, let go and extended whole.
var ErrCartLine = &outcome.InvalidInputError{Field: "token", Reason: "this reservation is a line of a cart: commit, cancel or extend the cart"}
