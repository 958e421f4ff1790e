package inventory_test

import (
	"context"
	"errors"
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
	defaultMutationBurst = 50
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
	_, err = b.engine.Catalog().Restock(b.ctx, admin, "MEM-1", 5, "back-in-stock")
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

// memKey is one key's MEMORY USAGE in bytes and its TTL (-1: none).
type memKey struct {
	bytes int64
	ttl   time.Duration
}

// snapshot reads every key under the test's prefix but the outbox streams,
// which the write-behind trims once it has applied their events.
func (b *bundle) snapshot(t *testing.T) map[string]memKey {
	t.Helper()
	keys, err := b.rdb.Keys(b.ctx, b.prefix+"*").Result()
	require.NoError(t, err)
	out := map[string]memKey{}
	for _, k := range keys {
		if strings.Contains(k, ":outbox") {
			continue
		}
		n, err := b.rdb.MemoryUsage(b.ctx, k).Result()
		require.NoError(t, err)
		ttl, err := b.rdb.PTTL(b.ctx, k).Result()
		require.NoError(t, err)
		out[k] = memKey{bytes: n, ttl: ttl}
	}
	return out
}

// trimOutboxes empties every partition's outbox, as the write-behind does
// once the ledger has the events.
func (b *bundle) trimOutboxes(t *testing.T) {
	t.Helper()
	for p := range inventory.Partitions {
		require.NoError(t, b.rdb.XTrimMaxLen(b.ctx, b.engine.Keys().Outbox(p), 0).Err())
	}
}

// footprint is what one kind of mutation, repeated, made Redis keep.
type footprint struct {
	name  string
	n     int
	units float64 // budget units spent, in all
	bytes int64   // MEMORY USAGE of the keys added or grown
	used  int64   // used_memory, Redis' own overhead included
	// ttls of the keys it added (-1 for a hold still held, which gets its
	// TTL when it ends).
	ttls []time.Duration
}

func (f footprint) perUnit() int64 { return int64(float64(max(f.bytes, f.used)) / f.units) }

// keptPerUnit is what its keys hold per unit, by MEMORY USAGE alone.
func (f footprint) keptPerUnit() int64 { return int64(float64(f.bytes) / f.units) }

// TestMemoryPerPrincipalIsBounded measures what each kind of mutation makes
// Redis keep, per unit of its principal's mutation budget it spends, and
// from it the most one principal can make Redis keep at the default budget:
// holds (of reserves and carts) for up to MaxHold + Retention, refusals for
// RejectionTTL. A cart spends a unit per line, so a 50-line cart costs
// about what 50 reserves do, not one; a refused cart keeps its record and
// its let-go lines only as long as a refused reserve keeps its own.
func TestMemoryPerPrincipalIsBounded(t *testing.T) {
	t.Parallel()
	// A private server: its used_memory is this test's alone.
	srv := testenv.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	pool := testenv.Postgres(t)
	ctx := context.Background()
	// A refusal is kept a minute here, not the default 5, so that a refused
	// cart's keys can be seen to keep to it.
	const rejectionTTL = time.Minute
	cfg := inventory.Config{RejectionTTL: rejectionTTL}
	e, err := inventory.NewEngine(ctx, cfg, client, pool, zerolog.Nop())
	require.NoError(t, err)
	b := &bundle{ctx: ctx, engine: e, rdb: client, pool: pool, prefix: "dl:"}

	const lines = inventory.MaxCartLines
	b.product(t, "MEM-HELD", 1000, 0)
	b.product(t, "MEM-NONE", 0, 0)
	var skus []string
	for i := range lines {
		skus = append(skus, fmt.Sprintf("MEM-CART-%02d", i))
		b.product(t, skus[i], 40, 0)
	}
	attacker := inventory.Principal{ID: "attacker-with-a-long-principal-id-0123456789"}
	// A budget of a unit an hour and a burst nothing reaches: the arrival
	// time it keeps (in microseconds), in hours, counts the units spent.
	budget := &inventory.RateLimit{Key: "rate:dl:budget:" + attacker.ID, Rate: 1, Period: time.Hour, Burst: 1_000_000}
	spent := func() float64 {
		v, err := client.Get(ctx, budget.Key).Float64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v / float64(time.Hour/time.Microsecond)
	}
	require.NoError(t, e.SpendRateLimit(ctx, *budget)) // from now on the key exists
	key := func(kind string, i int) string { return fmt.Sprintf("%s-%06d-%s", kind, i, strings.Repeat("k", 100)) }
	cartOf := func(n int, last string) []inventory.CartLine {
		out := make([]inventory.CartLine, n)
		for i := range out {
			out[i] = inventory.CartLine{SKU: skus[i], Quantity: 1}
		}
		if last != "" {
			out[n-1].SKU = last
		}
		return out
	}
	measure := func(name string, n int, do func(i int) error) footprint {
		b.trimOutboxes(t)
		before, usedBefore, unitsBefore := b.snapshot(t), b.usedMemory(t), spent()
		for i := range n {
			require.NoError(t, do(i), "%s %d", name, i)
		}
		b.trimOutboxes(t)
		f := footprint{name: name, n: n, units: spent() - unitsBefore, used: b.usedMemory(t) - usedBefore}
		for k, m := range b.snapshot(t) {
			old, seen := before[k]
			f.bytes += m.bytes - old.bytes
			if !seen {
				f.ttls = append(f.ttls, m.ttl)
			}
		}
		return f
	}
	refused := func(err error) error {
		if errors.Is(err, inventory.ErrOutOfStock) {
			return nil
		}
		return fmt.Errorf("want a refusal, got %w", err)
	}

	held := []footprint{
		measure("reserve with a key", 300, func(i int) error {
			_, err := e.Reserve(ctx, attacker, inventory.ReserveRequest{SKU: "MEM-HELD", Quantity: 1, IdempotencyKey: key("r", i), RateLimit: budget})
			return err
		}),
		measure("1-line cart with a key", 300, func(i int) error {
			_, err := e.Carts().ReserveCart(ctx, attacker, inventory.CartRequest{Lines: []inventory.CartLine{{SKU: "MEM-HELD", Quantity: 1}},
				IdempotencyKey: key("c1", i), RateLimit: budget})
			return err
		}),
		measure("50-line cart with a key", 20, func(i int) error {
			_, err := e.Carts().ReserveCart(ctx, attacker, inventory.CartRequest{Lines: cartOf(lines, ""), IdempotencyKey: key("c50", i), RateLimit: budget})
			return err
		}),
	}
	refusals := []footprint{
		measure("refused reserve with a key", 300, func(i int) error {
			_, err := e.Reserve(ctx, attacker, inventory.ReserveRequest{SKU: "MEM-NONE", Quantity: 1, IdempotencyKey: key("rr", i), RateLimit: budget})
			return refused(err)
		}),
		measure("refused 1-line cart with a key", 300, func(i int) error {
			_, err := e.Carts().ReserveCart(ctx, attacker, inventory.CartRequest{Lines: cartOf(1, "MEM-NONE"), IdempotencyKey: key("rc1", i), RateLimit: budget})
			return refused(err)
		}),
		// 49 lines held, then let go, because the 50th cannot be had.
		measure("refused 50-line cart with a key", 20, func(i int) error {
			_, err := e.Carts().ReserveCart(ctx, attacker, inventory.CartRequest{Lines: cartOf(lines, "MEM-NONE"), IdempotencyKey: key("rc50", i), RateLimit: budget})
			return refused(err)
		}),
	}

	// The default budget, and how long each kind is kept at most.
	const (
		rate      = defaultMutationRate
		burst     = defaultMutationBurst
		heldLife  = inventory.DefaultMaxHold + inventory.DefaultRetention
		refusLife = defaultRejectionTTL
	)
	var heldPer, refusedPer int64
	for _, f := range held {
		heldPer = max(heldPer, f.perUnit())
	}
	for _, f := range refusals {
		refusedPer = max(refusedPer, f.perUnit())
	}
	heldBound := int64(rate*heldLife.Seconds()+burst) * heldPer
	refusedBound := int64(rate*refusLife.Seconds()+burst) * refusedPer
	for _, f := range append(held, refusals...) {
		t.Logf("%-32s x%-3d %5.0f units: %8d bytes by MEMORY USAGE, used_memory %+9d: %5d bytes per unit (%d by MEMORY USAGE), %d keys added",
			f.name, f.n, f.units, f.bytes, f.used, f.perUnit(), f.keptPerUnit(), len(f.ttls))
	}
	t.Logf("at %d mutations/s, burst %d: holds kept up to %s, at most %d bytes per unit: %.2f GB per principal; "+
		"refusals kept %s, at most %d bytes per unit: %.2f MB per principal",
		rate, burst, heldLife, heldPer, float64(heldBound)/1e9, refusLife, refusedPer, float64(refusedBound)/1e6)

	// What each kind spends: a unit per hold it makes.
	for i, units := range []float64{1, 1, lines} {
		require.InDelta(t, units*float64(held[i].n), held[i].units, 0.01, "units spent by %s", held[i].name)
	}
	for i, units := range []float64{1, 1, lines} {
		require.InDelta(t, units*float64(refusals[i].n), refusals[i].units, 0.01, "units spent by %s", refusals[i].name)
	}
	// A refusal keeps nothing longer than a refused reserve does.
	for _, f := range refusals {
		require.NotEmpty(t, f.ttls)
		for _, ttl := range f.ttls {
			require.Positive(t, ttl, "%s: every key it leaves must expire", f.name)
			require.LessOrEqual(t, ttl, rejectionTTL, "%s: kept %s, longer than a refusal", f.name, ttl)
		}
	}
	// No kind of mutation leaves much more per unit than a reserve does, so
	// the budget bounds them all alike. Compared by MEMORY USAGE: used_memory
	// moves in steps when Redis grows its key table, so one kind can land
	// on a step and another not, while the bound above takes the larger.
	for _, f := range held {
		require.LessOrEqual(t, f.keptPerUnit(), 2*held[0].keptPerUnit(), "%s keeps %d bytes per unit, a reserve %d", f.name, f.keptPerUnit(), held[0].keptPerUnit())
	}
	for _, f := range refusals {
		require.LessOrEqual(t, f.keptPerUnit(), 2*refusals[0].keptPerUnit(), "%s keeps %d bytes per unit, a refused reserve %d", f.name, f.keptPerUnit(), refusals[0].keptPerUnit())
	}
	require.Less(t, refusedBound, int64(4_000_000), "one principal must not be able to pin more than 4 MB by being refused")
}
