package inventory_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// idemKeys reads what Redis keeps for idempotency under the test's prefix:
// the records and claims, with their TTLs and their MEMORY USAGE in bytes.
type idemKey struct {
	name  string
	ttl   time.Duration
	bytes int64
}

func (b *bundle) idemKeys(t *testing.T) (records, claims []idemKey, others int) {
	t.Helper()
	keys, err := b.rdb.Keys(b.ctx, b.prefix+"*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		kind := &records
		switch {
		case strings.HasSuffix(k, ":idemclaims"):
			continue // one marker per partition of claims, not per key
		case strings.Contains(k, ":idem:"):
		case strings.Contains(k, ":idemclaim:"):
			kind = &claims
		default:
			others++
			continue
		}
		ttl, err := b.rdb.PTTL(b.ctx, k).Result()
		require.NoError(t, err)
		n, err := b.rdb.MemoryUsage(b.ctx, k).Result()
		require.NoError(t, err)
		*kind = append(*kind, idemKey{name: k, ttl: ttl, bytes: n})
	}
	return records, claims, others
}

// The defaults the bound below is stated for (config.DefaultMutationRate and
// DefaultMutationBurst, inventory's RejectionTTL).
const (
	defaultMutationRate  = 10
	defaultMutationBurst = 20
	defaultRejectionTTL  = 5 * time.Minute
)

// usedMemory is the server's used_memory: what Redis really spends, per-key
// overhead (expiry entries, dictionary slots) included.
func (b *bundle) usedMemory(t *testing.T) int64 {
	t.Helper()
	info, err := b.rdb.InfoMap(b.ctx, "memory").Result()
	require.NoError(t, err)
	n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	require.NoError(t, err)
	return n
}

func TestRejectedReservesKeepBoundedMemory(t *testing.T) {
	t.Parallel()
	// A private server: its used_memory is this test's alone.
	srv := testenv.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	pool := testenv.Postgres(t)
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, inventory.Config{}, client, pool, zerolog.Nop())
	require.NoError(t, err)
	b := &bundle{ctx: ctx, engine: e, rdb: client, pool: pool, prefix: "dl:"}
	b.product(t, "MEM-1", 0, 0)
	_, _, baseline := b.idemKeys(t)
	usedBefore := b.usedMemory(t)

	// One principal gets refused N times, each time with a fresh key.
	const n = 1000
	attacker := inventory.Principal{ID: "attacker-with-a-long-principal-id-0123456789"}
	for i := range n {
		_, err := b.engine.Reserve(b.ctx, attacker, inventory.ReserveRequest{
			SKU: "MEM-1", Quantity: 1, IdempotencyKey: fmt.Sprintf("fresh-key-%06d-%s", i, strings.Repeat("k", 100)),
		})
		require.ErrorIs(t, err, inventory.ErrOutOfStock)
	}
	used := b.usedMemory(t) - usedBefore
	records, claims, others := b.idemKeys(t)
	require.Len(t, records, n, "one record per rejected key")
	require.Len(t, claims, n, "one claim per rejected key")
	require.Equal(t, baseline, others, "rejections keep nothing else")
	var total int64
	for _, k := range append(records, claims...) {
		require.Positive(t, k.ttl, "%s must expire", k.name)
		require.LessOrEqual(t, k.ttl, defaultRejectionTTL, "%s lives %s: a rejection must not be kept for the idempotency TTL of a hold", k.name, k.ttl)
		total += k.bytes
	}
	perRejection, usedPerRejection := total/n, used/n
	require.LessOrEqual(t, perRejection, int64(400), "a rejection's record and claim must stay compact")
	require.LessOrEqual(t, usedPerRejection, int64(640), "with Redis' own overhead too")
	window := int64(defaultMutationRate*defaultRejectionTTL.Seconds() + defaultMutationBurst)
	bound := window * max(perRejection, usedPerRejection)
	t.Logf("%d rejections: %d keys, %d bytes by MEMORY USAGE (%d per rejection), used_memory +%d bytes (%d per rejection); "+
		"at %d mutations/s (burst %d) kept %s: at most %d rejections = %.2f MB per principal",
		n, len(records)+len(claims), total, perRejection, used, usedPerRejection,
		defaultMutationRate, defaultMutationBurst, defaultRejectionTTL, window, float64(bound)/1e6)
	require.Less(t, bound, int64(2_000_000), "one principal must not be able to pin more than 2 MB by being refused")

	// Within the window the same key replays the same rejection, even once
	// stock is back.
	again := inventory.ReserveRequest{SKU: "MEM-1", Quantity: 1, IdempotencyKey: fmt.Sprintf("fresh-key-%06d-%s", 7, strings.Repeat("k", 100))}
	_, err = b.engine.Restock(b.ctx, admin, "MEM-1", 5, "back-in-stock")
	require.NoError(t, err)
	_, err = b.engine.Reserve(b.ctx, attacker, again)
	var oos *inventory.OutOfStockError
	require.ErrorAs(t, err, &oos)
	require.Zero(t, oos.Available, "the first outcome is replayed")

	// A key that got a hold replays it for the whole idempotency TTL: its
	// record and its claim live 24 hours.
	alice := buyer(1)
	h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MEM-1", Quantity: 2, IdempotencyKey: "alice-cart"})
	require.NoError(t, err)
	records, claims, _ = b.idemKeys(t)
	long := 0
	for _, k := range append(records, claims...) {
		if k.ttl > 23*time.Hour {
			long++
		}
	}
	require.Equal(t, 2, long, "the hold's record and claim live 24 h, nothing else does")
	replay, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MEM-1", Quantity: 2, IdempotencyKey: "alice-cart"})
	require.NoError(t, err)
	require.Equal(t, h.Token, replay.Token)
	_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MEM-2", Quantity: 2, IdempotencyKey: "alice-cart"})
	require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "the claim still pins the key to its SKU")
	s := b.requireBalanced(t, "MEM-1")
	require.Equal(t, 2, s.Held)
}
