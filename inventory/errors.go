package inventory

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Business outcomes. Callers test them with errors.Is; the typed errors below
// carry the details a client needs (how many are left, what the limit is).
var (
	ErrOutOfStock           = errors.New("not enough stock")
	ErrQuotaExceeded        = errors.New("per-customer limit reached")
	ErrSaleNotActive        = errors.New("the sale is not open")
	ErrInvalidInput         = errors.New("invalid input")
	ErrIdempotencyKeyReused = errors.New("idempotency key already used for a different request")
	ErrNotFound             = errors.New("not found")
	ErrExpired              = errors.New("the reservation has expired")
	ErrAlreadyCancelled     = errors.New("the reservation was cancelled")
	ErrAlreadyCommitted     = errors.New("the reservation is already committed")
	ErrForbidden            = errors.New("the reservation belongs to someone else")
	ErrExtensionLimit       = errors.New("the reservation cannot be extended further")
	// ErrWaitlistFull means a SKU's waitlist has as many waiters as it may.
	ErrWaitlistFull = errors.New("the waitlist is full")
	// ErrDrawOnly means the product is sold by draw: enter its draw instead.
	ErrDrawOnly = errors.New("this product is sold by draw: enter the draw instead")
	// ErrQueueRequired means the product (or its drop) is sold behind an
	// admission queue: join it, and come back with the pass it gives.
	ErrQueueRequired = errors.New("this product is sold through a queue: join it and use the pass it gives")
	// ErrPassExpired means the admission pass presented is past its expiry.
	ErrPassExpired = errors.New("the admission pass has expired")
	// ErrPassInvalid means the admission pass presented is not the
	// caller's current pass of this product's queue, or is spent already.
	ErrPassInvalid = errors.New("the admission pass is not valid for this caller and product")
	// ErrProofInvalid means a queue that asks joiners for proof of work got
	// none, or one that does not answer a live challenge of this caller.
	ErrProofInvalid = errors.New("the queue asks for a proof of work: solve a fresh queueChallenge")
	// ErrAccessCodeInvalid means a presale queue got no access code, or one
	// that is not the queue's or another principal's already.
	ErrAccessCodeInvalid = errors.New("the access code is not valid for this queue")
	// ErrQueueFull means a queue has as many tickets as it may.
	ErrQueueFull = errors.New("the queue is full")
	// ErrUnavailable means a store could not be reached; the call may be retried.
	ErrUnavailable = errors.New("temporarily unavailable, retry")
)

// OutOfStockError says how many units were left when a reserve asked for more.
type OutOfStockError struct {
	Available int
}

func (e *OutOfStockError) Error() string {
	return fmt.Sprintf("not enough stock: %d available", e.Available)
}

// Is makes errors.Is(err, ErrOutOfStock) true.
func (e *OutOfStockError) Is(target error) bool { return target == ErrOutOfStock }

// QuotaExceededError says what the per-principal limit is and how many units
// the principal already holds or bought.
type QuotaExceededError struct {
	Limit int
	Held  int
}

func (e *QuotaExceededError) Error() string {
	return fmt.Sprintf("per-customer limit is %d and %d are already held or bought", e.Limit, e.Held)
}

// Is makes errors.Is(err, ErrQuotaExceeded) true.
func (e *QuotaExceededError) Is(target error) bool { return target == ErrQuotaExceeded }

// SaleNotActiveError gives the sale window; a nil bound is open.
type SaleNotActiveError struct {
	StartsAt *time.Time
	EndsAt   *time.Time
}

func (e *SaleNotActiveError) Error() string {
	switch {
	case e.StartsAt != nil && e.EndsAt != nil:
		return fmt.Sprintf("the sale runs from %s to %s", e.StartsAt.Format(time.RFC3339), e.EndsAt.Format(time.RFC3339))
	case e.StartsAt != nil:
		return "the sale starts at " + e.StartsAt.Format(time.RFC3339)
	case e.EndsAt != nil:
		return "the sale ended at " + e.EndsAt.Format(time.RFC3339)
	}
	return ErrSaleNotActive.Error()
}

