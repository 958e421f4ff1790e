package worker

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
