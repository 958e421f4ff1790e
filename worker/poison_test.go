package worker

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// Outbox entries no batch can apply sit in the first partition the flusher
// visits, amid ordinary events: one of a kind this version does not know (a
// newer version wrote it during a rolling upgrade), one of a newer format
// (its version above inventory.EventVersion), one that does not decode, one
// Postgres refuses on a data exception (a NUL byte in a text
// column) and one it refuses on a constraint (an unknown SKU). Every
// partition's ordinary events reach the ledger, the bad entries end in the
// partition's dead-letter stream, counted by reason, and nothing else is
// lost or doubled.
func TestFlusherSetsPoisonEntriesAsideAndFlushesTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const perSKU = 30
	skus := skusCoveringAllPartitions("POISON")
	for _, s := range skus {
		b.product(t, s, 2*perSKU)
	}
	keys := b.engine.Keys()
	p0 := skus[0]
	outbox := keys.Outbox(0)

	// Ordinary events before and after the poison, all in the outbox before
	// any flusher runs, so the poison shares batches with them.
	tokens := map[string][]string{}
	for _, s := range skus {
		tokens[s] = b.reserveMany(t, s, perSKU/2, time.Hour)
	}
	xadd := func(vals map[string]any) string {
		id, err := b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: outbox, Values: vals}).Result()
		require.NoError(t, err)
		return id
	}
	now := time.Now().UnixMilli()
	event := func(kind, tok, sku, who string) map[string]any {
		return map[string]any{"id": kind + ":" + tok, "type": kind, "tok": tok, "sku": sku, "who": who, "qty": "1",
			"exp": now + 60_000, "ctd": now, "at": now}
	}
	newer := func(vals map[string]any) map[string]any { // a format a later release writes
		vals["v"] = inventory.EventVersion + 1
		return vals
	}
	poison := map[string]string{ // outbox entry id -> the reason it must be dead-lettered for
		xadd(event("refund", "tok-refund", p0, "u-refund")):                 "unknown_kind",
		xadd(map[string]any{"garbage": "not an event"}):                     "malformed",
		xadd(newer(event("reserve", "tok-newer", p0, "u-newer"))):           "newer_version",
		xadd(event("reserve", "tok-nul", p0, "u-\x00-nul")):                 "refused",
		xadd(event("reserve", "tok-ghost", "NO-SUCH-SKU-IN-P0", "u-ghost")): "refused",
	}
	for _, s := range skus {
		tokens[s] = append(tokens[s], b.reserveMany(t, s, perSKU/2, time.Hour)...)
	}

	cfg := fastConfig("poisoned")
	cfg.Flusher.RefuseLimit = 3
	g, reg := b.startGroup(t, cfg)
	waitTotal(t, "every partition's reserves reach the ledger despite the poison in partition 0", int64(perSKU*len(skus)), applied(g))
	var reserves int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM stock_movements WHERE kind = 'reserve'`).Scan(&reserves))
	require.Equal(t, perSKU*len(skus), reserves)

	// The refused events are retried every ClaimIdle and dead-lettered on
	// their third refusal; then the outbox is fully acknowledged.
	b.waitDrained(t, 20*time.Second, "the outbox drains, poison set aside", g.Flusher)
	dead, err := b.rdb.XRange(b.ctx, keys.DeadLetters(0), "-", "+").Result()
	require.NoError(t, err)
	got := map[string]string{}
	for _, d := range dead {
		got[d.Values["dead_entry"].(string)] = d.Values["dead_reason"].(string)
		require.NotEmpty(t, d.Values["dead_error"])
	}
	require.Equal(t, poison, got, "each poison entry is dead-lettered once, with its reason")
	for _, d := range dead {
		if d.Values["dead_reason"] == "unknown_kind" {
			require.Equal(t, "refund", d.Values["type"], "the entry's own fields are kept")
			require.Equal(t, "tok-refund", d.Values["tok"])
		}
	}
	for p := 1; p < inventory.Partitions; p++ {
		n, err := b.rdb.Exists(b.ctx, keys.DeadLetters(p)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "partition %d has no dead letters", p)
	}
	dl := g.Flusher.m.deadLettered
	require.Equal(t, 1.0, testutil.ToFloat64(dl.WithLabelValues("unknown_kind")))
	require.Equal(t, 1.0, testutil.ToFloat64(dl.WithLabelValues("malformed")))
	require.Equal(t, 1.0, testutil.ToFloat64(dl.WithLabelValues("newer_version")))
	require.Equal(t, 2.0, testutil.ToFloat64(dl.WithLabelValues("refused")))
	require.GreaterOrEqual(t, metric(t, reg, "dropline_writebehind_events_refused_total"), 6.0, "two events refused three times each")
	waitUntil(t, 5*time.Second, "the dead-letter gauge shows the five entries",
		func() bool { return metric(t, reg, "dropline_writebehind_dead_letters") == 5 }, g.Flusher.measured.C())

	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, map[string]int{"create": len(skus), "reserve": perSKU * len(skus)}, byKind)
	var strays int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE token IN ('tok-refund', 'tok-nul', 'tok-ghost')`).Scan(&strays))
	require.Zero(t, strays, "no poison reached the ledger")
	for _, s := range skus {
		b.requireLedgerMatchesRedis(t, s, tokens[s])
	}
	require.Zero(t, metric(t, reg, "dropline_worker_restarts_total"), "the flusher never had to restart")
}