// Is makes errors.Is(err, ErrSaleNotActive) true.
func (e *SaleNotActiveError) Is(target error) bool { return target == ErrSaleNotActive }

// ExtensionLimitError says why a hold cannot be extended: it has had every
// extension it may have (Used == Limit), or the expiry asked for would pass
// Latest, the longest hold after its creation.
type ExtensionLimitError struct {
	Limit  int
	Used   int
	Latest time.Time
}

func (e *ExtensionLimitError) Error() string {
	if e.Used >= e.Limit {
		return fmt.Sprintf("the reservation was extended %d times, the most allowed", e.Used)
	}
	return "the reservation cannot be held past " + e.Latest.UTC().Format(time.RFC3339)
}

// Is makes errors.Is(err, ErrExtensionLimit) true.
func (e *ExtensionLimitError) Is(target error) bool { return target == ErrExtensionLimit }

// InvalidInputError names the offending input field and why it was refused.
type InvalidInputError struct {
	Field  string
	Reason string
}

func (e *InvalidInputError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InvalidInputError) Is(target error) bool { return target == ErrInvalidInput }

// NotFoundError names what does not exist: the kind of thing, the key the
// caller gave, and the input field that carried the key, so a client can
// tell a mistyped SKU from a stale reservation token.
type NotFoundError struct {
	Kind  string // "product" or "reservation"
	Key   string // the SKU or token as the caller gave it
	Field string // the input field that named it ("sku", "token"); "" when none
}

// maxKeyInMessage bounds how much of a caller's key an error repeats back:
// a lookup of an invalid SKU may carry any string.
const maxKeyInMessage = 128

func (e *NotFoundError) Error() string {
	key := e.Key
	if len(key) > maxKeyInMessage {
		key = key[:maxKeyInMessage] + "..."
	}
	return fmt.Sprintf("%s %s not found", e.Kind, strconv.Quote(key))
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

func productNotFound(sku string) error {
	return &NotFoundError{Kind: "product", Key: sku, Field: "sku"}
}

func reservationNotFound(token string) error {
	return &NotFoundError{Kind: "reservation", Key: token, Field: "token"}
}

// unavailable wraps a store failure so that errors.Is(err, ErrUnavailable)
// holds while the cause stays visible to the operator's log.
func unavailable(op string, cause error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, cause)
}

// Code is the stable name of a business outcome, as the API reports it.
type Code string

// The codes of every business outcome.
const (
	CodeOutOfStock           Code = "OUT_OF_STOCK"
	CodeQuotaExceeded        Code = "QUOTA_EXCEEDED"
	CodeSaleNotActive        Code = "SALE_NOT_ACTIVE"
	CodeExpired              Code = "EXPIRED"
	CodeAlreadyCancelled     Code = "ALREADY_CANCELLED"
	CodeAlreadyCommitted     Code = "ALREADY_COMMITTED"
	CodeIdempotencyKeyReused Code = "IDEMPOTENCY_KEY_REUSED"
	CodeNotFound             Code = "NOT_FOUND"
	CodeInvalidInput         Code = "INVALID_INPUT"
	CodeForbidden            Code = "FORBIDDEN"
	CodeExtensionLimit       Code = "EXTENSION_LIMIT"
	CodeUnavailable          Code = "UNAVAILABLE"
	CodeWaitlistFull         Code = "WAITLIST_FULL"
	CodeDrawOnly             Code = "DRAW_ONLY"
	CodeRateLimited          Code = "RATE_LIMITED"
	CodeQueueRequired        Code = "QUEUE_REQUIRED"
	CodePassExpired          Code = "PASS_EXPIRED"
	CodePassInvalid          Code = "PASS_INVALID"
	CodeProofInvalid         Code = "PROOF_INVALID"
	CodeAccessCodeInvalid    Code = "ACCESS_CODE_INVALID"
	CodeQueueFull            Code = "QUEUE_FULL"
)

