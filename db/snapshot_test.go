package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
)

// TestSnapshotsLeaveHalfThePoolForTheirSeals: on a pool of four
// connections, two snapshots are in flight at once; a third waits for a
// slot, without a connection, and gives up with its context. Each seal then
// takes a connection of the pool's other half, so four snapshots sealing
// together never dial one outside the pool. Before the bound, four
// snapshots held the whole pool, and each seal waited 2 s for a connection
// and then dialled one.
func TestSnapshotsLeaveHalfThePoolForTheirSeals(t *testing.T) {
	t.Parallel()
	base, _ := ledgerWithProduct(t, "SLOTS-0", 1)
	ctx := context.Background()
	cfg := base.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 4, 0
	var dials atomic.Int32
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { dials.Add(1); return nil }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l := db.NewLedger(pool)

	skus := []string{"SLOTS-1", "SLOTS-2", "SLOTS-3", "SLOTS-4"}
	for _, sku := range skus {
		_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 1})
		require.NoError(t, err)
		insertReservation(t, base, saleOf(sku, "held-"+sku), db.StatusHeld)
	}
	entered := make(chan string, len(skus))
	release := make(chan struct{})
	var released sync.Once
	free := func() { released.Do(func() { close(release) }) }
	t.Cleanup(free) // before pool.Close: a failure must not leave the snapshots holding it
	errs := make(chan error, len(skus))
	for _, sku := range skus {
		go func() {
			errs <- l.WithSnapshot(ctx, sku, time.Hour, time.Hour, func(s *db.Snapshot) error {
				entered <- sku
				<-release
				return s.Seal(ctx, []string{"held-" + sku})
			})
		}()
	}
	<-entered
	<-entered
	require.EqualValues(t, 2, pool.Stat().AcquiredConns(), "two snapshots, a connection each")

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = l.WithSnapshot(short, "SLOTS-0", time.Hour, time.Hour, func(*db.Snapshot) error {
		t.Error("a snapshot ran past the slots")
		return nil
	})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, entered, "no third snapshot began while two were in flight")
	require.EqualValues(t, 2, pool.Stat().AcquiredConns(), "the snapshots waiting for a slot hold no connection")

	free()
	for range skus {
		require.NoError(t, <-errs)
	}
	require.Len(t, entered, len(skus)-2, "the other two ran once a slot was free")
	require.LessOrEqual(t, dials.Load(), int32(4), "every seal had a connection of the pool; none was dialled outside it")
	for _, sku := range skus {
		r, err := l.Reservations().Reservation(ctx, "held-"+sku)
		require.NoError(t, err)
		require.NotNil(t, r.DroppedAt, "%s: the seal's mark", sku)
	}
}
