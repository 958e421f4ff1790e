package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

const reservationQuery = `query($token: ID!) { reservation(token: $token) { token status quantity } }`

// The SKU of a long sale: 200,000 reservations in the rebuild windows
// (120,000 live holds, 50,000 sales of the last day, 30,000 cancelled or
// expired with an idempotency key), written straight into the ledger, then
// Redis flushed. The next read rebuilds the SKU through the real binary in
// bounded chunks and bounded time; the counters, the per-principal quotas,
// every live hold and a sample of the rest are exactly the ledger's; keys of
// finished reservations replay them; reserves work at once.
func TestRebuildOfASKUWith200kReservations(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	testStart := time.Now()
	s := newSystem(t)
	a := s.start("a")
	const sku = "HUGE-1"
	s.createProduct(a, sku, 10, 0)

	// Two finished reservations made through the API, so their keys can be replayed.
	buyer := s.token("replayer", false)
	reserve := func(key string) (string, string, []userError) {
		input := map[string]any{"sku": sku, "quantity": 1, "holdSeconds": 600}
		if key != "" {
			input["idempotencyKey"] = key
		}
		var out struct {
			Reserve struct {
				Reservation *struct{ Token, Status string } `json:"reservation"`
				UserErrors  []userError                     `json:"userErrors"`
			} `json:"reserve"`
		}
		s.mustGQL(a, buyer, reserveMutation, map[string]any{"input": input}, &out)
		if out.Reserve.Reservation == nil {
			return "", "", out.Reserve.UserErrors
		}
		return out.Reserve.Reservation.Token, out.Reserve.Reservation.Status, out.Reserve.UserErrors
	}
	end := func(mutation, field, token, want string) {
		var out map[string]struct {
			Reservation *struct{ Status string } `json:"reservation"`
			UserErrors  []userError              `json:"userErrors"`
		}
		s.mustGQL(a, buyer, mutation, map[string]any{"token": token}, &out)
		require.Empty(t, out[field].UserErrors)
		require.Equal(t, want, out[field].Reservation.Status)
	}
	sold, _, errs := reserve("k-sold")
	require.Empty(t, errs)
	end(commitMutation, "commit", sold, "COMMITTED")
	cancelled, _, errs := reserve("k-cancelled")
	require.Empty(t, errs)
	end(cancelMutation, "cancel", cancelled, "CANCELLED")
	eventually(t, 30*time.Second, "the write-behind recorded the cancel", func() (bool, string) {
		n := s.scalar(`SELECT count(*)::int FROM reservations WHERE token = ANY($1) AND status IN ('COMMITTED', 'CANCELLED')
			AND idempotency_hash IS NOT NULL`, []string{sold, cancelled})
		return n == 2, fmt.Sprintf("%d of 2", n)
	})

	const held, committed, finished = 120_000, 50_000, 30_000
	seedStart := time.Now()
	seedReservations(t, s, sku, held, committed, finished, 40_000)
	seedTook := time.Since(seedStart)

	// Every script that runs longer than 2 ms is logged by Redis itself.
	ctx := context.Background()
	require.NoError(t, s.RDB.ConfigSet(ctx, "slowlog-log-slower-than", "2000").Err())
	require.NoError(t, s.RDB.ConfigSet(ctx, "slowlog-max-len", "4096").Err())
	require.NoError(t, s.RDB.SlowLogReset(ctx).Err())
	hwmBefore := peakRSS(t, a)
	require.NoError(t, s.RDB.FlushAll(ctx).Err())

	// The first read rebuilds the SKU (the binary's rebuilder may start it a
	// moment earlier; either way this read waits for it).
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	r := post(rctx, &http.Client{Timeout: 60 * time.Second}, a.URL, "", `query($sku: ID!) { product(sku: $sku) { stock { available held sold total } } }`,
		map[string]any{"sku": sku})
	cancel()
	readTook := time.Since(start)
	require.NoError(t, r.Err)
	require.Empty(t, r.Errors)
	var out struct {
		Product struct{ Stock stock } `json:"product"`
	}
	require.NoError(t, json.Unmarshal(r.Data, &out))
	got := out.Product.Stock

	// Counters: exactly the ledger's.
	var total, pgSold, pgHeld int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT total, sold, (SELECT coalesce(sum(quantity), 0)::int FROM reservations
		WHERE sku = $1 AND status = 'HELD') FROM products WHERE sku = $1`, sku).Scan(&total, &pgSold, &pgHeld))
	require.Equal(t, committed+1, pgSold)
	require.Equal(t, held, pgHeld)
	require.Equal(t, stock{Total: total, Sold: pgSold, Held: pgHeld, Available: total - pgSold - pgHeld}, got)
	require.Equal(t, 9, got.Available)
	require.Less(t, readTook, 45*time.Second, "the rebuild is bounded (it gives up at a minute)")

	// Every live hold, and a sample of the rest, has its ledger status, in
	// the SKU's generation; every live hold is in the expiry index at its expiry.
	gen, err := s.RDB.HGet(ctx, s.Keys.SKU(sku), "gen").Result()
	require.NoError(t, err)
	rows, err := s.Pool.Query(ctx, `SELECT token, status, (extract(epoch FROM expires_at) * 1000)::bigint FROM reservations WHERE sku = $1`, sku)
	require.NoError(t, err)
	type row struct {
		token, status string
		exp           int64
	}
	var check []row
	for rows.Next() {
		var x row
		require.NoError(t, rows.Scan(&x.token, &x.status, &x.exp))
		if x.status == "HELD" || rand.IntN(50) == 0 {
			check = append(check, x)
		}
	}
	require.NoError(t, rows.Err())
	part := inventory.PartitionOf(sku)
	liveHolds := 0
	for i := 0; i < len(check); i += 5000 {
		batch := check[i:min(i+5000, len(check))]
		hmgets := make([]*redis.SliceCmd, len(batch))
		scores := make([]*redis.FloatCmd, len(batch))
		_, err := s.RDB.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, x := range batch {
				hmgets[j] = p.HMGet(ctx, s.Keys.Hold(part, x.token), "st", "gen", "exp")
				scores[j] = p.ZScore(ctx, s.Keys.Expiry(part), x.token)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			require.NoError(t, err)
		}
		for j, x := range batch {
			v := hmgets[j].Val()
			require.Equal(t, []any{x.status, gen}, v[:2], "token %s", x.token)
			if x.status == "HELD" {
				liveHolds++
				require.Equal(t, strconv.FormatInt(x.exp, 10), v[2], "token %s", x.token)
				require.Equal(t, float64(x.exp), scores[j].Val(), "token %s in the expiry index", x.token)
			}
		}
	}
	require.Equal(t, held, liveHolds)

	// Quotas: one count per principal, exactly their live holds and purchases.
	want := map[string]string{}
	qrows, err := s.Pool.Query(ctx, `SELECT principal, sum(quantity)::text FROM (
			SELECT principal, quantity FROM reservations WHERE sku = $1 AND status = 'HELD'
			UNION ALL SELECT principal, quantity FROM sales WHERE sku = $1) q GROUP BY principal`, sku)
	require.NoError(t, err)
	for qrows.Next() {
		var who, n string
		require.NoError(t, qrows.Scan(&who, &n))
		want[who] = n
	}
	require.NoError(t, qrows.Err())
	quota, err := s.RDB.HGetAll(ctx, s.Keys.Quota(sku)).Result()
	require.NoError(t, err)
	require.Equal(t, want, quota)

	// Keys of finished reservations replay them; reserves and commits work.
	tok, status, errs := reserve("k-sold")
	require.Empty(t, errs)
	require.Equal(t, []string{sold, "COMMITTED"}, []string{tok, status})
	tok, status, errs = reserve("k-cancelled")
	require.Empty(t, errs)
	require.Equal(t, []string{cancelled, "CANCELLED"}, []string{tok, status})
	fresh, status, errs := reserve("")
	require.Empty(t, errs)
	require.Equal(t, "HELD", status)
	end(commitMutation, "commit", fresh, "COMMITTED")
	var seen struct {
		Reservation struct{ Token, Status string } `json:"reservation"`
	}
	s.mustGQL(a, buyer, reservationQuery, map[string]any{"token": fresh}, &seen)
	require.Equal(t, "COMMITTED", seen.Reservation.Status)
	st := s.stockOf(sku)
	require.Equal(t, stock{Total: total, Sold: pgSold + 1, Held: held, Available: 8}, st)

	// The figures: the binary's own account of the rebuild, Redis' longest
	// script, and the process's peak memory.
	var logged struct {
		Reservations   int   `json:"reservations"`
		Chunks         int   `json:"chunks"`
		LongestChunkMs int64 `json:"longest_chunk_ms"`
		ChunksMs       int64 `json:"chunks_ms"`
		FirstRowsMs    int64 `json:"first_rows_ms"`
		TookMs         int64 `json:"took_ms"`
	}
	for _, line := range strings.Split(a.log.String(), "\n") {
		if strings.Contains(line, "rebuilt SKU in Redis from Postgres") && strings.Contains(line, `"`+sku+`"`) {
			require.NoError(t, json.Unmarshal([]byte(line), &logged))
		}
	}
	require.Equal(t, held+committed+finished+2, logged.Reservations, "one rebuild, of every reservation")
	slow, err := s.RDB.SlowLogGet(ctx, 4096).Result()
	require.NoError(t, err)
	var longest time.Duration
	scripts := 0
	for _, e := range slow {
		if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "evalsha") {
			scripts++
			longest = max(longest, e.Duration)
		}
	}
	require.Less(t, longest, time.Second, "no script blocks Redis for long (Redis calls a script busy at 5 s)")
	mem, err := s.RDB.Info(ctx, "memory").Result()
	require.NoError(t, err)
	t.Logf("FIGURES rebuild-200k: reservations=%d chunks=%d first_read=%s rebuild_took=%dms first_rows=%dms chunks_total=%dms longest_chunk_roundtrip=%dms "+
		"scripts_over_2ms=%d longest_script=%s peak_rss_before=%dMiB peak_rss_after=%dMiB redis_%s seed=%s test=%s",
		logged.Reservations, logged.Chunks, readTook.Round(time.Millisecond), logged.TookMs, logged.FirstRowsMs, logged.ChunksMs, logged.LongestChunkMs,
		scripts, longest.Round(time.Millisecond), hwmBefore>>10, peakRSS(t, a)>>10, infoField(mem, "used_memory_human"),
		seedTook.Round(time.Millisecond), time.Since(testStart).Round(time.Second))
}

// seedReservations writes a SKU's history straight into the ledger, as
// commits and the write-behind would have left it: held live holds (due in
// an hour), committed sales of the last day with their reservations,
// finished cancelled and expired reservations with idempotency keys, one
// unit each, spread over principals principals; products.sold and total
// follow.
func seedReservations(t *testing.T, s *system, sku string, held, committed, finished, principals int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// 26 characters of the token alphabet (16 bytes): the kind, 'seed', i, 'a'.
	tok := `$2 || $3 || 'seed' || translate(lpad(i::text, 20, '0'), '0189', 'wxyz') || 'a'`
	who := `'seed-' || (i % $4)`
	prefix := fmt.Sprintf("r%02d.", inventory.PartitionOf(sku))
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	exec := func(label string, n int, query string) {
		_, err := tx.Exec(ctx, query, sku, prefix, label, principals, n)
		require.NoError(t, err, label)
	}
	exec("h", held, `INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at)
		SELECT `+tok+`, $1, `+who+`, 1, 'HELD', CASE WHEN i % 3 = 0 THEN md5('ih' || i) END, CASE WHEN i % 3 = 0 THEN md5('rh' || i) END,
			date_trunc('milliseconds', now()) + interval '1 hour', now() - interval '20 minutes' + i * interval '1 microsecond'
		FROM generate_series(1, $5) i`)
	exec("c", committed, `WITH r AS (
			INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at, committed_at)
			SELECT `+tok+`, $1, `+who+`, 1, 'COMMITTED', md5('ic' || i), md5('rc' || i),
				now() - interval '3 hours', now() - interval '4 hours', now() - interval '3 hours' + i * interval '1 microsecond'
			FROM generate_series(1, $5) i RETURNING token, sku, principal, quantity, committed_at)
		INSERT INTO sales (token, sku, principal, quantity, committed_at) SELECT * FROM r`)
	exec("f", finished, `INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at, ended_at)
		SELECT `+tok+`, $1, `+who+`, 1, CASE WHEN i % 2 = 0 THEN 'CANCELLED' ELSE 'EXPIRED' END, md5('if' || i), md5('rf' || i),
			now() - interval '1 minute', now() - interval '2 hours' + i * interval '1 microsecond', now() - interval '1 minute'
		FROM generate_series(1, $5) i`)
	_, err = tx.Exec(ctx, `UPDATE products SET total = total + $2, sold = sold + $3 WHERE sku = $1`, sku, held+committed, committed)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

// peakRSS is the process's peak resident memory in KiB (VmHWM).
func peakRSS(t *testing.T, p *proc) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	return 0
}

func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return field + "=" + v
		}
	}
	return field + "=?"
}
