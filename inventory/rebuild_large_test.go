package inventory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// ledgerSeed is a SKU's history written straight into Postgres, as the
// write-behind worker and commits would have left it: reservations of one
// unit each, spread over Principals principals.
type ledgerSeed struct {
	Held      int // HELD, due in an hour
	Due       int // HELD in Postgres but past their expiry
	Committed int // sold within the retention window, with their sales rows
	Finished  int // cancelled and expired with an idempotency key, within its window
	// Principals is how many principals share the reservations.
	Principals int
	// Spare is the units neither held nor sold.
	Spare int
}

// seedLedger creates sku with the given history. Tokens are well-formed and
// name the SKU's partition; a third of the holds and every finished
// reservation carry an idempotency hash.
func seedLedger(t testing.TB, pool *pgxpool.Pool, sku string, s ledgerSeed) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("r%02d.", inventory.PartitionOf(sku))
	// 26 characters of the token alphabet (16 bytes): the kind, 'seed', i, 'a'.
	tok := `$2 || $3 || 'seed' || translate(lpad(i::text, 20, '0'), '0189', 'wxyz') || 'a'`
	who := `'buyer-' || (i % $4)`
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO products (sku, name, price_amount, price_currency, total, sold)
		VALUES ($1, 'Seeded ' || $1, 1999, 'EUR', $2, $3)`, sku, s.Held+s.Committed+s.Spare, s.Committed)
	require.NoError(t, err)
	exec := func(label string, n int, query string) {
		_, err := tx.Exec(ctx, query, sku, prefix, label, max(s.Principals, 1), n)
		require.NoError(t, err, label)
	}
	exec("h", s.Held, `INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at)
		SELECT `+tok+`, $1, `+who+`, 1, 'HELD',
			CASE WHEN i % 3 = 0 THEN md5('ih' || i) END, CASE WHEN i % 3 = 0 THEN md5('rh' || i) END,
			now() + interval '1 hour', now() - interval '20 minutes' + i * interval '1 microsecond'
		FROM generate_series(1, $5) i`)
	exec("d", s.Due, `INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		SELECT `+tok+`, $1, `+who+`, 1, 'HELD', now() - interval '1 minute', now() - interval '30 minutes' + i * interval '1 microsecond'
		FROM generate_series(1, $5) i`)
	exec("c", s.Committed, `WITH r AS (
			INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at, committed_at)
			SELECT `+tok+`, $1, `+who+`, 1, 'COMMITTED', md5('ic' || i), md5('rc' || i),
				now() + interval '1 hour', now() - interval '2 hours', now() - interval '2 hours' + i * interval '1 microsecond'
			FROM generate_series(1, $5) i RETURNING token, sku, principal, quantity, committed_at)
		INSERT INTO sales (token, sku, principal, quantity, committed_at) SELECT * FROM r`)
	exec("f", s.Finished, `INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at, ended_at)
		SELECT `+tok+`, $1, `+who+`, 1, CASE WHEN i % 2 = 0 THEN 'CANCELLED' ELSE 'EXPIRED' END, md5('if' || i), md5('rf' || i),
			now() - interval '1 minute', now() - interval '3 hours' + i * interval '1 microsecond', now() - interval '1 minute'
		FROM generate_series(1, $5) i`)
	require.NoError(t, tx.Commit(ctx))
}

// ledgerStatuses returns every reservation of sku in Postgres: token -> status.
func ledgerStatuses(t testing.TB, pool *pgxpool.Pool, sku string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT token, status FROM reservations WHERE sku = $1`, sku)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var tok, st string
		require.NoError(t, rows.Scan(&tok, &st))
		out[tok] = st
	}
	require.NoError(t, rows.Err())
	return out
}

// redisStatuses reads the status of every token's hold in Redis, "" when
// the hold is missing or left over from an earlier life of the SKU.
func (b *bundle) redisStatuses(t testing.TB, sku string, tokens []string) map[string]string {
	t.Helper()
	keys := b.engine.Keys()
	gen, err := b.rdb.HGet(b.ctx, keys.SKU(sku), "gen").Result()
	require.NoError(t, err)
	out := make(map[string]string, len(tokens))
	p := inventory.PartitionOf(sku)
	for start := 0; start < len(tokens); start += 5000 {
		batch := tokens[start:min(start+5000, len(tokens))]
		cmds := make([]*redis.SliceCmd, len(batch))
		_, err := b.rdb.Pipelined(b.ctx, func(pipe redis.Pipeliner) error {
			for i, tok := range batch {
				cmds[i] = pipe.HMGet(b.ctx, keys.Hold(p, tok), "st", "gen")
			}
			return nil
		})
		require.NoError(t, err)
		for i, c := range cmds {
			v := c.Val()
			st, _ := v[0].(string)
			if g, _ := v[1].(string); g != gen {
				st = ""
			}
			out[batch[i]] = st
		}
	}
	return out
}

