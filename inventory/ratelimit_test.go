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
	return &inventory.RateLimit{Key: "rate:" + b.prefix + "mutations:" + who, Rate: 1, Period: time.Minute, Burst: burst}
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
