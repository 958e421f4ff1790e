// Package outcome is Dropline's one vocabulary of business outcomes: what a
// buyer or an operator can be told happened (out of stock, expired, over the
// limit) as opposed to a failure of the code or of a store.
//
// Each outcome is defined once, here, as an *Outcome value that knows its
// code and its public message. Everything else derives from it: the scripts
// of lua/ answer the code as the first element of their reply (Parse reads
// it back), the engine returns the value itself (or a typed error below
// that carries its details and matches it with errors.Is), and the GraphQL
// layer reports the code as the ErrorCode enum value of the same name and
// the message as the userError's message. A test ties the three: every code
// a script can answer parses to exactly one outcome or is one of the
// engine's protocol codes, and every outcome is a value of the GraphQL enum.
//
// The package imports nothing of Dropline's: the sale policy, the engine and
// its aggregates all build on it.
package outcome

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Code is the stable name of a business outcome: the first element of a
// script's reply and the API's error code.
type Code string

// Outcome is one business outcome. It is an error, so the engine returns it
// as is (or wrapped, or through a typed error whose Is matches it).
type Outcome struct {
	code Code
	// message is what a client may be shown.
	message string
	// text is the error's own text, for logs and tests; the message when "".
	text string
}

// Error is the outcome's text as the operator's log shows it.
func (o *Outcome) Error() string {
	if o.text != "" {
		return o.text
	}
	return o.message
}

// Code is the outcome's stable name.
func (o *Outcome) Code() Code { return o.code }

// Message is the public message of the outcome when no typed error gives a
// more precise one.
func (o *Outcome) Message() string { return o.message }

var (
	all    []*Outcome
	byCode = map[Code]*Outcome{}
)

func define(code Code, message string) *Outcome {
	o := &Outcome{code: code, message: message}
	if byCode[code] != nil {
		panic("outcome: " + string(code) + " defined twice")
	}
	all = append(all, o)
	byCode[code] = o
	return o
}

// The business outcomes. Callers test them with errors.Is; the typed errors
// below carry the details a client needs (how many are left, what the limit is).
var (
	ErrOutOfStock           = define("OUT_OF_STOCK", "not enough stock")
	ErrQuotaExceeded        = define("QUOTA_EXCEEDED", "per-customer limit reached")
	ErrSaleNotActive        = define("SALE_NOT_ACTIVE", "the sale is not open")
	ErrExpired              = define("EXPIRED", "the reservation has expired")
	ErrAlreadyCancelled     = define("ALREADY_CANCELLED", "the reservation was cancelled")
	ErrAlreadyCommitted     = define("ALREADY_COMMITTED", "the reservation is already committed")
	ErrIdempotencyKeyReused = define("IDEMPOTENCY_KEY_REUSED", "idempotency key already used for a different request")
	ErrNotFound             = define("NOT_FOUND", "not found")
	ErrInvalidInput         = define("INVALID_INPUT", "invalid input")
	// ErrForbidden is shown without saying whose reservation it is.
	ErrForbidden      = withText(define("FORBIDDEN", "not allowed for this principal"), "the reservation belongs to someone else")
	ErrExtensionLimit = define("EXTENSION_LIMIT", "the reservation cannot be extended further")
	// ErrUnavailable means a store could not be reached; the call may be retried.
	ErrUnavailable = define("UNAVAILABLE", "temporarily unavailable, retry")
	// ErrWaitlistFull means a SKU's waitlist has as many waiters as it may.
	ErrWaitlistFull = define("WAITLIST_FULL", "the waitlist is full")
	// ErrDrawOnly means the product is sold by draw: enter its draw instead.
	ErrDrawOnly = define("DRAW_ONLY", "this product is sold by draw: enter the draw instead")
	// ErrRateLimited means the principal has spent its mutation budget for now.
	ErrRateLimited = define("RATE_LIMITED", "too many mutations")
	// ErrQueueRequired means the product (or its drop) is sold behind an
	// admission queue: join it, and come back with the pass it gives.
	ErrQueueRequired = define("QUEUE_REQUIRED", "this product is sold through a queue: join it and use the pass it gives")
	// ErrPassExpired means the admission pass presented is past its expiry.
	ErrPassExpired = define("PASS_EXPIRED", "the admission pass has expired")
	// ErrPassInvalid means the admission pass presented is not the
	// caller's current pass of this product's queue, or is spent already.
	ErrPassInvalid = define("PASS_INVALID", "the admission pass is not valid for this caller and product")
	// ErrProofInvalid means a queue that asks joiners for proof of work got
	// none, or one that does not answer a live challenge of this caller.
	ErrProofInvalid = define("PROOF_INVALID", "the queue asks for a proof of work: solve a fresh queueChallenge")
	// ErrAccessCodeInvalid means a presale queue got no access code, or one
	// that is not the queue's or another principal's already.
	ErrAccessCodeInvalid = define("ACCESS_CODE_INVALID", "the access code is not valid for this queue")
	// ErrQueueFull means a queue has as many tickets as it may.
	ErrQueueFull = define("QUEUE_FULL", "the queue is full")
)

