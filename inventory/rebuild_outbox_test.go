package inventory_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// outboxOnlyHolds makes, on a SKU of 4 units, the state a reload after a
// promotion finds: alice's hold is in the ledger as HELD and its cancel only
// in the outbox (the cancel's own ledger write failed), and the holds of bob
// and carol only in the outbox. The write-behind does not run.
func outboxOnlyHolds(t *testing.T, b *bundle, sku string) (alice, bob, carol string) {
	t.Helper()
	b.product(t, sku, 4, 0)
	reserve := func(who inventory.Principal) string {
		h, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)
		return h.Token
	}
	alice = reserve(buyer(1))
	b.drainOutbox(t)
	_, err := b.deadEngine(t).Cancel(b.ctx, buyer(1), alice)
	require.NoError(t, err)
	bob, carol = reserve(buyer(2)), reserve(buyer(3))
	require.Equal(t, db.StatusHeld, b.ledgerStatus(t, alice), "the cancel is only in the outbox")
	require.Zero(t, b.count(t, `SELECT count(*)::int FROM reservations WHERE token = ANY($1)`, []string{bob, carol}),
		"the holds are only in the outbox")
	return alice, bob, carol
}

// requireOutboxKept checks that the SKU was rebuilt with what its outbox
// said, whoever rebuilt it: alice's hold cancelled, those of bob and carol
// held; then that they sell as such and the ledger agrees.
func requireOutboxKept(t *testing.T, b *bundle, sku, alice, bob, carol string) {
	t.Helper()
	s := b.stock(t, sku)
	require.Equal(t, inventory.Stock{SKU: sku, Total: 4, Held: 2, Available: 2},
		inventory.Stock{SKU: s.SKU, Total: s.Total, Sold: s.Sold, Held: s.Held, Available: s.Available},
		"rebuilt with the holds of bob and carol, without alice's")
	require.Equal(t, "CANCELLED", b.rawStatus(t, sku, alice))
	require.Equal(t, "HELD", b.rawStatus(t, sku, bob))
	require.Equal(t, "HELD", b.rawStatus(t, sku, carol))
	_, err := b.engine.Commit(b.ctx, buyer(1), alice)
	require.ErrorIs(t, err, inventory.ErrAlreadyCancelled, "an acknowledged cancel is never sold")
	for i, tok := range []string{bob, carol} {
		r, err := b.engine.Commit(b.ctx, buyer(2+i), tok)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, r.Status)
	}
	b.drainOutbox(t)
	require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, alice))
	require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements
		WHERE token = $1 AND kind IN ('commit', 'cancel', 'expire')`, alice), "alice's hold released once, never sold")
	s = b.requireBalanced(t, sku)
	require.Equal(t, 2, s.Sold)
	require.Zero(t, s.Held)
}

// A request that finds a SKU missing while its outbox still holds events
// the ledger has not applied (a reload after a promotion has dropped the
// stock hash and not yet rebuilt it, or the hash alone was lost) rebuilds
// it from the ledger with those events applied first. Before, the request
// read the older ledger: alice's cancelled hold came back HELD (and could be
// sold), and the holds of bob and carol were lost, their units offered
// again.
func TestRequestRebuildAppliesTheOutboxFirst(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LAZY-OUTBOX-1"
		alice, bob, carol := outboxOnlyHolds(t, b, sku)
		// What RebuildStale does first; a request comes before its rebuild.
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())
		requireOutboxKept(t, b, sku, alice, bob, carol)
		// The reload's own rebuild, coming second, changes nothing.
		require.NoError(t, b.engine.Maintenance().RebuildStale(b.ctx, sku))
		s := b.requireBalanced(t, sku)
		require.Equal(t, 2, s.Sold)
		require.Equal(t, 2, s.Available)
	})
}

// The same with real concurrency: a reload (RebuildStale) runs while
// readers and buyers of the SKU keep asking for it, so whichever finds the
// SKU missing rebuilds it, in this process or in another engine on the same
// Redis and Postgres (another instance). The result must not depend on who
// won.
func TestReloadRacingRequestsKeepsTheOutbox(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		other := b.engineWithPool(t, b.pool.Config().Copy(), inventory.Config{})
		for round := range 4 {
			sku := fmt.Sprintf("LAZY-OUTBOX-RACE-%d", round)
			alice, bob, carol := outboxOnlyHolds(t, b, sku)
			ctx, stop := context.WithCancel(b.ctx)
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for i := range 6 {
				e := b.engine
				if i%2 == 1 {
					e = other
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if _, err := e.Catalog().Stock(ctx, sku); err != nil && ctx.Err() == nil {
							errs <- err
							return
						}
					}
				}()
			}
			time.Sleep(5 * time.Millisecond)
			err := b.engine.Maintenance().RebuildStale(b.ctx, sku)
			time.Sleep(20 * time.Millisecond)
			stop()
			wg.Wait()
			close(errs)
			require.NoError(t, err)
			for err := range errs {
				require.NoError(t, err)
			}
			requireOutboxKept(t, b, sku, alice, bob, carol)
		}
	})
}

// A sale in flight while a request rebuilds its SKU (the commit had moved
// the hold out of reach of expiry before the stock hash was dropped, and
// writes the sale after the rebuild) whose hold is only in the outbox.
// Before the rebuild applied the outbox, the rebuild did not know the hold
// and sold its unit to bob; the ledger then took the sale (it had sold
// nothing), and Redis recorded it on top: held + sold over the total.
func TestSaleInFlightAcrossARequestRebuildStaysWithinTheTotal(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LAZY-OUTBOX-SALE-1"
		b.product(t, sku, 1, 0)
		alice, bob := buyer(1), buyer(2)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)

		committer, entered, open := b.gatedEngine(t)
		done := make(chan error, 1)
		go func() { _, err := committer.Commit(b.ctx, alice, h.Token); done <- err }()
		<-entered // COMMITTING in Redis; the sale waits for Postgres
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())
		_, bobErr := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		open()
		require.NoError(t, <-done)

		s := b.stock(t, sku)
		require.LessOrEqual(t, s.Held+s.Sold, s.Total, "held + sold within the total: %+v", s)
		require.ErrorIs(t, bobErr, inventory.ErrOutOfStock, "the rebuild knew alice's hold")
		b.drainOutbox(t)
		s = b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Sold)
		require.Zero(t, s.Held)
	})
}

// saleHeldBackAcrossARebuild begins alice's commit of hold (COMMITTING in
// Redis, the sale waiting for Postgres), runs between (with the SKU's stock
// hash dropped, as a reload after a promotion does, so the first request
// rebuilds it), then lets the sale go on and returns the commit's outcome.
func saleHeldBackAcrossARebuild(t *testing.T, b *bundle, sku, hold string, between func()) error {
	t.Helper()
	committer, entered, open := b.gatedEngine(t)
	done := make(chan error, 1)
	go func() { _, err := committer.Commit(b.ctx, buyer(1), hold); done <- err }()
	<-entered
	require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())
	between()
	open()
	return <-done
}

// A sale in flight across a rebuild of a hold the rebuild recorded as
// expired (the ledger still had it as HELD, past its expiry, and the expiry
// reaches the ledger through the outbox) is refused as expired, and the
// unit stays with the buyer the rebuild gave it to. Before, the ledger took
// the sale (its row was HELD), and Redis recorded it on top of bob's hold:
// held 1 + sold 1 of a total of 1.
func TestSaleInFlightOfAHoldTheRebuildExpiredIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LAZY-OUTBOX-SALE-2"
		b.product(t, sku, 1, 0)
		h, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)

		var bob inventory.Reservation
		err = saleHeldBackAcrossARebuild(t, b, sku, h.Token, func() {
			// Past alice's expiry: the request's rebuild records it as expired.
			require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(50 * time.Millisecond)) },
				5*time.Second, 10*time.Millisecond)
			var err error
			bob, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
			require.NoError(t, err, "the rebuild released alice's unit")
		})

		s := b.stock(t, sku)
		require.LessOrEqual(t, s.Held+s.Sold, s.Total, "held + sold within the total: %+v", s)
		require.ErrorIs(t, err, inventory.ErrExpired, "the sale of a hold the rebuild expired")
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, h.Token))
		require.Equal(t, "HELD", b.rawStatus(t, sku, bob.Token))
		b.drainOutbox(t)
		require.Equal(t, db.StatusExpired, b.ledgerStatus(t, h.Token))
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements
			WHERE token = $1 AND kind IN ('commit', 'cancel', 'expire')`, h.Token), "alice's hold released once, never sold")
		_, err = b.engine.Commit(b.ctx, buyer(2), bob.Token)
		require.NoError(t, err)
		b.drainOutbox(t)
		s = b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Sold)
		require.Zero(t, s.Held)
	})
}

