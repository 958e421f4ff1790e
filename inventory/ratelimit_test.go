package inventory_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// budget is a principal's mutation budget under this test's prefix: burst
// units, then one a minute.
func (b *bundle) budget(who string, burst int) *inventory.RateLimit {
	return &inventory.RateLimit{Key: "rate:" + b.prefix + "budget:" + who, Rate: 1, Period: time.Minute, Burst: burst}
}

func requireRateLimited(t *testing.T, err error) {
	t.Helper()
	var limited *inventory.RateLimitedError
	require.ErrorAs(t, err, &limited)
	require.True(t, errors.Is(err, inventory.ErrRateLimited))
	require.Equal(t, inventory.ErrRateLimited.Code(), inventory.ErrorCode(err))
	require.Greater(t, limited.RetryAfter, time.Duration(0))
	require.LessOrEqual(t, limited.RetryAfter, time.Minute)
}

// A reserve given its principal's budget spends one unit of it, the same
// budget every other mutation spends (SpendRateLimit), and is refused
// RATE_LIMITED, holding nothing, once none is left: with or without an
// idempotency key, and on a cluster, where the budget is spent in a script
// of its own.
func TestReserveSpendsThePrincipalsBudget(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "RATE-1", 10, 0)
		alice := inventory.Principal{ID: "alice"}
		for _, key := range []string{"", "k"} {
			who := alice.ID + key
			require.NoError(t, b.engine.SpendRateLimit(b.ctx, *b.budget(who, 3)), "another mutation spends the first unit")
			for i := range 2 {
				idem := ""
				if key != "" {
					idem = key + strconv.Itoa(i)
				}
				_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: who},
					inventory.ReserveRequest{SKU: "RATE-1", Quantity: 1, IdempotencyKey: idem, RateLimit: b.budget(who, 3)})
				require.NoError(t, err)
			}
			_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: who},
				inventory.ReserveRequest{SKU: "RATE-1", Quantity: 1, IdempotencyKey: key, RateLimit: b.budget(who, 3)})
			requireRateLimited(t, err)
			requireRateLimited(t, b.engine.SpendRateLimit(b.ctx, *b.budget(who, 3)))
		}
		s := b.requireBalanced(t, "RATE-1")
		require.Equal(t, 4, s.Held, "the refused reserves held nothing")

		// The budget is the principal's.
		_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "bob"},
			inventory.ReserveRequest{SKU: "RATE-1", Quantity: 1, RateLimit: b.budget("bob", 1)})
		require.NoError(t, err)
	})
}

// A reserve refused for its input spends its unit all the same, as any
// mutation does; one that must wait for its SKU to be rebuilt spends it
// once, not once per attempt.
func TestReserveSpendsOnceWhateverItsOutcome(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "RATE-2", 1, 0)
		carol := inventory.Principal{ID: "carol"}
		_, err := b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 0, RateLimit: b.budget("carol", 1)})
		require.ErrorIs(t, err, inventory.ErrInvalidInput)
		_, err = b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 1, RateLimit: b.budget("carol", 1)})
		requireRateLimited(t, err)

		dave := inventory.Principal{ID: "dave"}
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU("RATE-2")).Err())
		_, err = b.engine.Reserve(b.ctx, dave, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 1, RateLimit: b.budget("dave", 1)})
		require.NoError(t, err, "the attempt that found the SKU missing spent nothing")
		_, err = b.engine.Reserve(b.ctx, dave, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 1, RateLimit: b.budget("dave", 1)})
		requireRateLimited(t, err)

		// Out of stock spends too.
		erin := inventory.Principal{ID: "erin"}
		_, err = b.engine.Reserve(b.ctx, erin, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 1, RateLimit: b.budget("erin", 1)})
		require.ErrorIs(t, err, inventory.ErrOutOfStock)
		_, err = b.engine.Reserve(b.ctx, erin, inventory.ReserveRequest{SKU: "RATE-2", Quantity: 1, RateLimit: b.budget("erin", 1)})
		requireRateLimited(t, err)
		b.requireBalanced(t, "RATE-2")
	})
}

