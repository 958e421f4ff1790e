package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// A product update and a restock commit in Postgres while Redis is down, so
// their Redis step fails. Redis comes back with its data (AOF), still at the
// old version: the reconciler brings it up to Postgres within a pass, without
// waiting for the next write of the product.
func TestProductChangesMissedByRedisConverge(t *testing.T) {
	testenv.Quiet(t)
	srv := testenv.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	const sku = "CONVERGE-1"
	b.product(t, sku, 10)
	alice := inventory.Principal{ID: "alice"}
	_, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 3})
	require.NoError(t, err)

	// Redis goes away between the Postgres write and the Redis step.
	srv.Stop()
	limit := 4
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	_, err = b.engine.Catalog().UpdateProduct(ctx, admin, sku, inventory.ProductUpdate{MaxPerUser: &limit})
	require.ErrorIs(t, err, inventory.ErrUnavailable)
	_, err = b.engine.Catalog().Restock(ctx, admin, sku, 5, "po-77")
	require.ErrorIs(t, err, inventory.ErrUnavailable)
	cancel()
	var pgTotal, pgVersion int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT total, version FROM products WHERE sku = $1`, sku).Scan(&pgTotal, &pgVersion))
	require.Equal(t, int64(15), pgTotal, "both changes are durable in Postgres")
	require.Equal(t, int64(3), pgVersion)

	// Redis is back with what it had: the old version.
	require.NoError(t, srv.Start())
	skuKey := b.engine.Keys().SKU(sku)
	before, err := rdb.HMGet(b.ctx, skuKey, "ver", "total", "max", "avail", "held").Result()
	require.NoError(t, err)
	require.Equal(t, []any{"1", "10", "0", "7", "3"}, before, "Redis kept its data and missed both changes")

	// The reconciler re-applies them; Redis announces the new stock.
	sub := rdb.SSubscribe(b.ctx, b.engine.Keys().Channel(sku))
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Receive(b.ctx)
	require.NoError(t, err)
	const interval = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	opts := fastConfig("converge").Options
	w := NewCommitReconciler(CommitReconcilerConfig{Options: opts, Interval: interval}, b.engine.Maintenance(), rdb, b.log, reg)
	began := time.Now()
	require.NoError(t, w.Start(b.ctx))
	t.Cleanup(func() { stop(t, w) })
	// Bound: the lease is taken at the first check, then one pass.
	bound := opts.LeaseCheck + 2*interval + time.Second
	wait, cancelWait := context.WithTimeout(b.ctx, bound)
	defer cancelWait()
	var announced struct{ Total, Available, Held int }
	for announced.Total != 15 {
		msg, err := sub.ReceiveMessage(wait)
		require.NoError(t, err, "Redis did not converge within %s", bound)
		require.NoError(t, json.Unmarshal([]byte(msg.Payload), &announced))
	}
	t.Logf("Redis converged %s after the reconciler started (bound %s)", time.Since(began).Round(time.Millisecond), bound)
	// Redis announces the change from inside the pass, before the pass
	// marks the product in Postgres and counts it: wait for the pass to end.
	eventually(t, 10*time.Second, func() bool { return metric(t, reg, "dropline_products_reapplied_total") > 0 },
		"the reconciler's pass counted its re-apply")
	after, err := rdb.HMGet(b.ctx, skuKey, "ver", "total", "max", "avail", "held").Result()
	require.NoError(t, err)
	require.Equal(t, []any{"3", "15", "4", "12", "3"}, after)
	require.Equal(t, 12, announced.Available)

	// The new limit holds on the reserve path: alice has 3, may take 1 more.
	_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 2})
	var quota *inventory.QuotaExceededError
	require.ErrorAs(t, err, &quota)
	require.Equal(t, 4, quota.Limit)
	_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)
	s := b.stock(t, sku)
	require.Equal(t, 15, s.Total)
	require.Equal(t, s.Total, s.Available+s.Held+s.Sold)
	require.Equal(t, 4, s.Held)

	// A second pass finds nothing to do: the change is marked as applied.
	var redisVersion int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT redis_version FROM products WHERE sku = $1`, sku).Scan(&redisVersion))
	require.Equal(t, pgVersion, redisVersion)
	n, err := b.engine.Maintenance().ReapplyProducts(b.ctx, inventory.PartitionOf(sku), 100)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1.0, metric(t, reg, "dropline_products_reapplied_total"))
}