// The same for a hold the rebuild recorded as expired because it no longer
// fits the ledger's stock: after a promotion, the ledger has two acknowledged
// holds on one unit (carol's, which the promoted Redis lost, and alice's,
// which it made afterwards). The rebuild keeps the older, carol's; alice's
// sale, begun before the rebuild, is refused as expired and carol's hold
// sells. Before, the ledger took alice's sale and Redis counted it on top of
// carol's hold, until carol's commit was refused OUT_OF_STOCK.
func TestSaleInFlightOfAHoldThatNoLongerFitsIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LAZY-OUTBOX-SALE-3"
		b.product(t, sku, 1, 0)
		carol, err := b.engine.Reserve(b.ctx, buyer(3), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)
		lost := b.outboxEvents(t)
		b.wipe(t) // the promoted Redis never had carol's hold
		alice, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, lost)) // the write-behind had read it

		err = saleHeldBackAcrossARebuild(t, b, sku, alice.Token, func() {
			_, err := b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
			require.ErrorIs(t, err, inventory.ErrOutOfStock, "the rebuild kept carol's hold")
		})

		s := b.stock(t, sku)
		require.LessOrEqual(t, s.Held+s.Sold, s.Total, "held + sold within the total: %+v", s)
		require.ErrorIs(t, err, inventory.ErrExpired, "the sale of a hold the rebuild expired")
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token))
		require.Equal(t, "HELD", b.rawStatus(t, sku, carol.Token))
		_, err = b.engine.Commit(b.ctx, buyer(3), carol.Token)
		require.NoError(t, err)
		b.drainOutbox(t)
		require.Equal(t, db.StatusExpired, b.ledgerStatus(t, alice.Token))
		require.Equal(t, db.StatusCommitted, b.ledgerStatus(t, carol.Token))
		s = b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Sold)
		require.Zero(t, s.Held)
	})
}

