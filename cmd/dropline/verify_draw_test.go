package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// TestVerifyDraw runs the verifier against a real draw of 5,000 entries
// (the engine's, carried to Redis) and then against the same draw tampered
// with in the ledger: two entries' places swapped, a loser recorded as a
// winner, a winner's reservation missing, a winner's reservation for more
// units, units held by another buyer when the draw ran, and another seed.
// Only the real one verifies.
func TestVerifyDraw(t *testing.T) {
	t.Parallel()
	const sku = "VERIFY-1"
	s := newVerifySetup(t, inventory.ProductInput{
		SKU: sku, Name: "Draw", Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 700,
		Draw: &inventory.DrawInput{ClosesAt: time.Now().Add(time.Hour), WinnerHold: time.Minute},
	})
	ctx, dbURL, pool, e := s.ctx, s.dbURL, s.pool, s.e
	envm := map[string]string{"DATABASE_URL": dbURL}

	code, _, errOut := runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "revealed only once it is drawn")

	_, err := pool.Exec(ctx, `INSERT INTO draw_entries (sku, principal, quantity)
		SELECT $1, 'entrant-' || g, 1 + g % 3 FROM generate_series(1, 5000) g`, sku)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = $1`, sku)
	require.NoError(t, err)
	_, err = e.Draws().RunDraw(ctx, sku)
	require.NoError(t, err)

	code, out, errOut := runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "draw of VERIFY-1 verified: 5000 entries, 700 units")
	t.Log(out)

	tamper := func(t *testing.T, sqls ...string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		for _, q := range sqls {
			_, err := tx.Exec(ctx, q)
			require.NoError(t, err, q)
		}
		require.NoError(t, tx.Commit(ctx))
	}
	// Two places swapped (a winner and a loser trade their places).
	tamper(t, `UPDATE draw_results SET place = place + 1000000 WHERE place IN (1, 5000)`,
		`UPDATE draw_results SET place = CASE WHEN place = 1000001 THEN 5000 ELSE 1 END WHERE place > 1000000`)
	code, out, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "does NOT verify")
	require.Contains(t, out, "recorded place")
	tamper(t, `UPDATE draw_results SET place = place + 1000000 WHERE place IN (1, 5000)`,
		`UPDATE draw_results SET place = CASE WHEN place = 1000001 THEN 5000 ELSE 1 END WHERE place > 1000000`)
	code, _, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 0, code, errOut, "swapped back, it verifies again")

	// A loser turned winner.
	tamper(t, `UPDATE draw_results SET won = true, token = 'forged' WHERE place = (SELECT min(place) FROM draw_results WHERE NOT won)`)
	code, _, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "does NOT verify")
	tamper(t, `UPDATE draw_results SET won = false, token = NULL WHERE token = 'forged'`)

	// What the draw handed out: a winner without its reservation, one whose
	// reservation is for more units, and units held by someone else when the
	// draw ran, which it gave out as if they were free.
	tamper(t, `UPDATE reservations SET token = token || '-gone' WHERE token = (SELECT token FROM draw_results WHERE won AND place = (SELECT min(place) FROM draw_results WHERE won))`)
	code, out, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "does NOT verify")
	require.Contains(t, out, "no reservation under its token")
	tamper(t, `UPDATE reservations SET token = left(token, -5) WHERE token LIKE '%-gone'`)
	tamper(t, `UPDATE reservations SET quantity = quantity + 1 WHERE token = (SELECT token FROM draw_results WHERE won AND place = (SELECT max(place) FROM draw_results WHERE won))`)
	code, out, _ = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "its reservation is")
	tamper(t, `UPDATE reservations SET quantity = quantity - 1 WHERE token = (SELECT token FROM draw_results WHERE won AND place = (SELECT max(place) FROM draw_results WHERE won))`)
	tamper(t, `INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		SELECT 'cart-line', 'VERIFY-1', 'cart-buyer', 3, 'COMMITTED', drawn_at, drawn_at - interval '1 minute' FROM draws WHERE sku = 'VERIFY-1'`)
	code, out, _ = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "the draw gave out 700 units, but 697 were free when it ran")
	tamper(t, `DELETE FROM reservations WHERE token = 'cart-line'`)
	code, _, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 0, code, errOut, "put back, it verifies again")

	// Another seed: it no longer hashes to what was published.
	tamper(t, `UPDATE draws SET seed = sha256(seed) WHERE sku = 'VERIFY-1'`)
	code, _, errOut = runCmd(t, envm, "verify-draw", "--sku", sku)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "does not hash to the published seedHash")
}
