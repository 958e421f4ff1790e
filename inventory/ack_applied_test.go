package inventory_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// AckApplied acknowledges an applied batch in one step only when no SKU of
// it was rebuilt since its events were written (the SKU's generation is the
// one they carry, or the SKU is gone and will be rebuilt from the ledger);
// otherwise it acknowledges nothing, so the write-behind reconciles first.
func TestAckAppliedOnlyWhenNoSKUWasRebuilt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "ACK-1"
		b.product(t, sku, 100, 0)
		p := inventory.PartitionOf(sku)
		keys := b.engine.Keys()
		out := b.engine.Maintenance().Outbox("acks", "c1")
		read := func(n int) ([]db.Event, []string) {
			t.Helper()
			for i := range n {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Hour})
				require.NoError(t, err)
			}
			entries, err := out.Read(b.ctx, p, 100)
			require.NoError(t, err)
			require.Len(t, entries, n)
			evs, ids := make([]db.Event, n), make([]string, n)
			for i, e := range entries {
				require.NoError(t, e.Err)
				require.NotEmpty(t, e.Event.Gen, "a reserve event carries its SKU's generation")
				evs[i], ids[i] = e.Event, e.ID
			}
			return evs, ids
		}
		pending := func() int64 {
			t.Helper()
			s, err := b.rdb.XPending(b.ctx, keys.Outbox(p), "acks").Result()
			require.NoError(t, err)
			return s.Count
		}

		evs, ids := read(3)
		acked, err := out.AckApplied(b.ctx, p, evs, ids)
		require.NoError(t, err)
		require.True(t, acked)
		require.Zero(t, pending(), "entries pending after an acknowledgement")

		evs, ids = read(2)
		require.NoError(t, b.rdb.HSet(b.ctx, keys.SKU(sku), "gen", "a-later-life").Err())
		acked, err = out.AckApplied(b.ctx, p, evs, ids)
		require.NoError(t, err)
		require.False(t, acked, "acknowledged although the SKU was rebuilt")
		require.EqualValues(t, 2, pending(), "entries pending while the SKU's holds are not reconciled")

		require.NoError(t, b.rdb.Del(b.ctx, keys.SKU(sku)).Err())
		acked, err = out.AckApplied(b.ctx, p, evs, ids)
		require.NoError(t, err)
		require.True(t, acked, "a SKU Redis lost is rebuilt from the ledger, which has the batch")
		require.Zero(t, pending())

		// A group Redis lost has nothing left to acknowledge.
		require.NoError(t, b.rdb.XGroupDestroy(b.ctx, keys.Outbox(p), "acks").Err())
		acked, err = out.AckApplied(b.ctx, p, evs, ids)
		require.NoError(t, err)
		require.True(t, acked)
	})
}