// A rebuild that would drop a hold whose row another transaction holds (a
// sale of it being written, which then waits for the product's row lock the
// rebuild holds) gives up its snapshot and takes it again once the writer is
// done, instead of waiting for a writer that waits for it: PostgreSQL would
// break that deadlock by failing one of the two.
func TestRebuildGivesWayToAWriterOfAHoldItDrops(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LAZY-OUTBOX-SALE-4"
		b.product(t, sku, 1, 0)
		h, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		b.loseOutbox(t) // the write-behind applied it and trimmed it
		require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(50 * time.Millisecond)) },
			5*time.Second, 10*time.Millisecond)

		writer, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = writer.Rollback(b.ctx) })
		_, err = writer.Exec(b.ctx, `SELECT 1 FROM reservations WHERE token = $1 FOR UPDATE`, h.Token)
		require.NoError(t, err)
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())
		done := make(chan error, 1)
		go func() {
			_, err := b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
			done <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*)::int FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'
				  AND query LIKE 'UPDATE reservations SET dropped_at%'`).Scan(&n))
			return n > 0
		}, 10*time.Second, time.Millisecond, "the rebuild waits for the row")
		// The writer now wants the product's row, as a sale does last.
		_, err = writer.Exec(b.ctx, `SELECT 1 FROM products WHERE sku = $1 FOR NO KEY UPDATE`, sku)
		require.NoError(t, err, "the writer was not failed to break a deadlock")
		require.NoError(t, writer.Commit(b.ctx))
		require.NoError(t, <-done, "rebuilt once the writer was done; alice's unit went to bob")
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, h.Token))
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM reservations
			WHERE token = $1 AND status = 'HELD' AND dropped_at IS NOT NULL`, h.Token), "marked before the SKU went live")
		_, err = b.engine.Commit(b.ctx, buyer(1), h.Token)
		require.ErrorIs(t, err, inventory.ErrExpired)
		b.drainOutbox(t)
		require.Equal(t, 1, b.requireBalanced(t, sku).Held)
	})
}
