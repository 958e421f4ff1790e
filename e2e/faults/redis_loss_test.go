package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Cancel, re-reserve, flush: buyer A holds the only unit, the write-behind
// records the hold, A cancels, buyer B takes the freed unit, and Redis is
// flushed within 0-80 ms, while A's cancel and B's reserve may still be on their
// way to Postgres. Every round must end right: A's commit is refused as
// cancelled (never sold), B's hold is alive (its commit succeeds) or
// honestly lost with Redis (NOT_FOUND or EXPIRED, never sold), and the
// ledger and Redis agree row by row.
func TestCancelReReserveFlush(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.start("a")
	rounds := scale(20, 60)
	d := startDrop(s, dropConfig{SKU: "CRF-BASE", Total: 1, Buyers: -1, HoldSeconds: 30})
	d.wait(t)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var bAlive, bLost int
	for i := 0; i < rounds; i++ {
		sku := fmt.Sprintf("CRF-%03d", i)
		s.createProduct(s.live()[0], sku, 1, 0)
		alice, bob := fmt.Sprintf("crf-a-%03d", i), fmt.Sprintf("crf-b-%03d", i)
		ta, tb := s.token(alice, false), s.token(bob, false)
		a := d.call(ctx, client, ta, "reserve", reserveMutation, map[string]any{"input": map[string]any{
			"sku": sku, "quantity": 1, "idempotencyKey": "a-" + sku, "holdSeconds": 30}})
		require.True(t, a.OK && a.Code == "", "round %d: A's reserve: %+v", i, a)
		eventually(t, 10*time.Second, "the write-behind recorded A's hold", func() (bool, string) {
			n := s.scalar(`SELECT count(*)::int FROM reservations WHERE token = $1`, a.Token)
			return n == 1, fmt.Sprintf("rows %d", n)
		})
		c := d.call(ctx, client, ta, "cancel", cancelMutation, map[string]any{"token": a.Token})
		require.True(t, c.OK && c.Code == "" && c.Status == "CANCELLED", "round %d: A's cancel: %+v", i, c)
		b := d.call(ctx, client, tb, "reserve", reserveMutation, map[string]any{"input": map[string]any{
			"sku": sku, "quantity": 1, "idempotencyKey": "b-" + sku, "holdSeconds": 5}})
		require.True(t, b.OK && b.Code == "", "round %d: B's reserve: %+v", i, b)
		// The flush lands at another point of the write-behind's cycle each
		// round: before it read B's reserve, or while it writes it.
		time.Sleep(time.Duration(i%5) * 20 * time.Millisecond)
		require.NoError(t, s.RDB.FlushDB(ctx).Err())

		ac := d.call(ctx, client, ta, "commit", commitMutation, map[string]any{"token": a.Token})
		require.True(t, ac.OK, "round %d: A's commit undecided", i)
		require.Equal(t, "ALREADY_CANCELLED", ac.Code, "round %d: A's commit after its cancel: %+v", i, ac)
		bc := d.call(ctx, client, tb, "commit", commitMutation, map[string]any{"token": b.Token})
		require.True(t, bc.OK, "round %d: B's commit undecided", i)
		switch {
		case bc.Code == "" && bc.Status == "COMMITTED":
			bAlive++
		case bc.Code == "NOT_FOUND" || bc.Code == "EXPIRED":
			bLost++
		default:
			t.Fatalf("round %d: B's commit answered %+v", i, bc)
		}
		sold := s.scalar(`SELECT count(*)::int FROM sales WHERE token = $1`, a.Token)
		require.Zero(t, sold, "round %d: A's cancelled hold was sold", i)
	}
	for i := 0; i < rounds; i++ {
		sku := fmt.Sprintf("CRF-%03d", i)
		s.settled(t, sku, 40*time.Second)
		s.requireLedgerAgreesWithRedis(t, sku)
		require.Zero(t, s.scalar(`SELECT count(*)::int FROM (SELECT token FROM stock_movements
			WHERE sku = $1 AND kind IN ('commit', 'cancel', 'expire') GROUP BY token HAVING count(*) > 1) x`, sku),
			"%s: a hold was released twice or both sold and released in the ledger", sku)
	}
	repaired := strings.Count(s.live()[0].log.String(), "told a rebuilt SKU what the ledger says")
	t.Logf("FIGURES cancel-reserve-flush: rounds=%d a_commit_refused=%d b_alive=%d b_lost=%d holds_repaired=%d requests=%d retries=%d",
		rounds, rounds, bAlive, bLost, repaired, d.Requests.Load(), d.Retries.Load())
}

// Commit, flush, retry: a buyer reserves with an idempotency key, commits,
// and Redis is flushed at once (the reserve event may not have reached
// Postgres, the sale has). Retrying the reserve with the same key must
// replay the sold hold, never make a second one.
func TestCommitFlushIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.start("a")
	rounds := scale(20, 60)
	d := startDrop(s, dropConfig{SKU: "CFI-1", Total: rounds + 5, Buyers: -1, HoldSeconds: 30})
	d.wait(t)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := 0; i < rounds; i++ {
		user := fmt.Sprintf("cfi-%03d", i)
		bearer := s.token(user, false)
		vars := map[string]any{"input": map[string]any{"sku": "CFI-1", "quantity": 1, "idempotencyKey": "k-" + user, "holdSeconds": 30}}
		r := d.call(ctx, client, bearer, "reserve", reserveMutation, vars)
		require.True(t, r.OK && r.Code == "", "round %d: reserve: %+v", i, r)
		c := d.call(ctx, client, bearer, "commit", commitMutation, map[string]any{"token": r.Token})
		require.True(t, c.OK && c.Code == "" && c.Status == "COMMITTED", "round %d: commit: %+v", i, c)
		d.mu.Lock()
		d.holds[r.Token] = holdInfo{Buyer: user, Qty: 1}
		d.committed[r.Token] = true
		d.mu.Unlock()
		require.NoError(t, s.RDB.FlushDB(ctx).Err())
		again := d.call(ctx, client, bearer, "reserve", reserveMutation, vars)
		require.True(t, again.OK && again.Code == "", "round %d: retried reserve: %+v", i, again)
		require.Equal(t, r.Token, again.Token, "round %d: the retry made a second hold", i)
		require.Equal(t, "COMMITTED", again.Status, "round %d", i)
	}
	d.verify(t, verifyOpts{RedisLost: true})
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM (SELECT principal FROM reservations WHERE sku = 'CFI-1'
		GROUP BY principal HAVING count(*) > 1) x`), "a buyer got two holds for one idempotency key")
	require.Equal(t, rounds, s.scalar(`SELECT count(*)::int FROM sales WHERE sku = 'CFI-1'`))
	t.Logf("FIGURES commit-flush-idempotency: rounds=%d replayed=%d requests=%d retries=%d",
		rounds, rounds, d.Requests.Load(), d.Retries.Load())
}
