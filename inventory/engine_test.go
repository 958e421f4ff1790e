package inventory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var admin = inventory.Principal{ID: "admin", Admin: true}

// bundle is what most engine tests need: the engine over this test's own
// Redis prefix and Postgres database.
type bundle struct {
	ctx    context.Context
	engine *inventory.Engine
	rdb    redis.UniversalClient
	pool   *pgxpool.Pool
	prefix string
}

func setup(t testing.TB, backend string, cfg inventory.Config) *bundle {
	t.Helper()
	r := testenv.RedisBackend(t, backend)
	pool := testenv.Postgres(t)
	cfg.KeyPrefix = r.Prefix
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, cfg, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	return &bundle{ctx: ctx, engine: e, rdb: r.Client, pool: pool, prefix: r.Prefix}
}

// product creates a SKU with the given stock and per-user limit (0: none).
func (b *bundle) product(t testing.TB, sku string, stock, maxPerUser int) {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: "Product " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"},
		Stock: stock, MaxPerUser: maxPerUser,
	})
	require.NoError(t, err)
}

func (b *bundle) stock(t testing.TB, sku string) inventory.Stock {
	t.Helper()
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	return s
}

// requireBalanced checks the invariant every test ends on:
// available + held + sold == total, nothing negative, sold never above total,
// and Postgres' sold count agrees with Redis' and with the sales rows.
func (b *bundle) requireBalanced(t *testing.T, sku string) inventory.Stock {
	t.Helper()
	s := b.stock(t, sku)
	require.GreaterOrEqual(t, s.Available, 0)
	require.GreaterOrEqual(t, s.Held, 0)
	require.Equal(t, s.Total, s.Available+s.Held+s.Sold, "available+held+sold must equal total: %+v", s)
	var pgSold, pgTotal, salesUnits int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold, total FROM products WHERE sku = $1`, sku).Scan(&pgSold, &pgTotal))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(quantity), 0) FROM sales WHERE sku = $1`, sku).Scan(&salesUnits))
	require.Equal(t, pgSold, salesUnits, "products.sold must equal the sales rows")
	require.Equal(t, pgSold, s.Sold, "Redis sold must equal Postgres sold")
	require.Equal(t, pgTotal, s.Total)
	require.LessOrEqual(t, pgSold, pgTotal)
	return s
}

func buyer(i int) inventory.Principal { return inventory.Principal{ID: fmt.Sprintf("buyer-%d", i)} }

// forEachBackend runs a test against a single Redis and a Redis Cluster.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

func TestReserveCommitCancelLifecycle(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "TEE-1", 5, 0)
		alice := buyer(1)

		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "TEE-1", Quantity: 2})
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, h.Status)
		require.Equal(t, 2, h.Quantity)
		require.WithinDuration(t, h.CreatedAt.Add(10*time.Minute), h.ExpiresAt, time.Second)
		s := b.requireBalanced(t, "TEE-1")
		require.Equal(t, 3, s.Available)
		require.Equal(t, 2, s.Held)

		c, err := b.engine.Commit(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, c.Status)
		require.NotNil(t, c.CommittedAt)
		s = b.requireBalanced(t, "TEE-1")
		require.Equal(t, 2, s.Sold)
		require.Equal(t, 0, s.Held)

		again, err := b.engine.Commit(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, 2, b.requireBalanced(t, "TEE-1").Sold)

		_, err = b.engine.Cancel(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCommitted)

		h2, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "TEE-1", Quantity: 3})
		require.NoError(t, err)
		require.Equal(t, 0, b.stock(t, "TEE-1").Available)
		cancelled, err := b.engine.Cancel(b.ctx, alice, h2.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCancelled, cancelled.Status)
		require.False(t, cancelled.Replayed)
		twice, err := b.engine.Cancel(b.ctx, alice, h2.Token)
		require.NoError(t, err)
		require.True(t, twice.Replayed)
		s = b.requireBalanced(t, "TEE-1")
		require.Equal(t, 3, s.Available, "cancelling twice restocks once")

		_, err = b.engine.Commit(b.ctx, alice, h2.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)

		got, err := b.engine.Reservation(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, got.Status)
	})
}

// A cluster client that reads the slot map only every minute (go-redis'
// default) would send a promoted replica's commands to its dead master for
// that long: the engine refuses it, and takes one at the bound.
func TestEngineRefusesAClusterClientSlowToFollowAFailover(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	slow := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = slow.Close() })
	_, err := inventory.NewEngine(context.Background(), inventory.Config{}, slow, pool, zerolog.Nop())
	require.ErrorContains(t, err, "reads the slot map every 1m0s")

	env := testenv.RedisCluster(t)
	_, err = inventory.NewEngine(context.Background(), inventory.Config{KeyPrefix: env.Prefix}, env.Client, pool, zerolog.Nop())
	require.NoError(t, err)
}
