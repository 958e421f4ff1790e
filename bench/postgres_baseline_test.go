package bench_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench"
	"github.com/dropline/dropline/internal/testenv"
)

// TestPostgresReserverNeverOversells keeps the baseline honest: a
// comparison with a baseline that oversells would flatter it. 60
// goroutines released together chase 10 units; exactly 10 win.
func TestPostgresReserverNeverOversells(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testenv.NewDatabase(t))
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pg, err := bench.NewPostgresReserver(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, pg.SetStock(ctx, "RACE", 10))

	var won, lost atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := pg.Reserve(ctx, "RACE", fmt.Sprintf("buyer-%d", i), 1, time.Minute)
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, bench.ErrOutOfStock):
				lost.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, 10, won.Load())
	require.EqualValues(t, 50, lost.Load())
	n, err := pg.Available(ctx, "RACE")
	require.NoError(t, err)
	require.Zero(t, n)
	require.ErrorIs(t, pg.Reserve(ctx, "RACE", "late", 1, time.Minute), bench.ErrOutOfStock)
}
