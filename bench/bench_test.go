package bench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench"
	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// The raw-script contender needs reserve.lua itself. Package lua is meant
// for inventory/ alone (its doc says so); a benchmark measuring the bare script is the one
// reader outside it, and it never runs in the product.

// BenchmarkReserveOverhead: reserve through GraphQL over HTTP (auth, the
// gqlgen pipeline, JSON, loopback TCP), through the engine in-process, and
// the bare reserve.lua by EVALSHA with the same keys and arguments; plus a
// script that only returns, for Redis' own round trip.
func BenchmarkReserveOverhead(b *testing.B) {
	f := setup(b)
	f.product(b, "OVH-HOT")
	r := newResults()

	src, err := lua.Source(lua.Reserve)
	require.NoError(b, err)
	reserve := redis.NewScript(src)
	require.NoError(b, reserve.Load(f.ctx, f.rdb).Err())
	trivial := redis.NewScript(`return 1`)
	require.NoError(b, trivial.Load(f.ctx, f.rdb).Err())
	keys := f.engine.Keys()
	p := inventory.PartitionOf("OVH-HOT")
	run := time.Now().UnixNano()

	b.Run("graphql-http", func(b *testing.B) {
		r.measure(b, "graphql-http", func(i int64) error { return f.graphqlReserve(i, "OVH-HOT") })
	})
	b.Run("engine", func(b *testing.B) {
		r.measure(b, "engine (in-process)", func(i int64) error { return f.engineReserve(i, "OVH-HOT") })
	})
	b.Run("evalsha-reserve", func(b *testing.B) {
		run++
		r.measure(b, "evalsha reserve.lua", func(i int64) error {
			tok, who := tokenFor(p, run, i), fmt.Sprintf("buyer-%d", i%1000)
			c := script.Reserve{Partition: p, IdempotencyTTL: 86400, MaxQuantity: 100, MaxHoldMs: 3_600_000, RejectionTTL: 300,
				Requests: []script.ReserveRequest{{SKU: "OVH-HOT", Principal: who, Quantity: 1, HoldMs: 600_000, Token: tok,
					Budget: [3]any{"", "", ""}}}}.Call(keys)
			res, err := reserve.EvalSha(f.ctx, f.rdb, c.Keys, c.Argv...).Slice()
			if err != nil {
				return err
			}
			if replies, err := script.ReserveRepliesOf(res, 1); err != nil || replies[0].Code != "HELD" {
				return fmt.Errorf("reserve.lua answered %v", res)
			}
			return nil
		})
	})
	b.Run("evalsha-trivial", func(b *testing.B) {
		r.measure(b, "evalsha return 1", func(int64) error {
			return trivial.EvalSha(f.ctx, f.rdb, []string{keys.Base(p) + "x"}).Err()
		})
	})
	r.table("reserve: what the server costs on top of Redis", "evalsha reserve.lua",
		"graphql-http", "engine (in-process)", "evalsha reserve.lua", "evalsha return 1")
}

// BenchmarkVsPostgres: Dropline against the PostgreSQL-only reservation
// path on one hot SKU, same concurrency, one unit per operation.
func BenchmarkVsPostgres(b *testing.B) {
	f := setup(b)
	f.product(b, "VS-HOT")
	// A pool a little below the goroutine count, as such a service would
	// be sized; more connections only queue on the one row lock.
	pool := dbPool(b, f.dbURL, Concurrency/2)
	pg, err := bench.NewPostgresReserver(f.ctx, pool)
	require.NoError(b, err)
	require.NoError(b, pg.SetStock(f.ctx, "PG-HOT", benchStock))
	r := newResults()

	b.Run("dropline-graphql", func(b *testing.B) {
		r.measure(b, "dropline graphql-http", func(i int64) error { return f.graphqlReserve(i, "VS-HOT") })
	})
	b.Run("dropline-engine", func(b *testing.B) {
		r.measure(b, "dropline engine", func(i int64) error { return f.engineReserve(i, "VS-HOT") })
	})
	b.Run("postgres-tx", func(b *testing.B) {
		r.measure(b, "postgres UPDATE+INSERT tx", func(i int64) error {
			return pg.Reserve(f.ctx, "PG-HOT", fmt.Sprintf("buyer-%d", i%1000), 1, 10*time.Minute)
		})
	})
	r.table("one hot SKU: Dropline vs a PostgreSQL-only reservation path", "postgres UPDATE+INSERT tx",
		"dropline graphql-http", "dropline engine", "postgres UPDATE+INSERT tx")
}