func withText(o *Outcome, text string) *Outcome {
	o.text = text
	return o
}

// All lists every outcome, in the order defined above.
func All() []*Outcome { return append([]*Outcome(nil), all...) }

// Parse returns the outcome a script's reply code names; false when the
// code is not a business outcome (one of the engine's protocol codes).
func Parse(code string) (*Outcome, bool) {
	o, ok := byCode[Code(code)]
	return o, ok
}

// Of returns the outcome err is or wraps, or nil when err is not a business
// outcome (a bug or an unexpected failure, which the API reports as internal).
func Of(err error) *Outcome {
	if err == nil {
		return nil
	}
	var o *Outcome
	if errors.As(err, &o) {
		return o
	}
	for _, o := range all {
		if errors.Is(err, o) {
			return o
		}
	}
	return nil
}

// CodeOf returns the code of err's outcome, "" when it has none.
func CodeOf(err error) Code {
	if o := Of(err); o != nil {
		return o.code
	}
	return ""
}

// detailed is a typed error whose own text is its public message: it
// carries the numbers a client can act on.
type detailed interface {
	error
	public()
}

// MessageOf returns the text a client may see for a business outcome: a
// typed error's own message (it carries the useful numbers), else its
// outcome's public message; "" when err is not a business outcome. A
// wrapped error's own text may carry operation names or store errors, so it
// is never shown.
func MessageOf(err error) string {
	var d detailed
	if errors.As(err, &d) {
		return d.Error()
	}
	if o := Of(err); o != nil {
		return o.message
	}
	return ""
}

// OutOfStockError says how many units were left when a reserve asked for more.
type OutOfStockError struct {
	Available int
}

func (e *OutOfStockError) Error() string {
	return fmt.Sprintf("not enough stock: %d available", e.Available)
}

// Is makes errors.Is(err, ErrOutOfStock) true.
func (e *OutOfStockError) Is(target error) bool { return target == ErrOutOfStock }

func (*OutOfStockError) public() {}

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

func (*QuotaExceededError) public() {}

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

func (*SaleNotActiveError) public() {}

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

func (*ExtensionLimitError) public() {}

// InvalidInputError names the offending input field and why it was refused.
type InvalidInputError struct {
	Field  string
	Reason string
}

func (e *InvalidInputError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InvalidInputError) Is(target error) bool { return target == ErrInvalidInput }

func (*InvalidInputError) public() {}

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

func (*NotFoundError) public() {}

// WaitlistFullError says a SKU's waitlist has reached its bound.
type WaitlistFullError struct {
	Limit int
}

func (e *WaitlistFullError) Error() string {
	return fmt.Sprintf("the waitlist is full (%d waiting)", e.Limit)
}

// Is makes errors.Is(err, ErrWaitlistFull) true.
func (e *WaitlistFullError) Is(target error) bool { return target == ErrWaitlistFull }

func (*WaitlistFullError) public() {}

// RateLimitedError refuses a mutation whose principal has no budget left,
// and says when one more would fit. Its own text is not its public message:
// the API words the delay in whole seconds itself.
type RateLimitedError struct {
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("too many mutations: retry in %s", e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }
