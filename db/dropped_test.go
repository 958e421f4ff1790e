package db_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
)

// TestASaleOfAHoldTheRebuildDroppedIsRefusedAsExpired: a HELD row a
// rebuild marked (Seal: Redis has the hold as expired, its expire
// event is on its way) is not sold, alone, in a batch or in a cart, and is
// answered as EXPIRED; it stays HELD, so the first ending that reaches the
// ledger is the one it keeps (here a cancel); an unmarked row of the same
// SKU sells.
func TestASaleOfAHoldTheRebuildDroppedIsRefusedAsExpired(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "DROPPED-1", 4)
	ctx := context.Background()
	for _, tok := range []string{"a", "b", "c", "kept"} {
		insertReservation(t, pool, saleOf("DROPPED-1", tok), db.StatusHeld)
	}
	mark := func(tokens ...string) error {
		return l.WithSnapshot(ctx, "DROPPED-1", time.Hour, time.Hour, func(s *db.Snapshot) error {
			return s.Seal(ctx, tokens)
		})
	}
	require.NoError(t, mark("a", "b", "c"))
	require.NoError(t, mark("a"), "marking again changes nothing")
	r, err := l.Reservations().Reservation(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, db.StatusHeld, r.Status)
	require.NotNil(t, r.DroppedAt)

	var ended *db.EndedError
	_, err = l.Sales().RecordSale(ctx, saleOf("DROPPED-1", "a"))
	require.ErrorAs(t, err, &ended)
	require.Equal(t, db.StatusExpired, ended.Status)
	_, err = l.Sales().RecordCartSale(ctx, "cart-1", "p-b", []db.Reservation{saleOf("DROPPED-1", "b")})
	require.ErrorAs(t, err, &ended)
	require.Equal(t, db.StatusExpired, ended.Status)
	_, err = l.Sales().RecordSale(ctx, saleOf("DROPPED-1", "kept"))
	require.NoError(t, err)

	at := time.Now().UTC().Truncate(time.Millisecond)
	ev := func(kind, tok string) db.Event {
		return db.Event{ID: kind + ":" + tok, Kind: kind, Token: tok, SKU: "DROPPED-1", Principal: "p-" + tok, Quantity: 1,
			ExpiresAt: at.Add(time.Hour), CreatedAt: at, At: at}
	}
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("cancel", "c"), ev("expire", "a"), ev("expire", "c")}))
	for tok, want := range map[string]string{"a": db.StatusExpired, "b": db.StatusHeld, "c": db.StatusCancelled, "kept": db.StatusCommitted} {
		r, err := l.Reservations().Reservation(ctx, tok)
		require.NoError(t, err)
		require.Equal(t, want, r.Status, tok)
	}
	p, err := l.Product(ctx, "DROPPED-1")
	require.NoError(t, err)
	require.Equal(t, 1, p.Sold, "the unmarked hold only")
	var sales int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM sales WHERE sku = 'DROPPED-1'`).Scan(&sales))
	require.Equal(t, 1, sales)
}

// TestMarkDroppedGivesWayToASaleBeingWritten: a sale that holds the row
// (it waits for the product's lock, which the rebuild's snapshot holds)
// makes Seal answer ErrRowsBusy rather than wait for it for ever;
// once the row is free, the mark is set.
func TestMarkDroppedGivesWayToASaleBeingWritten(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "DROPPED-2", 1)
	ctx := context.Background()
	insertReservation(t, pool, saleOf("DROPPED-2", "a"), db.StatusHeld)
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = writer.Rollback(ctx) })
	_, err = writer.Exec(ctx, `UPDATE reservations SET status = 'COMMITTED' WHERE token = 'a'`)
	require.NoError(t, err)

	mark := func() error {
		return l.WithSnapshot(ctx, "DROPPED-2", time.Hour, time.Hour, func(s *db.Snapshot) error {
			return s.Seal(ctx, []string{"a"})
		})
	}
	require.ErrorIs(t, mark(), db.ErrRowsBusy)
	require.NoError(t, writer.Rollback(ctx))
	require.NoError(t, mark())
	r, err := l.Reservations().Reservation(ctx, "a")
	require.NoError(t, err)
	require.NotNil(t, r.DroppedAt)
}

// TestMarksOutliveTheSnapshot: the marks are committed before the SKU would
// be published, in a transaction of their own, so a snapshot that fails
// afterwards (here it returns an error, as when PostgreSQL ends its
// connection after the publish) does not take them with it, and a sale of
// the hold is still refused. With no second connection to be had from the
// pool (a pool of one, held by the snapshot), the marks are committed on a
// connection dialled as the pool dials its own (its run-time parameters and
// connect hooks), and outlive the snapshot all the same.
func TestMarksOutliveTheSnapshot(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "DROPPED-3", 2)
	ctx := context.Background()
	insertReservation(t, pool, saleOf("DROPPED-3", "a"), db.StatusHeld)
	insertReservation(t, pool, saleOf("DROPPED-3", "b"), db.StatusHeld)
	failed := errors.New("the snapshot's connection was lost after the publish")
	markThenFail := func(l *db.Ledger, tok string) error {
		return l.WithSnapshot(ctx, "DROPPED-3", time.Hour, time.Hour, func(s *db.Snapshot) error {
			if err := s.Seal(ctx, []string{tok}); err != nil {
				return err
			}
			return failed
		})
	}
	requireRefused := func(tok string) {
		t.Helper()
		r, err := l.Reservations().Reservation(ctx, tok)
		require.NoError(t, err)
		require.NotNil(t, r.DroppedAt, "the mark outlives the snapshot")
		var ended *db.EndedError
		_, err = l.Sales().RecordSale(ctx, saleOf("DROPPED-3", tok))
		require.ErrorAs(t, err, &ended)
		require.Equal(t, db.StatusExpired, ended.Status)
	}
	require.ErrorIs(t, markThenFail(l, "a"), failed)
	requireRefused("a")

	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "dropline-marks"
	var mu sync.Mutex
	var names []string
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		var name string
		err := c.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&name)
		mu.Lock()
		defer mu.Unlock()
		names = append(names, name)
		return err
	}
	single, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(single.Close)
	require.ErrorIs(t, markThenFail(db.NewLedger(single), "b"), failed)
	requireRefused("b")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"dropline-marks", "dropline-marks"}, names, "the snapshot's connection, then the marks'")
}

// TestMarkDroppedRefusesASnapshotThatLostItsLock: a snapshot whose
// connection PostgreSQL ended before the marks (its product lock gone, so a
// sale may have been written since it was read) is not to be published:
// Seal fails, although its marks, in their own transaction, stay.
func TestMarkDroppedRefusesASnapshotThatLostItsLock(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "DROPPED-4", 1)
	ctx := context.Background()
	insertReservation(t, pool, saleOf("DROPPED-4", "a"), db.StatusHeld)
	err := l.WithSnapshot(ctx, "DROPPED-4", time.Hour, time.Hour, func(s *db.Snapshot) error {
		var pid int32
		require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&pid))
		_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid)
		require.NoError(t, err)
		err = s.Seal(ctx, []string{"a"})
		require.Error(t, err, "the snapshot's lock is gone")
		return err
	})
	require.Error(t, err)
	r, err := l.Reservations().Reservation(ctx, "a")
	require.NoError(t, err)
	require.NotNil(t, r.DroppedAt)
}
