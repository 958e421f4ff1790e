package inventory_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// restockMovements counts the restock movements Postgres recorded for a SKU.
func (b *bundle) restockMovements(t *testing.T, sku string) (n, units int) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `
		SELECT count(*), coalesce(sum(quantity), 0) FROM stock_movements WHERE sku = $1 AND kind = 'restock'`,
		sku).Scan(&n, &units))
	return n, units
}

func TestRestockEventIDIsScopedToItsSKU(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	b.product(t, "PO-A", 10, 0)
	b.product(t, "PO-B", 10, 0)

	// One purchase order restocks two SKUs under one event id: both count.
	_, err := b.engine.Catalog().Restock(b.ctx, admin, "PO-A", 5, "po-1001")
	require.NoError(t, err)
	_, err = b.engine.Catalog().Restock(b.ctx, admin, "PO-B", 3, "po-1001")
	require.NoError(t, err)
	require.Equal(t, 15, b.requireBalanced(t, "PO-A").Total)
	require.Equal(t, 13, b.requireBalanced(t, "PO-B").Total, "the same id on another SKU is another restock")
	n, units := b.restockMovements(t, "PO-B")
	require.Equal(t, 1, n)
	require.Equal(t, 3, units)

	// Retrying either (the client got UNAVAILABLE) adds nothing.
	for range 3 {
		p, err := b.engine.Catalog().Restock(b.ctx, admin, "PO-A", 5, "po-1001")
		require.NoError(t, err)
		require.Equal(t, 15, b.stock(t, p.SKU).Total)
	}
	require.Equal(t, 15, b.requireBalanced(t, "PO-A").Total)
	n, units = b.restockMovements(t, "PO-A")
	require.Equal(t, 1, n)
	require.Equal(t, 5, units)
}

func TestRestockRetriedConcurrentlyAddsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	b.product(t, "PO-C", 0, 0)
	errs := make([]error, 20)
	race(len(errs), func(i int) {
		_, errs[i] = b.engine.Catalog().Restock(b.ctx, admin, "PO-C", 4, "delivery-7")
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 4, b.requireBalanced(t, "PO-C").Total)
	n, _ := b.restockMovements(t, "PO-C")
	require.Equal(t, 1, n)
}

func TestRestockRefusesReusedEventIDAndMissingOne(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	b.product(t, "PO-D", 10, 0)
	_, err := b.engine.Catalog().Restock(b.ctx, admin, "PO-D", 5, "po-2002")
	require.NoError(t, err)

	// The same id with another quantity is a different restock reusing the id.
	_, err = b.engine.Catalog().Restock(b.ctx, admin, "PO-D", 6, "po-2002")
	require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
	require.Equal(t, inventory.ErrIdempotencyKeyReused.Code(), inventory.ErrorCode(err))

	// Without an id a retry after UNAVAILABLE could not be told from a new
	// restock, so an id is required.
	_, err = b.engine.Catalog().Restock(b.ctx, admin, "PO-D", 5, "")
	var inv *inventory.InvalidInputError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "eventId", inv.Field)

	require.Equal(t, 15, b.requireBalanced(t, "PO-D").Total, "refused restocks changed nothing")
	n, units := b.restockMovements(t, "PO-D")
	require.Equal(t, 1, n)
	require.Equal(t, 5, units)
}

func TestRestockBeyondTheMaximumTotalIsInvalidInput(t *testing.T) {
	t.Parallel()
	const maxTotal = 1_000_000_000
	b := setup(t, "single", inventory.Config{})
	b.product(t, "PO-E", 10, 0)

	// Up to the maximum exactly is fine.
	_, err := b.engine.Catalog().Restock(b.ctx, admin, "PO-E", maxTotal-10, "fill-up")
	require.NoError(t, err)
	require.Equal(t, maxTotal, b.requireBalanced(t, "PO-E").Total)

	// One more unit, and then more than the Postgres column could hold.
	for _, q := range []int{1, maxTotal / 2, maxTotal} {
		_, err = b.engine.Catalog().Restock(b.ctx, admin, "PO-E", q, fmt.Sprintf("over-%d", q))
		var inv *inventory.InvalidInputError
		require.ErrorAs(t, err, &inv, "restocking %d: %v", q, err)
		require.Equal(t, "quantity", inv.Field)
		require.False(t, errors.Is(err, inventory.ErrUnavailable))
	}
	require.Equal(t, maxTotal, b.requireBalanced(t, "PO-E").Total)
	n, _ := b.restockMovements(t, "PO-E")
	require.Equal(t, 1, n)
}
