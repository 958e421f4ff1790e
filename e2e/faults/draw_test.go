package faults

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDrawKilledMidway kills (SIGKILL) the server running a draw of 3,000
// entries, twice: once with the result computed inside the draw's Postgres
// transaction but not committed, once with the result committed and its
// first batch of 1,000 entries written to Redis, the rest not. The server is
// held at those points by the test-only DROPLINE_TEST_DRAW_PAUSE. Each time
// a server started afterwards takes the dead one's lease and finishes the
// draw: it is drawn once (a committed result is the one carried on, and
// `dropline verify-draw` recomputes it from the revealed seed), every winner
// holds exactly one HELD reservation of its quantity, in Redis and in the
// ledger, the losers wait in draw order, and the stock's held units are the
// winners', no more.
func TestDrawKilledMidway(t *testing.T) {
	t.Parallel()
	for round, at := range []string{"decided", "applied"} {
		t.Run(at, func(t *testing.T) { drawKilledAt(t, round, at) })
	}
}

// drawKilledAt is one round of TestDrawKilledMidway, on its own system: the
// victim alone holds every lease until it dies.
func drawKilledAt(t *testing.T, round int, at string) {
	s := newSystem(t)
	s.Env["DROPLINE_LEASE_TTL"] = "2s"
	const entries, units = 3000, 4000
	{
		sku := skuIn(fmt.Sprintf("DRAWKILL%d", round), 1)
		s.Env["DROPLINE_TEST_DRAW_PAUSE"] = at + ":30s"
		victim := s.start(fmt.Sprintf("victim-%d", round))
		var created struct {
			CreateProduct struct {
				UserErrors []userError `json:"userErrors"`
			} `json:"createProduct"`
		}
		s.mustGQL(victim, s.token("ops", true),
			`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
			map[string]any{"input": map[string]any{"sku": sku, "name": "Draw " + sku, "price": map[string]any{"amount": 999, "currency": "EUR"},
				"stock": units, "draw": map[string]any{"closesAt": time.Now().Add(time.Hour).Format(time.RFC3339), "winnerHoldSeconds": 600}}},
			&created)
		require.Empty(t, created.CreateProduct.UserErrors)
		ctx := context.Background()
		_, err := s.Pool.Exec(ctx, `INSERT INTO draw_entries (sku, principal, quantity)
			SELECT $1, 'entrant-' || g, 1 + g % 3 FROM generate_series(1, $2) g`, sku, entries)
		require.NoError(t, err)
		_, err = s.Pool.Exec(ctx, `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = $1`, sku)
		require.NoError(t, err)

		step := map[string]string{"decided": "draw decided, not committed", "applied": "first batch of the draw applied"}[at]
		eventually(t, 30*time.Second, "the victim pauses at "+step, func() (bool, string) {
			return strings.Contains(victim.log.String(), step), "not yet"
		})
		var committed string
		switch at {
		case "decided":
			require.Equal(t, 0, s.scalar(`SELECT count(*) FROM draws WHERE sku = $1 AND status = 'DRAWN'`, sku), "not committed yet")
			require.Equal(t, 0, s.scalar(`SELECT count(*) FROM draw_results WHERE sku = $1`, sku))
			st, ok := s.redisStock(ctx, sku)
			require.True(t, ok)
			require.Equal(t, 0, st.Held, "nothing reached Redis")
		case "applied":
			require.Equal(t, 1, s.scalar(`SELECT count(*) FROM draws WHERE sku = $1 AND status = 'DRAWN' AND applied_at IS NULL`, sku))
			committed = s.resultDigest(sku)
			st, ok := s.redisStock(ctx, sku)
			require.True(t, ok)
			winnersUnits := s.scalar(`SELECT coalesce(sum(e.quantity), 0)::int FROM draw_results r JOIN draw_entries e ON e.id = r.entry_id WHERE r.sku = $1 AND r.won`, sku)
			require.Positive(t, st.Held, "the first batch's winners hold their units")
			require.Less(t, st.Held, winnersUnits, "later batches' winners do not yet")
		}
		victim.kill(t)
		killed := time.Now()
		delete(s.Env, "DROPLINE_TEST_DRAW_PAUSE")
		s.start(fmt.Sprintf("restarted-%d", round))

		eventually(t, 30*time.Second, "the draw is finished by the restarted server", func() (bool, string) {
			n := s.scalar(`SELECT count(*) FROM draws WHERE sku = $1 AND applied_at IS NOT NULL`, sku)
			return n == 1, "not applied yet"
		})
		t.Logf("killed at %q: the draw finished %v after the kill", step, time.Since(killed).Round(time.Millisecond))
		if committed != "" {
			require.Equal(t, committed, s.resultDigest(sku), "the committed result is the one carried on")
		}

		cmd := exec.Command(binary, "verify-draw", "--sku", sku)
		cmd.Env = []string{"DATABASE_URL=" + s.DBURL, "DROPLINE_DEV=1"}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "verify-draw: %s", out)
		require.Contains(t, string(out), fmt.Sprintf("draw of %s verified: %d entries, %d units", sku, entries, units))
		t.Logf("%s", strings.TrimSpace(string(out)))

		s.requireDrawCarried(t, sku, units)
	}
}

// resultDigest is a digest of a SKU's recorded draw result, row by row.
func (s *system) resultDigest(sku string) string {
	s.t.Helper()
	var d string
	require.NoError(s.t, s.Pool.QueryRow(context.Background(),
		`SELECT md5(string_agg(place || ':' || entry_id || ':' || won || ':' || coalesce(token, ''), ',' ORDER BY place)) FROM draw_results WHERE sku = $1`,
		sku).Scan(&d))
	return d
}

// requireDrawCarried checks Redis and the ledger against a drawn SKU's
// recorded result, entry by entry: each winner's hold is HELD in Redis under
// its token with its quantity, the ledger has exactly one HELD reservation
// per winner and none for anyone else, the stock's held units are the
// winners' and it balances, and the losers wait in draw order in Redis and
// in the ledger.
func (s *system) requireDrawCarried(t *testing.T, sku string, units int) {
	t.Helper()
	ctx := context.Background()
	rows, err := s.Pool.Query(ctx, `SELECT r.place, e.principal, e.quantity, r.won, coalesce(r.token, '')
		FROM draw_results r JOIN draw_entries e ON e.id = r.entry_id WHERE r.sku = $1 ORDER BY r.place`, sku)
	require.NoError(t, err)
	type result struct {
		place     int
		principal string
		quantity  int
		won       bool
		token     string
	}
	var results []result
	for rows.Next() {
		var r result
		require.NoError(t, rows.Scan(&r.place, &r.principal, &r.quantity, &r.won, &r.token))
		results = append(results, r)
	}
	require.NoError(t, rows.Err())
	part := s.Keys.PartitionOf(sku)
	won, wonUnits, losers := map[string]result{}, 0, []string{}
	for _, r := range results {
		if !r.won {
			losers = append(losers, r.principal)
			continue
		}
		won[r.principal] = r
		wonUnits += r.quantity
		h, err := s.RDB.HGetAll(ctx, s.Keys.Hold(part, r.token)).Result()
		require.NoError(t, err)
		require.Equal(t, "HELD", h["st"], "winner %s", r.principal)
		require.Equal(t, r.principal, h["who"])
		require.Equal(t, strconv.Itoa(r.quantity), h["qty"])
	}
	require.LessOrEqual(t, wonUnits, units)
	require.Greater(t, wonUnits, units-3, "the stock is filled but for less than the largest quantity")
	st, ok := s.redisStock(ctx, sku)
	require.True(t, ok)
	require.Equal(t, stock{Total: units, Available: units - wonUnits, Held: wonUnits}, st, "held units are exactly the winners'")

	queue, err := s.RDB.ZRange(ctx, s.Keys.WaitQueue(sku), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, losers, queue, "losers wait in draw order")

	eventually(t, 30*time.Second, "the ledger has the winners' holds and the losers' places", func() (bool, string) {
		held := s.scalar(`SELECT count(*) FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
		waiting := s.scalar(`SELECT count(*) FROM waitlist_entries WHERE sku = $1 AND status = 'WAITING'`, sku)
		return held == len(won) && waiting == len(losers), fmt.Sprintf("%d of %d holds, %d of %d waiters", held, len(won), waiting, len(losers))
	})
	hrows, err := s.Pool.Query(ctx, `SELECT principal, token, quantity FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
	require.NoError(t, err)
	seen := map[string]bool{}
	for hrows.Next() {
		var who, token string
		var qty int
		require.NoError(t, hrows.Scan(&who, &token, &qty))
		w, ok := won[who]
		require.True(t, ok, "%s holds a unit and did not win", who)
		require.False(t, seen[who], "%s holds twice", who)
		seen[who] = true
		require.Equal(t, w.token, token)
		require.Equal(t, w.quantity, qty)
	}
	require.NoError(t, hrows.Err())
	wrows, err := s.Pool.Query(ctx, `SELECT principal FROM waitlist_entries WHERE sku = $1 AND status = 'WAITING' ORDER BY seq`, sku)
	require.NoError(t, err)
	var ledgerQueue []string
	for wrows.Next() {
		var who string
		require.NoError(t, wrows.Scan(&who))
		ledgerQueue = append(ledgerQueue, who)
	}
	require.NoError(t, wrows.Err())
	require.Equal(t, losers, ledgerQueue, "the ledger's waitlist is the losers in draw order")
}
