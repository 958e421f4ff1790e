package inventory_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// TestErrorVocabulary pins what clients see of every business outcome: its
// code and its public message, through whatever wrapping a layer adds. A
// wrapped error's own text (operation names, store errors) never shows.
func TestErrorVocabulary(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		err     error
		code    inventory.Code
		message string
	}{
		{inventory.ErrOutOfStock, "OUT_OF_STOCK", "not enough stock"},
		{&inventory.OutOfStockError{Available: 2}, "OUT_OF_STOCK", "not enough stock: 2 available"},
		{inventory.ErrQuotaExceeded, "QUOTA_EXCEEDED", "per-customer limit reached"},
		{&inventory.QuotaExceededError{Limit: 2, Held: 2}, "QUOTA_EXCEEDED", "per-customer limit is 2 and 2 are already held or bought"},
		{inventory.ErrSaleNotActive, "SALE_NOT_ACTIVE", "the sale is not open"},
		{&inventory.SaleNotActiveError{StartsAt: &start}, "SALE_NOT_ACTIVE", "the sale starts at 2026-12-01T09:00:00Z"},
		{&inventory.SaleNotActiveError{}, "SALE_NOT_ACTIVE", "the sale is not open"},
		{inventory.ErrExpired, "EXPIRED", "the reservation has expired"},
		{inventory.ErrAlreadyCancelled, "ALREADY_CANCELLED", "the reservation was cancelled"},
		{inventory.ErrAlreadyCommitted, "ALREADY_COMMITTED", "the reservation is already committed"},
		{inventory.ErrIdempotencyKeyReused, "IDEMPOTENCY_KEY_REUSED", "idempotency key already used for a different request"},
		{inventory.ErrNotFound, "NOT_FOUND", "not found"},
		{&inventory.NotFoundError{Kind: "product", Key: "DROP-1", Field: "sku"}, "NOT_FOUND", `product "DROP-1" not found`},
		{inventory.ErrInvalidInput, "INVALID_INPUT", "invalid input"},
		{&inventory.InvalidInputError{Field: "quantity", Reason: "must be at least 1"}, "INVALID_INPUT", "invalid quantity: must be at least 1"},
		{inventory.ErrForbidden, "FORBIDDEN", "not allowed for this principal"},
		{inventory.ErrExtensionLimit, "EXTENSION_LIMIT", "the reservation cannot be extended further"},
		{&inventory.ExtensionLimitError{Limit: 2, Used: 2}, "EXTENSION_LIMIT", "the reservation was extended 2 times, the most allowed"},
		{&inventory.ExtensionLimitError{Limit: 2, Used: 1, Latest: start}, "EXTENSION_LIMIT", "the reservation cannot be held past 2026-12-01T09:00:00Z"},
		{inventory.ErrUnavailable, "UNAVAILABLE", "temporarily unavailable, retry"},
	}
	for _, c := range cases {
		wrapped := fmt.Errorf("reserving DROP-1: %w", c.err)
		for _, err := range []error{c.err, wrapped} {
			require.Equal(t, c.code, inventory.ErrorCode(err), "%v", err)
			require.Equal(t, c.message, inventory.ErrorMessage(err), "%v", err)
		}
	}
	store := fmt.Errorf("reading hold: %w: %w", inventory.ErrUnavailable, errors.New("dial tcp 10.0.0.7:6379"))
	require.Equal(t, "temporarily unavailable, retry", inventory.ErrorMessage(store), "the store's error stays in the log")
	for _, err := range []error{errors.New("surprise"), nil} {
		require.Empty(t, inventory.ErrorCode(err))
		require.Empty(t, inventory.ErrorMessage(err))
	}
}
