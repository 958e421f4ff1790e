package inventory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// unflushedBundle is a bundle on a private PostgreSQL whose WAL writer
// flushes only every 10 s (and nothing else writes a data page or
// vacuums, which would flush the WAL before it), so that a batch the
// write-behind commits with synchronous_commit off stays unflushed for
// seconds, and a crash (StopImmediate) loses it.
func unflushedBundle(t *testing.T) (*bundle, *testenv.PrivatePostgres) {
	t.Helper()
	r := testenv.RedisBackend(t, "single")
	pg := testenv.StartPrivatePostgres(t, "wal_writer_delay=10s", "wal_writer_flush_after=1GB",
		"bgwriter_lru_maxpages=0", "checkpoint_timeout=1h", "max_wal_size=4GB", "autovacuum=off")
	cfg, err := pgxpool.ParseConfig(pg.URL())
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.ConnectTimeout = time.Second
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, db.Migrate(ctx, pool))
	e, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	return &bundle{ctx: ctx, engine: e, rdb: r.Client, pool: pool, prefix: r.Prefix}, pg
}

// holdMany makes n holds of one unit of sku, each by its own buyer
// (buyer(first+i)), and returns their tokens.
func (b *bundle) holdMany(t *testing.T, sku string, first, n int) []string {
	t.Helper()
	tokens := make([]string, n)
	for i := range n {
		h, err := b.engine.Reserve(b.ctx, buyer(first+i), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Hour})
		require.NoError(t, err)
		tokens[i] = h.Token
	}
	return tokens
}

// applyUnflushed applies the outbox events of sku as the write-behind
// does, without acknowledging them, and requires that the batch was
// committed unflushed (a copied batch of fresh holds).
func (b *bundle) applyUnflushed(t *testing.T, sku string) db.Commit {
	t.Helper()
	var events []db.Event
	for _, ev := range b.outboxEvents(t) {
		if ev.SKU == sku {
			events = append(events, ev)
		}
	}
	c, err := b.engine.Ledger().ApplyEventsUnflushed(b.ctx, nil, events)
	require.NoError(t, err)
	require.True(t, c.Unflushed, "a batch of %d fresh holds is copied and committed unflushed", len(events))
	return c
}

// warmWALWriter makes the WAL writer flush now: it flushes at once the
// first time it finds WAL to write, then at most every wal_writer_delay, so
// that a batch committed right after this stays unflushed for seconds.
func (b *bundle) warmWALWriter(t *testing.T) {
	t.Helper()
	const warm = "WAL-WARM-1"
	b.product(t, warm, 120, 0)
	b.holdMany(t, warm, 0, 120)
	c := b.applyUnflushed(t, warm)
	deadline := time.Now().Add(30 * time.Second)
	for b.walFlushed(t) < c.LSN {
		require.True(t, time.Now().Before(deadline), "the WAL writer never flushed the first batch")
		time.Sleep(50 * time.Millisecond)
	}
}