// since2017 is a Redis TIME reading as the budget counts it: microseconds
// since 2017-01-01 UTC.
func since2017(t *testing.T, b *bundle, who string) int64 {
	t.Helper()
	// TIME of the node that holds the budget's key (a cluster's own slot).
	now, err := b.rdb.Time(b.ctx).Result()
	require.NoError(t, err, who)
	return now.UnixMicro() - time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
}

// A budget's key holds its theoretical arrival time as whole microseconds
// since 2017, a decimal integer, and lives until the budget is full again;
// a key an earlier release wrote, float seconds since 2017, is read as the
// same instant: one whose time is half a minute ahead still refuses a
// mutation for that half minute, by reserve.lua and rate_limit.lua alike.
func TestBudgetArrivalTimeInWholeMicroseconds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "RATE-3", 10, 0)

		// One unit spent of a budget of one a minute: the arrival time is a
		// minute past the spend.
		l := b.budget("frank", 3)
		before := since2017(t, b, l.Key)
		require.NoError(t, b.engine.SpendRateLimit(b.ctx, *l))
		after := since2017(t, b, l.Key)
		v, err := b.rdb.Get(b.ctx, l.Key).Result()
		require.NoError(t, err)
		require.Regexp(t, `^[1-9][0-9]*$`, v, "an integer")
		tat, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		require.GreaterOrEqual(t, tat, before+int64(time.Minute/time.Microsecond))
		require.LessOrEqual(t, tat, after+int64(time.Minute/time.Microsecond))
		ttl, err := b.rdb.TTL(b.ctx, l.Key).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0))
		require.LessOrEqual(t, ttl, time.Minute)

		// An interval that is not a whole number of microseconds is rounded
		// up: three a 3,601 s, each 1,200,333,333⅓ µs after the last.
		odd := &inventory.RateLimit{Key: l.Key + "-odd", Rate: 3, Period: 3601 * time.Second, Burst: 3}
		var tats [2]int64
		for i := range tats {
			require.NoError(t, b.engine.SpendRateLimit(b.ctx, *odd))
			tats[i], err = b.rdb.Get(b.ctx, odd.Key).Int64()
			require.NoError(t, err)
		}
		require.Equal(t, int64(1_200_333_334), tats[1]-tats[0])

		// Keys in the earlier format: float seconds since 2017.
		secs := func(us int64) string { return strconv.FormatFloat(float64(us)/1e6, 'g', 17, 64) }
		for i, spend := range []func(who string, l *inventory.RateLimit) error{
			func(_ string, l *inventory.RateLimit) error { return b.engine.SpendRateLimit(b.ctx, *l) },
			func(who string, l *inventory.RateLimit) error {
				_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: who},
					inventory.ReserveRequest{SKU: "RATE-3", Quantity: 1, RateLimit: l})
				return err
			},
		} {
			who := "grace" + strconv.Itoa(i)
			l := b.budget(who, 1)
			now := since2017(t, b, l.Key)
			require.NoError(t, b.rdb.Set(b.ctx, l.Key, secs(now+30_500_000), time.Minute).Err())
			err := spend(who, l)
			requireRateLimited(t, err)
			var limited *inventory.RateLimitedError
			require.ErrorAs(t, err, &limited)
			require.LessOrEqual(t, limited.RetryAfter, 30500*time.Millisecond, "the half minute the key says")
			require.Greater(t, limited.RetryAfter, 20*time.Second, "the half minute the key says")

			// Ahead of nothing (the budget is full again): spent, and
			// written anew as an integer.
			now = since2017(t, b, l.Key)
			require.NoError(t, b.rdb.Set(b.ctx, l.Key, secs(now-100_000_000), time.Minute).Err())
			require.NoError(t, spend(who, l))
			v, err := b.rdb.Get(b.ctx, l.Key).Result()
			require.NoError(t, err)
			require.Regexp(t, `^[1-9][0-9]*$`, v)
		}
	})
}
