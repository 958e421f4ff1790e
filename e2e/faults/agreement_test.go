package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// settled waits until a SKU is at rest: no hold left in Redis and none left
// HELD in the ledger (the write-behind drained).
func (s *system) settled(t *testing.T, sku string, within time.Duration) {
	t.Helper()
	eventually(t, within, sku+" at rest", func() (bool, string) {
		st := s.stockOf(sku)
		held := s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
		return st.Held == 0 && held == 0, fmt.Sprintf("redis %+v, held in Postgres %d", st, held)
	})
}

// requireLedgerAgreesWithRedis compares, at rest, every reservation the
// ledger has for a SKU with the hold Redis has in the SKU's current
// generation, and the counters with the ledger:
//
//   - a HELD or COMMITTED row has its hold in Redis with that status
//     (COMMITTING counts as HELD);
//   - a CANCELLED or EXPIRED row has no live hold in Redis, or one with the
//     same status (finished holds are kept only for idempotent replay);
//   - every hold of the current generation has its ledger row;
//   - Redis' held is the ledger's HELD units, sold is products.sold, and
//     available is the rest of the total.
func (s *system) requireLedgerAgreesWithRedis(t *testing.T, sku string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s.stockOf(sku) // loads the SKU if Redis lost it
	gen, err := s.RDB.HGet(ctx, s.Keys.SKU(sku), "gen").Result()
	require.NoError(t, err, "%s is loaded in Redis", sku)
	p := inventory.PartitionOf(sku)

	ledger := map[string]string{}
	heldUnits := 0
	rows, err := s.Pool.Query(ctx, `SELECT token, status, quantity FROM reservations WHERE sku = $1`, sku)
	require.NoError(t, err)
	for rows.Next() {
		var tok, st string
		var q int
		require.NoError(t, rows.Scan(&tok, &st, &q))
		ledger[tok] = st
		if st == "HELD" {
			heldUnits += q
		}
	}
	require.NoError(t, rows.Err())

	var bad []string
	for tok, st := range ledger {
		h, err := s.RDB.HGetAll(ctx, s.Keys.Hold(p, tok)).Result()
		require.NoError(t, err)
		live := len(h) > 0 && h["gen"] == gen
		rst := h["st"]
		if rst == "COMMITTING" {
			rst = "HELD"
		}
		switch {
		case (st == "HELD" || st == "COMMITTED") && (!live || rst != st):
			bad = append(bad, fmt.Sprintf("%s ledger %s, Redis %q (live %v)", tok, st, h["st"], live))
		case (st == "CANCELLED" || st == "EXPIRED") && live && rst != st:
			bad = append(bad, fmt.Sprintf("%s ledger %s, Redis %q", tok, st, h["st"]))
		}
	}
	iter := s.RDB.Scan(ctx, 0, s.Keys.Base(p)+"hold:*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		h, err := s.RDB.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		if h["sku"] != sku || h["gen"] != gen {
			continue
		}
		tok := key[strings.LastIndex(key, ":")+1:]
		if _, ok := ledger[tok]; !ok {
			bad = append(bad, fmt.Sprintf("%s Redis %s, not in the ledger", tok, h["st"]))
		}
	}
	require.NoError(t, iter.Err())
	sort.Strings(bad)
	require.Empty(t, bad, "%s: the ledger and Redis disagree on reservations", sku)

	st, ok := s.redisStock(ctx, sku)
	require.True(t, ok)
	pgSold := s.scalar(`SELECT sold FROM products WHERE sku = $1`, sku)
	pgTotal := s.scalar(`SELECT total FROM products WHERE sku = $1`, sku)
	require.Equal(t, heldUnits, st.Held, "%s: Redis held vs the ledger's HELD units", sku)
	require.Equal(t, pgSold, st.Sold, "%s: Redis sold vs products.sold", sku)
	require.Equal(t, pgTotal, st.Total, "%s: total", sku)
	require.Equal(t, pgTotal-pgSold-heldUnits, st.Available, "%s: Redis available vs the ledger", sku)
}
