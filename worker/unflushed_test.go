package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// unflushedPostgres starts a private PostgreSQL whose WAL writer flushes
// only every 10 s (and the background writer never writes a data page,
// which would flush the WAL before it), so that a batch committed
// unflushed stays so for seconds, and returns a bundle on it.
func unflushedPostgres(t *testing.T) (*bundle, *testenv.PrivatePostgres) {
	t.Helper()
	env := testenv.Redis(t)
	pg := testenv.StartPrivatePostgres(t, "wal_writer_delay=10s", "wal_writer_flush_after=1GB",
		"bgwriter_lru_maxpages=0", "checkpoint_timeout=1h", "max_wal_size=4GB")
	cfg, err := pgxpool.ParseConfig(pg.URL())
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, db.Migrate(context.Background(), pool))
	return newBundle(t, env.Client, env.Prefix, pool, inventory.Config{}), pg
}

// PostgreSQL stops as in a crash (pg_ctl stop -m immediate) while the
// flusher's batches of fresh holds are committed but their WAL is not yet
// flushed. Their events were not acknowledged, so the flusher applies
// again what the crash lost, and the ledger ends with every hold once,
// as Redis has it.
func TestUnflushedBatchesSurviveAPostgresCrash(t *testing.T) {
	b, pg := unflushedPostgres(t)
	const sku = "WAL-CRASH-1"
	b.product(t, sku, 10_000)
	tokens := b.reserveMany(t, sku, 600, time.Hour)
	p := inventory.PartitionOf(sku)

	reg := prometheus.NewRegistry()
	cfg := fastConfig("wal").Flusher
	cfg.Options = fastConfig("wal").Options
	cfg.BatchSize = 200
	f := NewFlusher(cfg, b.engine.Maintenance(), b.rdb, b.log, reg)
	f.initSignals()
	require.NoError(t, f.Start(b.ctx))
	t.Cleanup(func() { stop(t, f) })

	// Every hold is in the ledger (an unflushed commit is visible at once),
	// and the batches whose commits are not on disk are pending.
	held := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE sku = $1`, sku).Scan(&n))
		return n
	}
	eventually(t, 20*time.Second, func() bool { return held() == len(tokens) }, "the batches applied")
	pending, err := b.rdb.XPending(b.ctx, b.engine.Keys().Outbox(p), "dropline").Result()
	require.NoError(t, err)
	require.Positive(t, pending.Count, "batches committed unflushed are not acknowledged")

	pg.StopImmediate()
	pg.Start()
	b.pool.Reset() // the connections the crash ended
	b.waitDrained(t, 60*time.Second, "the flusher applies again what the crash lost", f)

	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct, "every movement once")
	require.Equal(t, len(tokens), byKind["reserve"])
	require.Equal(t, len(tokens), held())
	b.requireLedgerMatchesRedis(t, sku, tokens)
	t.Logf("pending at the crash: %d of %d; acknowledged once durable: %v by a batch, %v by a check",
		pending.Count, len(tokens), testutil.ToFloat64(f.m.durable.WithLabelValues("batch")),
		testutil.ToFloat64(f.m.durable.WithLabelValues("check")))
}

// A batch committed unflushed is acknowledged by the next batch's report
// only when both were committed on the same session. While events keep
// coming (every pass applies a batch), one committed on another connection
// of the pool must still be acknowledged once the WAL writer has flushed
// it, not left pending until ClaimIdle brings it back (15 s by default:
// the lag bench-http's peak showed before the pass checked such batches).
func TestUnflushedBatchesOfAnotherSessionAreAcknowledgedUnderFlow(t *testing.T) {
	b := setup(t)
	const sku = "WAL-SESSIONS-1"
	b.product(t, sku, 1_000_000)
	p := inventory.PartitionOf(sku)

	reg := prometheus.NewRegistry()
	cfg := fastConfig("sessions").Flusher
	cfg.Options = fastConfig("sessions").Options
	// Batches of 100 fresh holds or more are copied, and only those are
	// committed unflushed: 250 ms of this flow is about 200.
	cfg.PollInterval = 250 * time.Millisecond
	cfg.BatchSize = 1000
	cfg.ClaimIdle = time.Minute // nothing is brought back by a claim
	f := NewFlusher(cfg, b.engine.Maintenance(), b.rdb, b.log, reg)
	f.initSignals()
	require.NoError(t, f.Start(b.ctx))
	t.Cleanup(func() { stop(t, f) })

	ctx, cancel := context.WithTimeout(b.ctx, 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	// The flow: 40 holds every 50 ms.
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			b.reserveManyAs(t, sku, fmt.Sprintf("w%d-", i), 40, time.Hour)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	// The pool's connections taken in turn, so that the flusher's batches
	// are committed on more than one session.
	wg.Go(func() {
		for ctx.Err() == nil {
			var conns []*pgxpool.Conn
			for range 3 {
				conn, err := b.pool.Acquire(ctx)
				if err != nil {
					break
				}
				conns = append(conns, conn)
			}
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
			for _, conn := range conns {
				conn.Release()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	// From the third second on, no entry waits 1.5 s for its
	// acknowledgement while the flow goes on.
	time.Sleep(2500 * time.Millisecond)
	var oldest time.Duration
	for ctx.Err() == nil {
		ext, err := b.rdb.XPendingExt(b.ctx, &redis.XPendingExtArgs{
			Stream: b.engine.Keys().Outbox(p), Group: "dropline", Start: "-", End: "+", Count: 1,
			Idle: 1500 * time.Millisecond,
		}).Result()
		require.NoError(t, err)
		if len(ext) > 0 {
			oldest = max(oldest, ext[0].Idle)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	byBatch := testutil.ToFloat64(f.m.durable.WithLabelValues("batch"))
	byCheck := testutil.ToFloat64(f.m.durable.WithLabelValues("check"))
	t.Logf("acknowledged once durable: %v batches by a later batch, %v by a check", byBatch, byCheck)
	require.Positive(t, byBatch+byCheck, "batches were committed unflushed")
	require.Zero(t, oldest, "an entry of a batch committed unflushed stayed pending under the flow")
}