// outcomes is the one table of business outcomes: each sentinel, its code,
// and the message a client sees when the error is not one of the typed
// errors above (whose own text carries the useful numbers). A wrapped
// error's own text may carry operation names or store errors, so it is never
// shown.
var outcomes = []struct {
	err     error
	code    Code
	message string
}{
	{ErrOutOfStock, CodeOutOfStock, ErrOutOfStock.Error()},
	{ErrQuotaExceeded, CodeQuotaExceeded, ErrQuotaExceeded.Error()},
	{ErrSaleNotActive, CodeSaleNotActive, ErrSaleNotActive.Error()},
	{ErrExpired, CodeExpired, ErrExpired.Error()},
	{ErrAlreadyCancelled, CodeAlreadyCancelled, ErrAlreadyCancelled.Error()},
	{ErrAlreadyCommitted, CodeAlreadyCommitted, ErrAlreadyCommitted.Error()},
	{ErrIdempotencyKeyReused, CodeIdempotencyKeyReused, ErrIdempotencyKeyReused.Error()},
	{ErrNotFound, CodeNotFound, ErrNotFound.Error()},
	{ErrInvalidInput, CodeInvalidInput, ErrInvalidInput.Error()},
	// Whose reservation it is stays unsaid.
	{ErrForbidden, CodeForbidden, "not allowed for this principal"},
	{ErrExtensionLimit, CodeExtensionLimit, ErrExtensionLimit.Error()},
	{ErrUnavailable, CodeUnavailable, ErrUnavailable.Error()},
	{ErrWaitlistFull, CodeWaitlistFull, ErrWaitlistFull.Error()},
	{ErrDrawOnly, CodeDrawOnly, ErrDrawOnly.Error()},
	{ErrRateLimited, CodeRateLimited, ErrRateLimited.Error()},
	{ErrQueueRequired, CodeQueueRequired, ErrQueueRequired.Error()},
	{ErrPassExpired, CodePassExpired, ErrPassExpired.Error()},
	{ErrPassInvalid, CodePassInvalid, ErrPassInvalid.Error()},
	{ErrProofInvalid, CodeProofInvalid, ErrProofInvalid.Error()},
	{ErrAccessCodeInvalid, CodeAccessCodeInvalid, ErrAccessCodeInvalid.Error()},
	{ErrQueueFull, CodeQueueFull, ErrQueueFull.Error()},
}

// ErrorCode returns the business code of err, or "" when err is not a
// business outcome (a bug or an unexpected failure, which the API reports as
// internal).
func ErrorCode(err error) Code {
	for _, o := range outcomes {
		if errors.Is(err, o.err) {
			return o.code
		}
	}
	return ""
}

// ErrorMessage returns the text a client may see for a business outcome:
// the typed error's own message (it carries the useful numbers), else its
// sentinel's public message; "" when err is not a business outcome.
func ErrorMessage(err error) string {
	var (
		oos *OutOfStockError
		qe  *QuotaExceededError
		sna *SaleNotActiveError
		inv *InvalidInputError
		nf  *NotFoundError
		el  *ExtensionLimitError
		wf  *WaitlistFullError
	)
	switch {
	case errors.As(err, &oos):
		return oos.Error()
	case errors.As(err, &qe):
		return qe.Error()
	case errors.As(err, &sna):
		return sna.Error()
	case errors.As(err, &inv):
		return inv.Error()
	case errors.As(err, &nf):
		return nf.Error()
	case errors.As(err, &el):
		return el.Error()
	case errors.As(err, &wf):
		return wf.Error()
	}
	for _, o := range outcomes {
		if errors.Is(err, o.err) {
			return o.message
		}
	}
	return ""
}
