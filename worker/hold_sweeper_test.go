package worker

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// 5,000 holds of one second expire within about the same second: every one
// is released exactly once, soon after its expiresAt.
func TestHoldSweeperReleasesFiveThousandHoldsOnceUnderASecond(t *testing.T) {
	testenv.Quiet(t)
	const n = 5000
	b := setup(t)
	b.product(t, "DROP-5K", n)
	g, reg := b.startGroup(t, fastConfig("solo"))
	waitHeld(t, g.Sweeper.leases, inventory.Partitions, "the only sweeper owns every partition")

	began := time.Now()
	tokens := b.reserveMany(t, "DROP-5K", n, time.Second)
	t.Logf("reserved %d holds in %s", n, time.Since(began))

	waitTotal(t, "the sweeper releases every hold, once", n, swept(g))
	s := b.stock(t, "DROP-5K")
	require.Equal(t, n, s.Available, "stock back to total, restocked exactly once per hold")
	require.Equal(t, 0, s.Sold)

	// Each hold's own record says when it expired and when it was released.
	keys := b.engine.Keys()
	delays := make([]time.Duration, 0, n)
	var firstExp, lastExp int64
	for _, tok := range tokens {
		h, err := b.rdb.HMGet(b.ctx, keys.Hold(inventory.PartitionOf("DROP-5K"), tok), "st", "exp", "end").Result()
		require.NoError(t, err)
		require.Equal(t, "EXPIRED", h[0], "hold %s", tok)
		exp, _ := strconv.ParseInt(h[1].(string), 10, 64)
		end, _ := strconv.ParseInt(h[2].(string), 10, 64)
		if firstExp == 0 || exp < firstExp {
			firstExp = exp
		}
		lastExp = max(lastExp, exp)
		delays = append(delays, time.Duration(end-exp)*time.Millisecond)
	}
	p50, p99, worst := percentile(delays, 0.50), percentile(delays, 0.99), percentile(delays, 1)
	t.Logf("%d holds expired over %s; release delay p50 %s, p99 %s, max %s",
		n, time.Duration(lastExp-firstExp)*time.Millisecond, p50, p99, worst)
	require.Less(t, p99, time.Second, "p99 release delay")
	require.Equal(t, float64(n), metric(t, reg, "dropline_holds_expired_total"), "each hold released once, by the sweeper")
	require.Equal(t, float64(n), metric(t, reg, "dropline_hold_release_delay_seconds"))

	// The ledger has exactly one expiry per hold.
	b.waitDrained(t, 20*time.Second, "the flusher drains the outbox", g.Flusher)
	var expires, tokensExpired, reservationsExpired int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT token) FROM stock_movements WHERE kind = 'expire'`).
		Scan(&expires, &tokensExpired))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE sku = 'DROP-5K' AND status = 'EXPIRED'`).
		Scan(&reservationsExpired))
	require.Equal(t, n, expires)
	require.Equal(t, n, tokensExpired)
	require.Equal(t, n, reservationsExpired)
	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, n, byKind["reserve"])
}
