package inventory_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// reserve.lua runs as a Redis function (FCALL), loaded with the engine's
// scripts. A Redis that lost it (a new server, FUNCTION FLUSH) gets it again:
// a reserve that finds no function loads the functions and calls again, and
// so does the readiness check.
func TestReserveRunsAsAFunctionLoadedAgainWhenLost(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, inventory.Config{}, rdb, testenv.Postgres(t), zerolog.Nop())
	require.NoError(t, err)
	_, err = e.Catalog().CreateProduct(ctx, admin, inventory.ProductInput{SKU: "FN-1", Name: "f", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 5})
	require.NoError(t, err)
	libraries := func() int {
		libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "dropline_reserve_*"}).Result()
		require.NoError(t, err)
		return len(libs)
	}
	fcalls := func() string {
		info, err := rdb.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_fcall:") {
				return strings.SplitN(strings.TrimPrefix(line, "cmdstat_fcall:"), ",", 2)[0]
			}
		}
		return ""
	}
	require.Equal(t, 1, libraries())

	_, err = e.Reserve(ctx, buyer(1), inventory.ReserveRequest{SKU: "FN-1", Quantity: 1})
	require.NoError(t, err)
	require.Equal(t, "calls=1", fcalls(), "the reserve was one FCALL")

	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	r, err := e.Reserve(ctx, buyer(2), inventory.ReserveRequest{SKU: "FN-1", Quantity: 1})
	require.NoError(t, err)
	require.Equal(t, inventory.StatusHeld, r.Status)
	require.Equal(t, 1, libraries(), "the reserve loaded the function again")
	require.Equal(t, "calls=3", fcalls(), "refused once, then run")

	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	require.NoError(t, e.Ping(ctx))
	require.Equal(t, 1, libraries(), "readiness loaded the function again")

	s, err := e.Catalog().Stock(ctx, "FN-1")
	require.NoError(t, err)
	require.Equal(t, 2, s.Held)
}