// BenchmarkWriteBehind: the ledger's batched apply (db.Ledger.ApplyEvents,
// what the flusher calls) against the rate at which the reserve path emits
// events (one per reserve). Above 1 the ledger keeps up with a sustained
// peak; below, the outbox grows during the peak and drains after it.
func BenchmarkWriteBehind(b *testing.B) {
	f := setup(b)
	f.product(b, "WB-HOT")
	r := newResults()
	b.Run("reserve-events", func(b *testing.B) {
		r.measure(b, "reserve path (events/s)", func(i int64) error { return f.engineReserve(i, "WB-HOT") })
	})
	waitForLedger(b, f, "WB-HOT")

	ledger := f.engine.Ledger()
	p := inventory.PartitionOf("WB-HOT")
	for _, size := range []int{500, 50} {
		name := fmt.Sprintf("apply batches of %d", size)
		b.Run(fmt.Sprintf("apply-batch-%d", size), func(b *testing.B) {
			run := time.Now().UnixNano()
			var lat []time.Duration
			b.ResetTimer()
			start := time.Now()
			for n := 0; n < b.N; n++ {
				events := make([]db.Event, size)
				now := time.Now().UTC()
				for i := range events {
					tok := tokenFor(p, run, int64(n*size+i))
					events[i] = db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "WB-HOT",
						Principal: fmt.Sprintf("buyer-%d", i%1000), Quantity: 1,
						ExpiresAt: now.Add(10 * time.Minute), CreatedAt: now, At: now}
				}
				t0 := time.Now()
				require.NoError(b, ledger.ApplyEvents(f.ctx, nil, events))
				lat = append(lat, time.Since(t0))
			}
			elapsed := time.Since(start)
			b.StopTimer()
			m := summarise(lat, b.N*size, elapsed)
			b.ReportMetric(m.PerSecond, "events/s")
			b.ReportMetric(float64(m.P99)/1e6, "p99-batch-ms")
			r.record(name, m)
		})
	}
	r.tableOf("write-behind: ledger apply rate vs reserve event rate (apply latencies are per batch)",
		"reserve path (events/s)", false, "reserve path (events/s)", "apply batches of 500", "apply batches of 50")
}

// BenchmarkHotVsMany: the same load on one SKU (one Redis key, so its
// scripts run one after the other) and spread over 64 SKUs in all 16
// partitions.
func BenchmarkHotVsMany(b *testing.B) {
	f := setup(b)
	const n = 64
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("SPREAD-%d", i)
	}
	f.product(b, skus...)
	r := newResults()
	b.Run("engine-hot", func(b *testing.B) {
		r.measure(b, "engine, 1 SKU", func(i int64) error { return f.engineReserve(i, skus[0]) })
	})
	b.Run("engine-many", func(b *testing.B) {
		r.measure(b, "engine, 64 SKUs", func(i int64) error { return f.engineReserve(i, skus[i%n]) })
	})
	b.Run("graphql-hot", func(b *testing.B) {
		r.measure(b, "graphql-http, 1 SKU", func(i int64) error { return f.graphqlReserve(i, skus[0]) })
	})
	b.Run("graphql-many", func(b *testing.B) {
		r.measure(b, "graphql-http, 64 SKUs", func(i int64) error { return f.graphqlReserve(i, skus[i%n]) })
	})
	r.table("one hot SKU vs 64 SKUs", "engine, 1 SKU",
		"engine, 1 SKU", "engine, 64 SKUs", "graphql-http, 1 SKU", "graphql-http, 64 SKUs")
}

// waitForLedger waits until the flusher has carried every hold of sku into
// Postgres, so the apply benchmark does not race the real flusher.
func waitForLedger(b *testing.B, f *fixture, sku string) {
	b.Helper()
	pool := f.app.Postgres()
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	for {
		stock, err := f.engine.Catalog().Stock(ctx, sku)
		require.NoError(b, err)
		var n int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE sku = $1`, sku).Scan(&n))
		if n >= stock.Held {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("the ledger has %d of %d holds after 60s", n, stock.Held)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
