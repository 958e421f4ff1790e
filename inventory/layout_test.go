package inventory_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// TestLayoutRecord: the first engine on a prefix records its layout; an
// engine starts beside data of an older layout it reads (and records its
// own) and beside a newer one that says it can run beside this release (and
// leaves the record alone); it refuses, saying why and what to do, a newer
// layout that cannot run beside it and an older one it cannot read, and
// writes nothing then.
func TestLayoutRecord(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := testenv.RedisBackend(t, backend)
		pool := testenv.Postgres(t)
		ctx := context.Background()
		keys := inventory.NewKeys(r.Prefix)
		start := func() error {
			_, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
			return err
		}
		record := func() map[string]string {
			m, err := r.Client.HGetAll(ctx, keys.Layout()).Result()
			require.NoError(t, err)
			return m
		}
		set := func(layout, compat int) {
			require.NoError(t, r.Client.HSet(ctx, keys.Layout(), "layout", layout, "compat", compat).Err())
		}
		own := map[string]string{"layout": strconv.Itoa(inventory.LayoutVersion), "compat": strconv.Itoa(inventory.LayoutCompatible)}

		require.NoError(t, start())
		require.Equal(t, own, record(), "the first engine records its layout")
		require.NoError(t, start(), "a second engine of the same release")
		require.Equal(t, own, record())

		// A newer release that can run beside this one: the record stays.
		set(inventory.LayoutVersion+1, inventory.LayoutVersion)
		require.NoError(t, start())
		require.Equal(t, map[string]string{"layout": strconv.Itoa(inventory.LayoutVersion + 1), "compat": strconv.Itoa(inventory.LayoutVersion)}, record())

		// A newer release that cannot: refused, and the record stays.
		set(inventory.LayoutVersion+2, inventory.LayoutVersion+1)
		err := start()
		require.ErrorIs(t, err, inventory.ErrLayout)
		require.ErrorContains(t, err, "written by a newer Dropline that cannot run beside this one")
		require.ErrorContains(t, err, "Upgrades in docs/operations.md")
		require.Equal(t, strconv.Itoa(inventory.LayoutVersion+2), record()["layout"])

		// An older layout this release reads: recorded as this one's.
		if inventory.LayoutCompatible < inventory.LayoutVersion {
			set(inventory.LayoutCompatible, inventory.LayoutCompatible)
			require.NoError(t, start())
			require.Equal(t, own, record())
		}
		// An older layout it does not read: refused.
		set(inventory.LayoutCompatible-1, inventory.LayoutCompatible-1)
		err = start()
		require.ErrorIs(t, err, inventory.ErrLayout)
		require.ErrorContains(t, err, "upgrade through a release that reads layout")

		// A record that does not parse is named, not guessed at.
		require.NoError(t, r.Client.HSet(ctx, keys.Layout(), "layout", "two").Err())
		require.ErrorContains(t, start(), "is malformed")
	})
}
