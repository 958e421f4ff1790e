package inventory

import (
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
)

// The engine's business outcomes are package outcome's: one definition each
// (its code and its public message), which the scripts answer by code and
// the API reports by code. The names below are the same values, so callers
// of the engine need not import a second package.
var (
	ErrOutOfStock           = outcome.ErrOutOfStock
	ErrQuotaExceeded        = outcome.ErrQuotaExceeded
	ErrSaleNotActive        = outcome.ErrSaleNotActive
	ErrInvalidInput         = outcome.ErrInvalidInput
	ErrIdempotencyKeyReused = outcome.ErrIdempotencyKeyReused
	ErrNotFound             = outcome.ErrNotFound
	ErrExpired              = outcome.ErrExpired
	ErrAlreadyCancelled     = outcome.ErrAlreadyCancelled
	ErrAlreadyCommitted     = outcome.ErrAlreadyCommitted
	ErrForbidden            = outcome.ErrForbidden
	ErrExtensionLimit       = outcome.ErrExtensionLimit
	ErrWaitlistFull         = outcome.ErrWaitlistFull
	ErrDrawOnly             = outcome.ErrDrawOnly
	ErrUnavailable          = outcome.ErrUnavailable
	ErrRateLimited          = outcome.ErrRateLimited
	ErrQueueRequired        = outcome.ErrQueueRequired
	ErrPassExpired          = outcome.ErrPassExpired
	ErrPassInvalid          = outcome.ErrPassInvalid
	ErrProofInvalid         = outcome.ErrProofInvalid
	ErrAccessCodeInvalid    = outcome.ErrAccessCodeInvalid
	ErrQueueFull            = outcome.ErrQueueFull
)

// The typed errors of package outcome, which carry an outcome's details,
// under the names callers of the engine know.
type (
	// OutOfStockError is outcome.OutOfStockError.
	OutOfStockError = outcome.OutOfStockError

	// QuotaExceededError is outcome.QuotaExceededError.
	QuotaExceededError = outcome.QuotaExceededError

	// SaleNotActiveError is outcome.SaleNotActiveError.
	SaleNotActiveError = outcome.SaleNotActiveError

	// ExtensionLimitError is outcome.ExtensionLimitError.
	ExtensionLimitError = outcome.ExtensionLimitError

	// InvalidInputError is outcome.InvalidInputError.
	InvalidInputError = outcome.InvalidInputError

	// NotFoundError is outcome.NotFoundError.
	NotFoundError = outcome.NotFoundError

	// WaitlistFullError is outcome.WaitlistFullError.
	WaitlistFullError = outcome.WaitlistFullError

	// RateLimitedError is outcome.RateLimitedError.
	RateLimitedError = outcome.RateLimitedError
)

// Code is the stable name of a business outcome, as the API reports it.
type Code = outcome.Code

func productNotFound(sku string) error { return core.ProductNotFound(sku) }

func reservationNotFound(token string) error {
	return &NotFoundError{Kind: "reservation", Key: token, Field: "token"}
}

// unavailable wraps a store failure so that errors.Is(err, ErrUnavailable)
// holds while the cause stays visible to the operator's log.
func unavailable(op string, cause error) error { return core.Unavailable(op, cause) }

// ErrorCode returns the business code of err, or "" when err is not a
// business outcome (a bug or an unexpected failure, which the API reports as
// internal).
func ErrorCode(err error) Code { return outcome.CodeOf(err) }

// ErrorMessage returns the text a client may see for a business outcome:
// the typed error's own message (it carries the useful numbers), else its
// outcome's public message; "" when err is not a business outcome.
func ErrorMessage(err error) string { return outcome.MessageOf(err) }
