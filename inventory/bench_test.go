package inventory_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// BenchmarkReserve measures the reserve path (one EVALSHA of reserve.lua per
// call) on one hot SKU and spread over many SKUs, next to a trivial EVALSHA on
// the same connection pool: the ratio is what our script costs over Redis'
// own round trip.
func BenchmarkReserve(b *testing.B) {
	bb := setup(b, "single", inventory.Config{MaxQuantity: 1})
	const skus = 64
	for i := 0; i < skus; i++ {
		bb.product(b, fmt.Sprintf("BENCH-%d", i), 1_000_000_000, 0)
	}
	var n atomic.Int64
	b.Run("hot-sku", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)
				if _, err := bb.engine.Reserve(bb.ctx, buyer(int(i)), inventory.ReserveRequest{SKU: "BENCH-0", Quantity: 1}); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("many-skus", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)
				sku := fmt.Sprintf("BENCH-%d", i%skus)
				if _, err := bb.engine.Reserve(bb.ctx, buyer(int(i)), inventory.ReserveRequest{SKU: sku, Quantity: 1}); err != nil {
					b.Fatal(err)
				}
			}
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