// A SKU with more reservations than one script can take (the old limit was
// about 100,000) is rebuilt in bounded steps: the counters, every hold and
// every finished reservation come back as the ledger has them.
//
// Not parallel: seeding and rebuilding 121,000 reservations loads both
// cores for seconds, which the timing-sensitive tests of this package
// (commits racing expiry) should not run beside.
func TestRebuildOfASKUWithMoreReservationsThanOneScriptTakes(t *testing.T) {
	b := setup(t, "single", inventory.Config{})
	const sku = "HUGE-1"
	seed := ledgerSeed{Held: 60_000, Due: 1_000, Committed: 40_000, Finished: 20_000, Principals: 30_000, Spare: 500}
	seedLedger(t, b.pool, sku, seed)

	start := time.Now()
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	took := time.Since(start)
	require.NoError(t, err)
	t.Logf("rebuilt %d reservations in %s", seed.Held+seed.Due+seed.Committed+seed.Finished, took)
	require.Equal(t, seed.Held, s.Held)
	require.Equal(t, seed.Committed, s.Sold)
	require.Equal(t, seed.Spare, s.Available)
	// 6-10 s with -race on a busy 2-core machine; the rebuild gives up at a minute.
	require.Less(t, took, 45*time.Second)

	want := ledgerStatuses(t, b.pool, sku)
	tokens := make([]string, 0, len(want))
	for tok := range want {
		tokens = append(tokens, tok)
	}
	got := b.redisStatuses(t, sku, tokens)
	due := 0
	for tok, st := range want {
		if st == "HELD" && got[tok] == "EXPIRED" {
			due++ // past its expiry: recorded as expired by the rebuild
			continue
		}
		require.Equal(t, st, got[tok], "token %s", tok)
	}
	require.Equal(t, seed.Due, due)

	// The dropped holds reach the ledger as expired, once.
	kinds := b.drainOutbox(t)
	require.Equal(t, map[string]int{"expire": seed.Due}, kinds)
	for tok, st := range ledgerStatuses(t, b.pool, sku) {
		require.Equal(t, got[tok], st, "token %s", tok)
	}
	b.requireBalanced(t, sku)

	// Reserves work at once.
	h, err := b.engine.Reserve(b.ctx, buyer(30_007), inventory.ReserveRequest{SKU: sku, Quantity: 2})
	require.NoError(t, err)
	require.Equal(t, inventory.StatusHeld, h.Status)
	require.Equal(t, seed.Held+2, b.requireBalanced(t, sku).Held)
}

// Only the SKU's stock hash is lost (evicted, or deleted by hand), with the
// outbox, while its holds and quota counters stay: the rebuilt quotas are the
// ledger's (with whatever the outbox still had applied first), so a
// buyer whose hold was lost, or dropped as past due, is not refused for
// units they no longer hold.
func TestQuotaAfterOnlyTheSKUIsLost(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "QUOTA-LOSS-1"
		b.product(t, sku, 10, 2)
		alice, bob, carol := buyer(1), buyer(2), buyer(3)
		kept, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 1})
		require.NoError(t, err)
		due, err := b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		b.drainOutbox(t) // the ledger knows bob's and carol's holds, not alice's
		lost, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 2})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return time.Now().After(due.ExpiresAt) }, 3*time.Second, 10*time.Millisecond)
		// alice's hold is lost with the outbox that had its event (with the
		// event still there, the rebuild would apply it first and restore it).
		b.loseOutbox(t)
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())

		s := b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Held, "only bob's recorded hold is restored")
		// alice's hold was lost and carol's dropped: neither counts against them.
		_, err = b.engine.Cancel(b.ctx, alice, lost.Token)
		require.ErrorIs(t, err, inventory.ErrNotFound)
		a2, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 2})
		require.NoError(t, err, "alice holds nothing")
		c2, err := b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: sku, Quantity: 2})
		require.NoError(t, err, "carol's hold expired")
		// bob's restored hold still counts.
		_, err = b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 2})
		var quota *inventory.QuotaExceededError
		require.ErrorAs(t, err, &quota)
		require.Equal(t, 1, quota.Held)
		b2, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 1})
		require.NoError(t, err)

		// Releasing works against the rebuilt counts: alice cancels and may
		// take 2 again; nothing goes below zero or leaks.
		_, err = b.engine.Cancel(b.ctx, alice, a2.Token)
		require.NoError(t, err)
		a3, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 2})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1})
		require.ErrorAs(t, err, &quota)
		require.Equal(t, 2, quota.Held)

		b.drainOutbox(t)
		s = b.requireBalanced(t, sku)
		require.Equal(t, 1+2+1+2, s.Held)
		want := map[string]inventory.Status{
			kept.Token: inventory.StatusHeld, due.Token: inventory.StatusExpired, a2.Token: inventory.StatusCancelled,
			a3.Token: inventory.StatusHeld, c2.Token: inventory.StatusHeld, b2.Token: inventory.StatusHeld,
		}
		for tok, st := range want {
			r, err := b.engine.Reservation(b.ctx, admin, tok)
			require.NoError(t, err)
			require.Equal(t, st, r.Status, "Redis: %s", tok)
			row, err := b.engine.Ledger().Reservations().Reservation(b.ctx, tok)
			require.NoError(t, err)
			require.Equal(t, string(st), row.Status, "Postgres: %s", tok)
		}
	})
}

