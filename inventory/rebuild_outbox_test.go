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
