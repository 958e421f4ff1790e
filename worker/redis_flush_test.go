package worker

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// Redis loses everything (FLUSHALL on a server the test owns) in the middle
// of a sale. Stock is rebuilt from Postgres, no unit is sold twice, and every
// sale a buyer was told about is in the ledger.
func TestRedisFlushedMidSale(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	const sku, side, total = "FLUSH-1", "SIDE-1", 100
	b.product(t, sku, total)
	b.product(t, side, 7) // nobody touches it after the flush: only the rebuilder reloads it
	g, reg := b.startGroup(t, fastConfig("flushed"))
	k := newKeys(b.engine.Keys())
	g.Rebuilder.checked.Wait(t, 5*time.Second)
	epochs, err := rdb.Exists(b.ctx, k.epoch(0), k.epoch(inventory.Partitions-1)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), epochs, "the rebuilder's first check set its epochs")

	var (
		mu        sync.Mutex
		committed []string
		commitErr = map[inventory.Code]int{}
		flushed   atomic.Bool
		attempts  atomic.Int64
	)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				who := inventory.Principal{ID: itoa(w*1000 + i)}
				r, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
				attempts.Add(1)
				if errors.Is(err, inventory.ErrOutOfStock) {
					return
				}
				if err != nil {
					t.Errorf("reserve: %v", err)
					return
				}
				_, err = b.engine.Commit(b.ctx, who, r.Token)
				mu.Lock()
				if err == nil {
					committed = append(committed, r.Token)
					if len(committed) == 30 && flushed.CompareAndSwap(false, true) {
						if err := rdb.FlushAll(b.ctx).Err(); err != nil {
							t.Errorf("FLUSHALL: %v", err) // reported, not FailNow: this is not the test goroutine
						} else {
							t.Log("FLUSHALL after 30 sales")
						}
					}
				} else {
					commitErr[inventory.ErrorCode(err)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.True(t, flushed.Load())

	g.Rebuilder.rebuilt.WaitFor(t, 10*time.Second, "the rebuilder reloads the untouched SKU", func(sku string) bool { return sku == side })
	n, err := rdb.Exists(b.ctx, b.engine.Keys().SKU(side)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the untouched SKU is back in Redis")
	require.GreaterOrEqual(t, metric(t, reg, "dropline_rebuilds_total"), 1.0)
	require.GreaterOrEqual(t, metric(t, reg, "dropline_redis_data_losses_total"), 1.0)
	require.Equal(t, 7, b.stock(t, side).Available)
	b.waitDrained(t, 20*time.Second, "the flusher drains the recreated streams", g.Flusher)

	var sold, sales, salesUnits, distinctTokens int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold FROM products WHERE sku = $1`, sku).Scan(&sold))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), coalesce(sum(quantity), 0), count(DISTINCT token) FROM sales WHERE sku = $1`, sku).
		Scan(&sales, &salesUnits, &distinctTokens))
	t.Logf("%d attempts, %d sales told to buyers, commit errors %v; ledger: sold %d of %d in %d sales",
		attempts.Load(), len(committed), commitErr, sold, total, sales)
	require.LessOrEqual(t, sold, total, "oversold")
	require.Equal(t, sold, salesUnits, "products.sold matches the sales")
	require.Equal(t, sales, distinctTokens)
	for _, tok := range committed {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sales WHERE token = $1`, tok).Scan(&n))
		require.Equal(t, 1, n, "a sale the buyer was told about is missing: %s", tok)
	}
	require.Equal(t, len(committed), sales, "every ledger sale was answered as a success")
	s := b.stock(t, sku)
	require.Equal(t, sold, s.Sold)
	require.Equal(t, total, s.Available+s.Held+s.Sold)
	total2, distinct, _ := b.movements(t)
	require.Equal(t, total2, distinct)
}
