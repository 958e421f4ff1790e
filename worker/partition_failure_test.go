package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// corrupt replaces a key with a string, so every command of the wrong type
// on it fails (WRONGTYPE): a partition whose step fails for good.
func (b *bundle) corrupt(t *testing.T, key string) {
	t.Helper()
	require.NoError(t, b.rdb.Set(b.ctx, key, "corrupt", 0).Err())
}

// counts are a SKU's stock counters, for comparing whole.
type counts struct{ Total, Available, Held, Sold int }

func (b *bundle) counts(t *testing.T, sku string) counts {
	t.Helper()
	s := b.stock(t, sku)
	return counts{Total: s.Total, Available: s.Available, Held: s.Held, Sold: s.Sold}
}

// Partition 0's expiry index and commit index are unreadable, so every sweep
// and reconciliation of partition 0 fails. The other fifteen partitions'
// holds still expire on time and their half-done commits are settled; the
// loops never restart.
func TestOneFailingPartitionDoesNotStopTheSweeperOrTheReconciler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	skus := skusCoveringAllPartitions("FAILP")
	for _, s := range skus {
		b.product(t, s, 10)
	}
	keys := b.engine.Keys()
	b.corrupt(t, keys.Expiry(0))
	b.corrupt(t, keys.Committing(0))

	// In every other partition: one hold that expires in a second, and one
	// commit a crash left COMMITTING (out of the expiry index, no sale).
	expiring, stuck := map[int]string{}, map[int]string{}
	for p := 1; p < inventory.Partitions; p++ {
		who := inventory.Principal{ID: fmt.Sprintf("u%d", p)}
		r, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: skus[p], Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		expiring[p] = r.Token
		r, err = b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: skus[p], Quantity: 1, HoldFor: time.Hour})
		require.NoError(t, err)
		require.NoError(t, b.rdb.HSet(b.ctx, keys.Hold(p, r.Token), "st", "COMMITTING", "cst", "1").Err())
		require.NoError(t, b.rdb.ZRem(b.ctx, keys.Expiry(p), r.Token).Err())
		require.NoError(t, b.rdb.ZAdd(b.ctx, keys.Committing(p), redis.Z{Score: 1, Member: r.Token}).Err())
		stuck[p] = r.Token
	}

	cfg := fastConfig("solo")
	cfg.Reconciler.OlderThan = time.Second // every stuck commit above is older
	g, reg := b.startGroup(t, cfg)
	status := func(p int, tok string) string {
		st, err := b.rdb.HGet(b.ctx, keys.Hold(p, tok), "st").Result()
		require.NoError(t, err)
		return st
	}
	waitTotal(t, "every other partition's hold expired", inventory.Partitions-1, swept(g))
	waitTotal(t, "every other partition's half-done commit is settled", inventory.Partitions-1, settled(g))
	for p := 1; p < inventory.Partitions; p++ {
		require.Equal(t, "EXPIRED", status(p, expiring[p]), "partition %d's hold", p)
		require.Equal(t, "HELD", status(p, stuck[p]), "partition %d's half-done commit went back to HELD", p)
	}
	for p := 1; p < inventory.Partitions; p++ {
		require.Equal(t, counts{Total: 10, Available: 9, Held: 1}, b.counts(t, skus[p]), "partition %d: one unit back, one held", p)
	}
	failures := partitionFailuresVec(reg)
	require.Positive(t, testutil.ToFloat64(failures.WithLabelValues("sweeper")), "partition 0's sweeps fail and are counted")
	require.Positive(t, testutil.ToFloat64(failures.WithLabelValues("reconciler")), "partition 0's reconciliations fail and are counted")
	require.Zero(t, metric(t, reg, "dropline_worker_restarts_total"), "no loop restarted")
	require.Len(t, g.Sweeper.leases.Owned(), inventory.Partitions)
}

// After Redis lost its data, one SKU cannot be rebuilt (its idempotency
// record's key holds a value of the wrong type, so the rebuild script fails
// on it). The rebuilder logs it, rebuilds every other SKU, and keeps trying
// the one that failed.
func TestOneFailingSKUDoesNotStopTheRebuild(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	const n = 20
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("REBUILD-%02d", i)
		b.product(t, skus[i], 5)
	}
	bad := skus[0] // the first in catalogue order
	_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "alice"},
		inventory.ReserveRequest{SKU: bad, Quantity: 1, IdempotencyKey: "alice-1", HoldFor: time.Hour})
	require.NoError(t, err)
	first, _ := b.startGroup(t, fastConfig("first"))
	b.waitDrained(t, 10*time.Second, "the hold reaches Postgres", first.Flusher)
	stop(t, first)

	var idem string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT idempotency_hash FROM reservations WHERE sku = $1`, bad).Scan(&idem))
	require.NoError(t, rdb.FlushAll(b.ctx).Err())
	b.corrupt(t, b.engine.Keys().Idempotency(bad, idem))

	cfg := fastConfig("second")
	cfg.Rebuilder.Interval = 50 * time.Millisecond
	cfg.Rebuilder.Concurrency = 1 // in catalogue order: the failing SKU comes first
	second, reg := b.startGroup(t, cfg)
	rebuilt := map[string]bool{}
	second.Rebuilder.rebuilt.WaitFor(t, 10*time.Second, "every other SKU is rebuilt without being asked for", func(sku string) bool {
		rebuilt[sku] = true
		return len(rebuilt) == len(skus)-1
	})
	require.NotContains(t, rebuilt, bad, "the failing SKU is not rebuilt")
	for _, s := range skus[1:] {
		in, err := rdb.Exists(b.ctx, b.engine.Keys().SKU(s)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), in, "%s is in Redis", s)
	}
	failures := partitionFailuresVec(reg).WithLabelValues("rebuilder")
	waitUntil(t, 10*time.Second, "the failing SKU is tried again", func() bool { return testutil.ToFloat64(failures) >= 2 },
		second.Rebuilder.checked.C())
	present, err := rdb.Exists(b.ctx, b.engine.Keys().SKU(bad)).Result()
	require.NoError(t, err)
	require.Zero(t, present, "the failing SKU is not half-loaded")
	for _, s := range skus[1:] {
		require.Equal(t, counts{Total: 5, Available: 5}, b.counts(t, s), s)
	}
	require.Zero(t, metric(t, reg, "dropline_worker_restarts_total"), "no loop restarted")

	// Once the bad key is gone, the next retry rebuilds the SKU with its hold.
	require.NoError(t, rdb.Del(b.ctx, b.engine.Keys().Idempotency(bad, idem)).Err())
	second.Rebuilder.rebuilt.WaitFor(t, 10*time.Second, "the SKU is rebuilt once it can be", func(sku string) bool { return sku == bad })
	present, err = rdb.Exists(b.ctx, b.engine.Keys().SKU(bad)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), present, "the failing SKU is in Redis once rebuilt")
	require.Equal(t, counts{Total: 5, Available: 4, Held: 1}, b.counts(t, bad))
}
