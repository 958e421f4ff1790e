package inventory_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// droppedByReload makes the ledger hold two acknowledged holds on the one
// unit of sku, as after a promotion: carol's, which the promoted Redis lost,
// and alice's, which it made afterwards. The reload after the promotion
// (RebuildStale) keeps the older, carol's, records alice's as expired and
// marks her row (HELD, dropped_at set). It returns alice's and carol's holds
// and alice's events of the life of the SKU before the reload (her reserve).
func droppedByReload(t *testing.T, b *bundle, sku string) (alice, carol inventory.Reservation, before []db.Event) {
	t.Helper()
	b.product(t, sku, 1, 0)
	carol, err := b.engine.Reserve(b.ctx, buyer(3), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err)
	lost := b.outboxEvents(t)
	b.wipe(t) // the promoted Redis never had carol's hold
	alice, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err)
	before = b.outboxEvents(t)
	require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, lost)) // the write-behind had read it
	require.NoError(t, b.engine.Maintenance().RebuildStale(b.ctx, sku))
	require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token))
	require.Equal(t, "HELD", b.rawStatus(t, sku, carol.Token))
	require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM reservations
		WHERE token = $1 AND status = 'HELD' AND dropped_at IS NOT NULL`, alice.Token), "alice's row marked")
	return alice, carol, before
}

// forgetHoldOfDroppedRow lets carol cancel (the unit is free again) and then
// loses alice's record in Redis, as an eviction of a key with a TTL would,
// while the SKU stays loaded and her expiry has not reached the ledger.
func forgetHoldOfDroppedRow(t *testing.T, b *bundle, sku string, alice, carol inventory.Reservation) {
	t.Helper()
	_, err := b.engine.Cancel(b.ctx, buyer(3), carol.Token)
	require.NoError(t, err)
	require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf(sku), alice.Token)).Err())
	require.Equal(t, db.StatusHeld, b.ledgerStatus(t, alice.Token), "her expiry is still on its way")
}

// requireDroppedAgain checks that alice's hold stays expired: Redis counts
// nothing for it, another buyer can take the unit, her commit is refused as
// expired, and the ledger ends her row as EXPIRED once the outbox is applied.
func requireDroppedAgain(t *testing.T, b *bundle, sku string, alice inventory.Reservation) {
	t.Helper()
	s := b.stock(t, sku)
	require.Zero(t, s.Held, "alice's hold counted as held again: %+v", s)
	require.Equal(t, 1, s.Available)
	r, err := b.engine.Reservation(b.ctx, buyer(1), alice.Token)
	require.NoError(t, err)
	require.Equal(t, inventory.StatusExpired, r.Status)
	_, err = b.engine.Commit(b.ctx, buyer(1), alice.Token)
	require.ErrorIs(t, err, inventory.ErrExpired)
	bob, err := b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err, "the unit is free")
	_, err = b.engine.Commit(b.ctx, buyer(2), bob.Token)
	require.NoError(t, err)
	b.drainOutbox(t)
	require.Equal(t, db.StatusExpired, b.ledgerStatus(t, alice.Token))
	s = b.requireBalanced(t, sku)
	require.Equal(t, 1, s.Sold)
	require.Zero(t, s.Held)
}

// A hold the reload recorded as expired, whose record Redis then lost, is
// not brought back as HELD when its buyer reads it (the read finds it in the
// ledger only, as HELD): it is recorded as expired again. Before, the read
// adopted it (HELD, its unit counted as held) although the ledger refuses
// its sale.
func TestReadOfAHoldTheRebuildDroppedDoesNotAdoptIt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "DROPPED-READ-1"
		alice, carol, _ := droppedByReload(t, b, sku)
		forgetHoldOfDroppedRow(t, b, sku, alice, carol)

		r, err := b.engine.Reservation(b.ctx, buyer(1), alice.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusExpired, r.Status, "alice is shown a hold whose sale the ledger refuses")
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token))
		requireDroppedAgain(t, b, sku, alice)
	})
}

// The same when the write-behind applies an event of alice's from before the
// reload (her reserve, read before the promotion and written after) and
// ReconcileApplied tells the reloaded SKU what the ledger says of her hold:
// it is closed as expired. Before, it was adopted as HELD.
func TestReconcileAppliedDoesNotAdoptAHoldTheRebuildDropped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "DROPPED-LATE-1"
		alice, carol, before := droppedByReload(t, b, sku)
		forgetHoldOfDroppedRow(t, b, sku, alice, carol)

		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, before))
		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf(sku), before)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token), "not adopted")
		n, err = b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf(sku), before)
		require.NoError(t, err)
		require.Zero(t, n, "idempotent")
		requireDroppedAgain(t, b, sku, alice)
	})
}

// markedWhileRedisHasItHeld gives alice a HELD hold in Redis whose ledger row
// a rebuild marked dropped: what a promoted Redis that never saw that
// rebuild (it ran on the master the promotion lost) still has.
func markedWhileRedisHasItHeld(t *testing.T, b *bundle, sku string) inventory.Reservation {
	t.Helper()
	b.product(t, sku, 1, 0)
	alice, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err)
	b.drainOutbox(t)
	_, err = b.pool.Exec(b.ctx, `UPDATE reservations SET dropped_at = now() WHERE token = $1`, alice.Token)
	require.NoError(t, err)
	return alice
}

// A commit of such a hold left half-done (COMMITTING in Redis, no sale in
// the ledger, which would refuse it) is settled by the commit reconciler as
// expired, not put back to HELD. Before, it went back to HELD, its unit
// counted as held until it expired.
func TestReconcileCommitsReleasesAHoldTheRebuildDropped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "DROPPED-HALF-1"
		alice := markedWhileRedisHasItHeld(t, b, sku)
		p := inventory.PartitionOf(sku)
		// A crash after begin_commit: COMMITTING, out of the expiry index.
		require.NoError(t, b.rdb.HSet(b.ctx, b.engine.Keys().Hold(p, alice.Token), "st", "COMMITTING", "cst", "1").Err())
		require.NoError(t, b.rdb.ZRem(b.ctx, b.engine.Keys().Expiry(p), alice.Token).Err())
		require.NoError(t, b.rdb.ZAdd(b.ctx, b.engine.Keys().Committing(p), redis.Z{Score: 1, Member: alice.Token}).Err())

		n, err := b.engine.Maintenance().ReconcileCommits(b.ctx, p, time.Second, 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token), "not put back to HELD")
		requireDroppedAgain(t, b, sku, alice)
	})
}

// And a hold Redis has as HELD in the SKU's current life that the ledger has
// as HELD marked dropped, when an event of an earlier life of the SKU makes
// ReconcileApplied look at it, is released as expired. Before, Redis and the
// ledger were taken to agree.
func TestReconcileAppliedReleasesALiveHoldTheRebuildDropped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "DROPPED-LIVE-1"
		alice := markedWhileRedisHasItHeld(t, b, sku)
		earlier := db.Event{ID: "extend:" + alice.Token + ":1", Kind: "extend", Token: alice.Token, SKU: sku,
			Principal: buyer(1).ID, Quantity: 1, ExpiresAt: alice.ExpiresAt, CreatedAt: alice.CreatedAt,
			At: alice.CreatedAt, Gen: "0"}

		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf(sku), []db.Event{earlier})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "EXPIRED", b.rawStatus(t, sku, alice.Token))
		requireDroppedAgain(t, b, sku, alice)
	})
}

// A rebuild whose snapshot transaction PostgreSQL fails after the SKU went
// live (here its backend is terminated right after the publish, as a lost
// connection or a restart would end it) keeps its marks: a sale in flight
// of a hold it recorded as expired is still refused as expired, and the
// unit stays with bob, to whom the rebuild gave it. Before, the marks were
// rolled back with the snapshot: the ledger took the sale and Redis counted
// it on top of bob's hold (held 1 + sold 1 of a total of 1).
func TestMarksOfARebuildOutliveItsTransactionFailingAfterThePublish(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		marksOutliveTheSnapshotFailingAfterThePublish(t, backend, "DROPPED-KILLED-1", false)
	})
}

// The same with every other connection of the pool held (by other
// snapshots, say) while the rebuild marks: the marks are committed on a
// connection dialled outside the pool, and outlive the snapshot all the
// same. Before, they were written in the snapshot and went with it.
func TestMarksOfARebuildWithThePoolExhaustedOutliveItsTransaction(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		marksOutliveTheSnapshotFailingAfterThePublish(t, backend, "DROPPED-KILLED-2", true)
	})
}

func marksOutliveTheSnapshotFailingAfterThePublish(t *testing.T, backend, sku string, exhaust bool) {
	b := setup(t, backend, inventory.Config{})
	b.product(t, sku, 1, 0)
	h, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
	require.NoError(t, err)
	b.drainOutbox(t)

	// The rebuild is the request's of rebuilder, over pool. When exhaust,
	// held keeps all of pool's connections but one, the snapshot's (a pool
	// of 2, so that the test takes few of the server's connections).
	rebuilder, pool := b.engine, b.pool
	if exhaust {
		pc := b.pool.Config().Copy()
		pc.MaxConns = 2
		var err error
		pool, err = pgxpool.NewWithConfig(b.ctx, pc)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		rebuilder, err = inventory.NewEngine(b.ctx, inventory.Config{KeyPrefix: b.prefix}, b.rdb, pool, zerolog.Nop())
		require.NoError(t, err)
	}
	var held []*pgxpool.Conn
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	t.Cleanup(release)
	var once sync.Once
	killed := make(chan error, 1)
	inventory.SetRebuildPublishedHook(rebuilder, func(string) {
		once.Do(func() {
			var err error
			if exhaust {
				if n, all := pool.Stat().AcquiredConns(), pool.Config().MaxConns; n != all {
					err = fmt.Errorf("%d of the pool's %d connections in use at the publish, want all", n, all)
				}
				release()
			}
			// The snapshot is the one transaction of the test's database
			// left open; the wait makes sure its backend is gone.
			var pids []int32
			if err == nil {
				var rows pgx.Rows
				rows, err = b.pool.Query(b.ctx, `SELECT pid FROM pg_stat_activity
					WHERE datname = current_database() AND state = 'idle in transaction'`)
				if err == nil {
					pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
				}
			}
			if err == nil && len(pids) != 1 {
				err = fmt.Errorf("%d transactions open, want the snapshot's only", len(pids))
			}
			if err == nil {
				_, err = b.pool.Exec(b.ctx, `SELECT pg_terminate_backend($1, 5000)`, pids[0])
			}
			killed <- err
		})
	})

	var bob inventory.Reservation
	err = saleHeldBackAcrossARebuild(t, b, sku, h.Token, func() {
		require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(50 * time.Millisecond)) },
			5*time.Second, 10*time.Millisecond)
		if exhaust {
			for range pool.Config().MaxConns - 1 {
				c, err := pool.Acquire(b.ctx)
				require.NoError(t, err)
				held = append(held, c)
			}
		}
		req := inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute}
		var err error
		if bob, err = rebuilder.Reserve(b.ctx, buyer(2), req); err != nil {
			// The rebuild failed as its transaction did, after the SKU went live.
			bob, err = rebuilder.Reserve(b.ctx, buyer(2), req)
		}
		require.NoError(t, err, "the rebuild released alice's unit")
		select {
		case err := <-killed:
			require.NoError(t, err)
		default:
			t.Fatal("the rebuild's transaction was not ended after the publish")
		}
	})

	s := b.stock(t, sku)
	require.LessOrEqual(t, s.Held+s.Sold, s.Total, "held + sold within the total: %+v", s)
	require.ErrorIs(t, err, inventory.ErrExpired, "the sale of a hold the rebuild expired")
	require.Equal(t, "EXPIRED", b.rawStatus(t, sku, h.Token))
	require.Equal(t, "HELD", b.rawStatus(t, sku, bob.Token))
	b.drainOutbox(t)
	require.Equal(t, db.StatusExpired, b.ledgerStatus(t, h.Token))
	_, err = b.engine.Commit(b.ctx, buyer(2), bob.Token)
	require.NoError(t, err)
	b.drainOutbox(t)
	s = b.requireBalanced(t, sku)
	require.Equal(t, 1, s.Sold)
	require.Zero(t, s.Held)
}