// Three engines (three processes, as far as Redis and Postgres can tell)
// find the same SKU missing at once, while buyers read and reserve through
// all of them. The rebuild is written in many small chunks; exactly one
// rebuild publishes, nothing is counted twice, and no reader sees the SKU
// before all of it is there: every restored hold reads HELD, every stock
// read balances.
func TestConcurrentChunkedRebuilds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		cfg := inventory.Config{RebuildBatch: 16}
		b := setup(t, backend, cfg)
		const sku = "CHUNKS-1"
		seed := ledgerSeed{Held: 150, Due: 20, Committed: 90, Finished: 40, Principals: 37, Spare: 30}
		seedLedger(t, b.pool, sku, seed)
		regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry(), prometheus.NewRegistry()}
		engines := make([]*inventory.Engine, len(regs))
		for i, reg := range regs {
			c := cfg
			c.KeyPrefix, c.Registerer = b.prefix, reg
			e, err := inventory.NewEngine(b.ctx, c, b.rdb, b.pool, zerolog.Nop())
			require.NoError(t, err)
			engines[i] = e
		}
		var held []string
		for tok, st := range ledgerStatuses(t, b.pool, sku) {
			if st == "HELD" {
				held = append(held, tok)
			}
		}
		var rows []struct{ tok, who string }
		r, err := b.pool.Query(b.ctx, `SELECT token, principal FROM reservations WHERE sku = $1 AND status = 'HELD' AND expires_at > now()`, sku)
		require.NoError(t, err)
		for r.Next() {
			var row struct{ tok, who string }
			require.NoError(t, r.Scan(&row.tok, &row.who))
			rows = append(rows, row)
		}
		require.NoError(t, r.Err())
		require.Len(t, rows, seed.Held)

		const readers = 30
		type result struct {
			status inventory.Status
			stock  inventory.Stock
			hold   inventory.Reservation
			err    error
		}
		results := make([]result, readers)
		race(readers, func(i int) {
			e := engines[i%len(engines)]
			switch i % 3 {
			case 0:
				row := rows[i*5%len(rows)]
				res, err := e.Reservation(b.ctx, inventory.Principal{ID: row.who}, row.tok)
				results[i] = result{status: res.Status, err: err}
			case 1:
				s, err := e.Catalog().Stock(b.ctx, sku)
				results[i] = result{stock: s, err: err}
			default:
				h, err := e.Reserve(b.ctx, buyer(1000+i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
				results[i] = result{hold: h, err: err}
			}
		})
		reserved := 0
		for i, res := range results {
			require.NoError(t, res.err, "reader %d", i)
			switch i % 3 {
			case 0:
				require.Equal(t, inventory.StatusHeld, res.status, "reader %d", i)
			case 1:
				s := res.stock
				require.Equal(t, s.Total, s.Available+s.Held+s.Sold, "reader %d: %+v", i, s)
				require.Equal(t, seed.Committed, s.Sold)
				require.GreaterOrEqual(t, s.Held, seed.Held, "reader %d saw counters without their holds", i)
			default:
				require.Equal(t, inventory.StatusHeld, res.hold.Status)
				reserved++
			}
		}
		published := 0.0
		for _, reg := range regs {
			published += counterValue(t, reg, "dropline_inventory_rebuilds_total")
		}
		require.Equal(t, 1.0, published, "exactly one rebuild published")

		s := b.requireBalanced(t, sku)
		require.Equal(t, seed.Held+reserved, s.Held)
		require.Equal(t, seed.Spare-reserved, s.Available)
		got := b.redisStatuses(t, sku, held)
		expired := 0
		for _, tok := range held {
			if got[tok] == "EXPIRED" {
				expired++
			} else {
				require.Equal(t, "HELD", got[tok], tok)
			}
		}
		require.Equal(t, seed.Due, expired)
		require.Equal(t, map[string]int{"expire": seed.Due, "reserve": reserved}, b.drainOutbox(t), "each dropped hold expired once")

		// Quotas are exactly the ledger's live holds and sales, plus the new holds.
		want := map[string]string{}
		qr, err := b.pool.Query(b.ctx, `SELECT principal, sum(quantity)::text FROM (
				SELECT principal, quantity FROM reservations WHERE sku = $1 AND status = 'HELD' AND expires_at > now()
				UNION ALL SELECT principal, quantity FROM sales WHERE sku = $1) q GROUP BY principal`, sku)
		require.NoError(t, err)
		for qr.Next() {
			var who, n string
			require.NoError(t, qr.Scan(&who, &n))
			want[who] = n
		}
		require.NoError(t, qr.Err())
		quota, err := b.rdb.HGetAll(b.ctx, b.engine.Keys().Quota(sku)).Result()
		require.NoError(t, err)
		require.Equal(t, want, quota)
		n, err := b.rdb.Exists(b.ctx, b.engine.Keys().Staged().Rebuild(sku), b.engine.Keys().Staged().Quota(sku)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "no staging left behind")
	})
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}
