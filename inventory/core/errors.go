package core

import (
	"errors"
	"fmt"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/outcome"
)

// ProductNotFound is the *NotFoundError of an unknown SKU.
func ProductNotFound(sku string) error {
	return &outcome.NotFoundError{Kind: "product", Key: sku, Field: "sku"}
}

// Unavailable reports that Redis or Postgres could not do op (a lost
// connection, a timeout): ErrUnavailable, with the cause.
func Unavailable(op string, cause error) error {
	return fmt.Errorf("%s: %w: %w", op, outcome.ErrUnavailable, cause)
}

// LedgerError maps ledger errors to business outcomes; sku names the product
// a missing row is reported for ("" when the call had none).
func LedgerError(op, sku string, err error) error {
	switch {
	case errors.Is(err, db.ErrNotFound) && sku != "":
		return ProductNotFound(sku)
	case errors.Is(err, db.ErrNotFound):
		return outcome.ErrNotFound
	case errors.Is(err, db.ErrInvalid):
		return &outcome.InvalidInputError{Field: "input", Reason: err.Error()}
	}
	return Unavailable(op, err)
}