// walFlushed is how far PostgreSQL's WAL is on disk.
func (b *bundle) walFlushed(t *testing.T) uint64 {
	t.Helper()
	var f int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint`).Scan(&f))
	return uint64(f) //nolint:gosec // a WAL position
}

// Redis lost its data (the outbox with it) while the write-behind's last
// batch of a SKU's holds was committed in PostgreSQL but its WAL not yet
// flushed; a read rebuilds the SKU from the ledger, which shows the batch's
// rows; PostgreSQL crashes as the SKU goes live (the rebuild's publish
// hook), before the rebuild's own transaction commits, and recovers. No
// outbox entry is left to apply the holds again, so the ledger keeps them
// only if the rebuild made them durable before it published them: else
// Redis has 150 holds the ledger never will. After the crash, Redis and the
// ledger must agree hold by hold, and each restored hold must sell once, as
// a sale in both.
func TestRebuildPublishesOnlyHoldsThatSurviveAPostgresCrash(t *testing.T) {
	b, pg := unflushedBundle(t)
	const sku, n = "WAL-REBUILD-1", 150
	b.product(t, sku, n, 0)
	b.warmWALWriter(t)

	tokens := b.holdMany(t, sku, 1000, n)
	c := b.applyUnflushed(t, sku)
	require.Len(t, ledgerStatuses(t, b.pool, sku), n, "an unflushed commit is visible at once")
	require.Less(t, b.walFlushed(t), c.LSN, "the batch is committed and not yet on disk")

	b.wipe(t) // Redis restarted empty: the SKU and the outbox are gone
	crashed := false
	var flushedAtPublish uint64
	inventory.SetRebuildPublishedHook(b.engine, func(s string) {
		if s != sku || crashed {
			return
		}
		crashed = true
		flushedAtPublish = b.walFlushed(t)
		pg.StopImmediate()
	})
	err := b.engine.Rebuild(b.ctx, sku) // the hook runs on this goroutine
	inventory.SetRebuildPublishedHook(b.engine, nil)
	require.True(t, crashed, "the rebuild published the SKU")
	t.Logf("the rebuild, PostgreSQL crashed as it published: %v", err)
	pg.Start()
	b.pool.Reset() // the connections the crash ended

	ledger := ledgerStatuses(t, b.pool, sku)
	redisSt := b.redisStatuses(t, sku, tokens)
	mismatched := 0
	for _, tok := range tokens {
		if ledger[tok] != redisSt[tok] {
			mismatched++
		}
	}
	t.Logf("at the publish the WAL was flushed to %d, the batch's commit at %d; after the crash the ledger has %d of %d holds, %d differ from Redis",
		flushedAtPublish, c.LSN, len(ledger), n, mismatched)
	require.Zero(t, mismatched, "Redis and the ledger disagree on %d of %d holds after the crash", mismatched, n)
	require.GreaterOrEqual(t, flushedAtPublish, c.LSN, "the SKU went live before what it was read from was on disk")
	s := b.requireBalanced(t, sku)
	require.Equal(t, inventory.Stock{SKU: sku, Total: n, Held: n}, inventory.Stock{SKU: s.SKU, Total: s.Total, Held: s.Held, Sold: s.Sold, Available: s.Available})

	// Each restored hold sells once, in Redis and in the ledger.
	for i, tok := range tokens {
		r, err := b.engine.Commit(b.ctx, buyer(1000+i), tok)
		require.NoError(t, err, "commit of restored hold %d", i)
		require.Equal(t, inventory.StatusCommitted, r.Status)
	}
	b.drainOutbox(t)
	for tok, st := range ledgerStatuses(t, b.pool, sku) {
		require.Equal(t, db.StatusCommitted, st, "the ledger's reservation %s", tok)
	}
	require.Equal(t, n, b.count(t, `SELECT count(DISTINCT token)::int FROM sales WHERE sku = $1`, sku), "one sale per hold")
	require.Equal(t, n, b.requireBalanced(t, sku).Sold)
}

// The write-behind still carried reserves read from the outbox before Redis
// lost its data, and the SKU was rebuilt without them; it applies them, as
// a batch committed unflushed, and Redis is then told of the holds the
// ledger has (ReconcileApplied after the batch, or a read of a token Redis
// does not know): they are adopted. PostgreSQL then crashes before the WAL
// writer flushed the batch. No outbox entry is left to apply the reserves
// again, so an adopted hold stays in the ledger only if it was made durable
// before Redis was told of it.
func TestHoldsAdoptedFromTheLedgerSurviveAPostgresCrash(t *testing.T) {
	for _, by := range []string{"reconcile", "read"} {
		t.Run(by, func(t *testing.T) {
			b, pg := unflushedBundle(t)
			const sku, n = "WAL-ADOPT-1", 150
			b.product(t, sku, n, 0)
			b.warmWALWriter(t)

			tokens := b.holdMany(t, sku, 1000, n)
			var inFlight []db.Event
			for _, ev := range b.outboxEvents(t) {
				if ev.SKU == sku {
					inFlight = append(inFlight, ev)
				}
			}
			b.wipe(t)
			require.Zero(t, b.requireBalanced(t, sku).Held, "rebuilt from a ledger without the holds")
			c, err := b.engine.Ledger().ApplyEventsUnflushed(b.ctx, nil, inFlight)
			require.NoError(t, err)
			require.True(t, c.Unflushed, "a batch of %d fresh holds is copied and committed unflushed", len(inFlight))
			require.Less(t, b.walFlushed(t), c.LSN, "the batch is committed and not yet on disk")

			adopted := tokens
			if by == "reconcile" {
				changed, err := b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf(sku), inFlight)
				require.NoError(t, err)
				require.Equal(t, n, changed, "every hold adopted")
			} else {
				adopted = tokens[:1]
				r, err := b.engine.Reservation(b.ctx, buyer(1000), tokens[0])
				require.NoError(t, err)
				require.Equal(t, inventory.StatusHeld, r.Status, "the read adopts the hold")
			}
			flushedAtAdoption := b.walFlushed(t)

			pg.StopImmediate()
			pg.Start()
			b.pool.Reset() // the connections the crash ended

			ledger := ledgerStatuses(t, b.pool, sku)
			redisSt := b.redisStatuses(t, sku, adopted)
			mismatched := 0
			for _, tok := range adopted {
				require.Equal(t, "HELD", redisSt[tok])
				if ledger[tok] != redisSt[tok] {
					mismatched++
				}
			}
			t.Logf("after the adoption the WAL was flushed to %d, the batch's commit at %d; after the crash the ledger has %d of the %d adopted holds",
				flushedAtAdoption, c.LSN, len(adopted)-mismatched, len(adopted))
			require.Zero(t, mismatched, "Redis has %d adopted holds the ledger lost", mismatched)

			for i, tok := range adopted {
				r, err := b.engine.Commit(b.ctx, buyer(1000+i), tok)
				require.NoError(t, err, "commit of adopted hold %d", i)
				require.Equal(t, inventory.StatusCommitted, r.Status)
			}
			b.drainOutbox(t)
			ledger = ledgerStatuses(t, b.pool, sku)
			for _, tok := range adopted {
				require.Equal(t, db.StatusCommitted, ledger[tok], "the ledger's reservation %s", tok)
			}
			require.Equal(t, len(adopted), b.requireBalanced(t, sku).Sold)
		})
	}
}

// A read of a token Redis no longer knows answers from the ledger's row
// without making it durable first when the row is finished (EXPIRED here):
// only a batch of fresh holds is committed unflushed, every row it writes is
// HELD, and the commit that ends a hold is durable and so flushes the WAL
// past the batch that wrote the hold. Here the write-behind's batch of 100
// holds is committed unflushed, their expiries (made by Redis, which then
// lost its data, the outbox with it) are applied after, a read answers
// from the ledger, and PostgreSQL crashes: the ledger must still have what
// the read answered, row by row. With synchronous_commit off for every
// commit the test fails: the crash took back the 100 expiries.
func TestAFinishedReservationAnsweredFromTheLedgerSurvivesAPostgresCrash(t *testing.T) {
	b, pg := unflushedBundle(t)
	const sku, n = "WAL-READ-1", 100 // enough fresh holds for a copied batch
	b.product(t, sku, n, 0)
	b.warmWALWriter(t)

	var last time.Time
	tokens := make([]string, n)
	for i := range n {
		h, err := b.engine.Reserve(b.ctx, buyer(1000+i), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		tokens[i], last = h.Token, h.ExpiresAt
	}
	c := b.applyUnflushed(t, sku)
	require.Less(t, b.walFlushed(t), c.LSN, "the batch is committed and not yet on disk")
	require.Eventually(t, func() bool { return time.Now().After(last.Add(10 * time.Millisecond)) }, 30*time.Second, 10*time.Millisecond)
	expired, err := b.engine.Maintenance().ExpireDue(b.ctx, inventory.PartitionOf(sku), 2*n)
	require.NoError(t, err)
	require.Len(t, expired, n)
	var ends []db.Event
	for _, ev := range b.outboxEvents(t) {
		if ev.SKU == sku && ev.Kind == "expire" {
			ends = append(ends, ev)
		}
	}
	require.Len(t, ends, n)
	b.wipe(t) // Redis restarted empty: the holds and the outbox are gone
	ended, err := b.engine.Ledger().ApplyEventsUnflushed(b.ctx, nil, ends)
	require.NoError(t, err)
	require.False(t, ended.Unflushed, "a batch of endings is committed durably")

	r, err := b.engine.Reservation(b.ctx, buyer(1000), tokens[0])
	require.NoError(t, err)
	require.Equal(t, inventory.StatusExpired, r.Status, "answered from the ledger")
	flushedAtAnswer := b.walFlushed(t)

	pg.StopImmediate()
	pg.Start()
	b.pool.Reset() // the connections the crash ended

	t.Logf("at the answer the WAL was flushed to %d, the holds' batch committed at %d", flushedAtAnswer, c.LSN)
	r, err = b.engine.Reservation(b.ctx, buyer(1000), tokens[0])
	require.NoError(t, err, "the reservation answered before the crash")
	require.Equal(t, inventory.StatusExpired, r.Status)
	ledger := ledgerStatuses(t, b.pool, sku)
	for _, tok := range tokens {
		require.Equal(t, db.StatusExpired, ledger[tok], "the ledger's reservation %s", tok)
	}
	require.GreaterOrEqual(t, flushedAtAnswer, c.LSN, "ending the holds made their batch durable")
}
