package worker

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// Two processes split the partitions; the one holding half of the sweeper
// leases dies just before the holds in its partitions fall due. Its sweeper
// leases last 10 s, yet every hold in every partition is released within a
// second of its expiresAt by the survivor, exactly once, and the ledger
// records one expiry per hold (its flusher leases last 2 s, so the test
// does not wait 10 s for the survivor's flusher to take them over).
func TestHoldsExpireOnTimeAfterTheirSweeperDied(t *testing.T) {
	testenv.Quiet(t)
	const perSKU = 20
	b := setup(t)
	skus := skusCoveringAllPartitions("LATE")
	for _, s := range skus {
		b.product(t, s, perSKU)
	}
	cfgA, cfgB := fastConfig("doomed"), fastConfig("survivor")
	cfgA.LeaseTTL, cfgB.LeaseTTL = 10*time.Second, 10*time.Second
	cfgA.Flusher.LeaseTTL, cfgB.Flusher.LeaseTTL = 2*time.Second, 2*time.Second
	ga, _ := b.startGroup(t, cfgA)
	gb, regB := b.startGroup(t, cfgB)
	waitUntil(t, 10*time.Second, "the two processes split the sweeper leases 8/8", func() bool {
		return len(ga.Sweeper.leases.Owned()) == inventory.Partitions/2 && len(gb.Sweeper.leases.Owned()) == inventory.Partitions/2
	}, ga.Sweeper.leases.heldNow.C(), gb.Sweeper.leases.heldNow.C())
	deadParts := map[int]bool{}
	for _, p := range ga.Sweeper.leases.Owned() {
		deadParts[p] = true
	}

	began := time.Now()
	tokens := map[string][]string{}
	for _, s := range skus {
		tokens[s] = b.reserveMany(t, s, perSKU, 4*time.Second)
	}
	// The holds last 4 s, the dead process's leases 10 s: the kill comes
	// before the first hold falls due, and its leases outlast every hold.
	require.Less(t, time.Since(began), 3500*time.Millisecond, "the holds were made well before the first falls due")
	ga.kill(t)
	killedAt := time.Now()

	keys := b.engine.Keys()
	waitUntil(t, 20*time.Second, "every hold is released", func() bool {
		for _, s := range skus {
			if b.stock(t, s).Held != 0 {
				return false
			}
		}
		return true
	}, gb.Sweeper.swept.C())
	var all, dead []time.Duration
	for _, s := range skus {
		p := inventory.PartitionOf(s)
		require.Equal(t, perSKU, b.stock(t, s).Available, "%s restocked exactly once per hold", s)
		for _, tok := range tokens[s] {
			h, err := b.rdb.HMGet(b.ctx, keys.Hold(p, tok), "st", "exp", "end").Result()
			require.NoError(t, err)
			require.Equal(t, "EXPIRED", h[0], "hold %s", tok)
			exp, _ := strconv.ParseInt(h[1].(string), 10, 64)
			end, _ := strconv.ParseInt(h[2].(string), 10, 64)
			d := time.Duration(end-exp) * time.Millisecond
			all = append(all, d)
			if deadParts[p] {
				dead = append(dead, d)
			}
		}
	}
	t.Logf("killed %s after the first reserve; release delay of %d holds in the dead process's %d partitions: p50 %s, p99 %s, max %s; all %d holds: p50 %s, p99 %s, max %s",
		killedAt.Sub(began), len(dead), len(deadParts), percentile(dead, 0.5), percentile(dead, 0.99), percentile(dead, 1),
		len(all), percentile(all, 0.5), percentile(all, 0.99), percentile(all, 1))
	require.Less(t, percentile(all, 1), time.Second, "every hold released within 1 s of its expiresAt")
	require.Equal(t, float64(len(all)), metric(t, regB, "dropline_holds_expired_total"), "the survivor released every hold, each once")
	require.Positive(t, metric(t, regB, "dropline_hold_late_sweeps_total"), "some of it without the lease")

	// The survivor's flusher takes the dead one's partitions over once their
	// leases expire and claims what it left pending.
	b.waitDrained(t, 30*time.Second, "the outbox drains", gb.Flusher)
	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, len(all), byKind["expire"], "one expiry per hold in the ledger")
	require.Equal(t, len(all), byKind["reserve"])
	for _, s := range skus {
		b.requireLedgerMatchesRedis(t, s, tokens[s])
	}
}
