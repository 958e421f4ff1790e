package inventory_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/machine"
	"github.com/dropline/dropline/inventory"
)

// BenchmarkReserve measures the reserve path (concurrent reserves of a
// partition go to Redis together, as runs of reserve.lua) on one hot SKU,
// on one hot SKU with each buyer's mutation budget spent in the same run (as
// the server's reserves are), and spread over many SKUs, next to a trivial
// EVALSHA on the same connection pool: the ratio is what our script costs
// over Redis' own round trip. go-cpu-µs/reserve is the CPU time of this
// process (the engine, its Redis client and the benchmark's callers) per
// reserve; Redis' own is not in it.
func BenchmarkReserve(b *testing.B) {
	bb := setup(b, "single", inventory.Config{MaxQuantity: 1})
	const skus = 64
	for i := 0; i < skus; i++ {
		bb.product(b, fmt.Sprintf("BENCH-%d", i), 1_000_000_000, 0)
	}
	var n atomic.Int64
	reserve := func(b *testing.B, req func(i int) inventory.ReserveRequest) {
		b.SetParallelism(25) // 50 callers on 2 cores, as bench-http's wrk -c 50
		cpu := machine.SelfCPU()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := int(n.Add(1))
				if _, err := bb.engine.Reserve(bb.ctx, buyer(i), req(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.ReportMetric(float64((machine.SelfCPU()-cpu).Microseconds())/float64(b.N), "go-cpu-µs/reserve")
	}
	b.Run("hot-sku", func(b *testing.B) {
		reserve(b, func(int) inventory.ReserveRequest { return inventory.ReserveRequest{SKU: "BENCH-0", Quantity: 1} })
	})
	b.Run("hot-sku-budget", func(b *testing.B) {
		reserve(b, func(i int) inventory.ReserveRequest {
			return inventory.ReserveRequest{SKU: "BENCH-0", Quantity: 1, RateLimit: &inventory.RateLimit{
				Key: fmt.Sprintf("%sbudget:%d", bb.prefix, i%3000), Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}}
		})
	})
	b.Run("many-skus", func(b *testing.B) {
		reserve(b, func(i int) inventory.ReserveRequest {
			return inventory.ReserveRequest{SKU: fmt.Sprintf("BENCH-%d", i%skus), Quantity: 1}
		})
	})
	trivial := redis.NewScript(`return 1`)
	require.NoError(b, trivial.Load(bb.ctx, bb.rdb).Err())
	b.Run("trivial-evalsha", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := trivial.EvalSha(bb.ctx, bb.rdb, []string{bb.prefix + "x"}).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
