package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// skusCoveringAllPartitions names one SKU per partition, so work lands on
// every lease.
func skusCoveringAllPartitions(prefix string) []string {
	skus := make([]string, inventory.Partitions)
	found := 0
	for i := 0; found < inventory.Partitions; i++ {
		s := fmt.Sprintf("%s-%d", prefix, i)
		if p := inventory.PartitionOf(s); skus[p] == "" {
			skus[p] = s
			found++
		}
	}
	return skus
}

// Two worker groups (two server processes) on one Redis and one Postgres
// split the partitions, and together release every hold once and apply every
// event once. When one stops, the other takes its partitions over.
func TestTwoGroupsShareTheWorkWithoutDoingItTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const perSKU = 100
	skus := skusCoveringAllPartitions("TWO")
	for _, s := range skus {
		b.product(t, s, perSKU)
	}
	ga, regA := b.startGroup(t, fastConfig("a"))
	gb, regB := b.startGroup(t, fastConfig("b"))
	split := func(la, lb *leaseSet) bool {
		a, bb := la.Owned(), lb.Owned()
		seen := map[int]bool{}
		for _, p := range append(append([]int{}, a...), bb...) {
			if seen[p] {
				return false
			}
			seen[p] = true
		}
		return len(a) == inventory.Partitions/2 && len(bb) == inventory.Partitions/2
	}
	var keepers []any
	for _, g := range []*testGroup{ga, gb} {
		for _, s := range []*leaseSet{g.Sweeper.leases, g.Flusher.leases, g.Reconciler.leases} {
			keepers = append(keepers, s.heldNow.C())
		}
	}
	waitUntil(t, 10*time.Second, "the two groups split every kind of lease 8/8", func() bool {
		return split(ga.Sweeper.leases, gb.Sweeper.leases) && split(ga.Flusher.leases, gb.Flusher.leases) &&
			split(ga.Reconciler.leases, gb.Reconciler.leases)
	}, keepers...)
	t.Logf("sweeper partitions: a %v, b %v", ga.Sweeper.leases.Owned(), gb.Sweeper.leases.Owned())

	var tokens []string
	round := func() {
		for _, s := range skus {
			tokens = append(tokens, b.reserveMany(t, s, perSKU, time.Second)...)
		}
		// The sweepers signal each batch once Redis released and they
		// counted it: their totals reach the holds made, and no further.
		waitTotal(t, "the sweepers release every hold, once", int64(len(tokens)), swept(ga), swept(gb))
		for _, s := range skus {
			st := b.stock(t, s)
			require.Zero(t, st.Held, s)
			require.Equal(t, perSKU, st.Available, "%s is back to its total", s)
		}
	}
	round()
	expiredA, expiredB := metric(t, regA, "dropline_holds_expired_total"), metric(t, regB, "dropline_holds_expired_total")
	t.Logf("round 1: a expired %v, b expired %v", expiredA, expiredB)
	require.Positive(t, expiredA)
	require.Positive(t, expiredB)
	require.Equal(t, float64(len(tokens)), expiredA+expiredB, "a hold released twice, or not at all")

	// Group a shuts down: b takes everything over at once (a released its leases).
	stop(t, ga)
	waitHeld(t, gb.Sweeper.leases, inventory.Partitions, "b owns every partition after a stops")
	round()
	expiredB2 := metric(t, regB, "dropline_holds_expired_total")
	require.Equal(t, float64(len(tokens)), expiredA+expiredB2)
	require.Equal(t, expiredA, metric(t, regA, "dropline_holds_expired_total"), "a stopped working")

	b.waitDrained(t, 20*time.Second, "the outbox drains", gb.Flusher)
	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, len(tokens), byKind["reserve"])
	require.Equal(t, len(tokens), byKind["expire"])
	appliedSum := func() float64 {
		return metric(t, regA, "dropline_writebehind_events_applied_total") + metric(t, regB, "dropline_writebehind_events_applied_total")
	}
	// Like the sweepers, a flusher signals a batch once it acknowledged and
	// counted it.
	waitTotal(t, "the flushers apply every event, once", int64(2*len(tokens)), applied(ga), applied(gb))
	applied := appliedSum()
	claimed := metric(t, regA, "dropline_writebehind_events_claimed_total") + metric(t, regB, "dropline_writebehind_events_claimed_total")
	t.Logf("events: %d generated, %v applied by the two flushers, %v claimed", 2*len(tokens), applied, claimed)
	require.Equal(t, float64(2*len(tokens)), applied, "an event was applied twice")
	for _, s := range skus {
		var held int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE sku = $1 AND status <> 'EXPIRED'`, s).Scan(&held))
		require.Zero(t, held, s)
	}
}
