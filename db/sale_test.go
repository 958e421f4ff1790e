package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
)

// TestASaleWaitingForTheWriteBehindDoesNotHoldTheProduct: a sale whose
// reservation row another transaction is inserting (the write-behind's
// batch) waits for it without holding the product's row, so another sale
// of the same SKU goes through meanwhile; once the batch commits, the
// waiting sale completes too.
func TestASaleWaitingForTheWriteBehindDoesNotHoldTheProduct(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "HOT-1", 10)
	ctx := context.Background()
	r := func(tok string) db.Reservation {
		return db.Reservation{Token: tok, SKU: "HOT-1", Principal: "p-" + tok, Quantity: 1,
			ExpiresAt: time.Now().Add(time.Hour), CreatedAt: time.Now()}
	}
	batch, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = batch.Rollback(ctx) }()
	_, err = batch.Exec(ctx, `INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		VALUES ('a', 'HOT-1', 'p-a', 1, 'HELD', now() + interval '1 hour', now())`)
	require.NoError(t, err)

	waiting := make(chan error, 1)
	go func() {
		_, err := l.Sales().RecordSale(ctx, r("a"))
		waiting <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the sale of a waits for the batch")

	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = l.Sales().RecordSale(bctx, r("b"))
	require.NoError(t, err, "the sale of b is not held behind the wait of a")

	require.NoError(t, batch.Commit(ctx))
	require.NoError(t, <-waiting)
	p, err := l.Product(ctx, "HOT-1")
	require.NoError(t, err)
	require.Equal(t, 2, p.Sold)
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM reservations WHERE token = 'a'`).Scan(&status))
	require.Equal(t, db.StatusCommitted, status)
}
