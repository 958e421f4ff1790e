package inventory_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// TestOldestHoldsAndRebuildMissing covers the two reads the worker group
// makes of Redis through the engine: when each partition's oldest hold is
// due, and whether a SKU must be rebuilt.
func TestOldestHoldsAndRebuildMissing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "OLDEST-1", 10, 0)
		p := inventory.PartitionOf("OLDEST-1")
		empty := (p + 1) % inventory.Partitions
		first, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "OLDEST-1", Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "OLDEST-1", Quantity: 1, HoldFor: time.Hour})
		require.NoError(t, err)

		now, oldest, err := b.engine.Maintenance().OldestHolds(b.ctx, []int{p, empty})
		require.NoError(t, err)
		require.WithinDuration(t, time.Now(), now, time.Minute, "Redis' clock")
		require.Len(t, oldest, 1, "a partition without holds is absent")
		require.WithinDuration(t, first.ExpiresAt, oldest[p], time.Millisecond, "the first hold is due first")

		rebuilt, err := b.engine.Maintenance().RebuildMissing(b.ctx, "OLDEST-1")
		require.NoError(t, err)
		require.False(t, rebuilt, "Redis has the SKU")
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU("OLDEST-1")).Err())
		rebuilt, err = b.engine.Maintenance().RebuildMissing(b.ctx, "OLDEST-1")
		require.NoError(t, err)
		require.True(t, rebuilt)
		require.Equal(t, 10, b.stock(t, "OLDEST-1").Total)
	})
}
