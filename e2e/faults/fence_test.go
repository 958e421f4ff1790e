package faults

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/worker"
)

// A writer paused longer than its lease, in-process with a 2 s lease
// (the server's LeaseTTL is 10 s and not configurable from the
// environment): while it sleeps, a successor acquires the lease with a
// larger fencing token and writes; when the paused writer resumes it no
// longer counts the lease as held, cannot renew it, and the batch it had
// prepared before the pause is refused by Postgres with db.ErrFenced and
// leaves no trace.
func TestFencedWriterAfterPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.Redis(t)
	pool := testenv.Postgres(t)
	eng, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	_, err = eng.Catalog().CreateProduct(ctx, inventory.Principal{ID: "ops", Admin: true}, inventory.ProductInput{
		SKU: "FENCE-1", Name: "Fence", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 10})
	require.NoError(t, err)
	ledger := db.NewLedger(pool)

	key := r.Prefix + "{p00}:lease:flusher"
	cfg := worker.LeaseConfig{Key: key, FenceKey: key + ":fence", TTL: 2 * time.Second} // Fence is ok for 1.33 s after an Acquire, ample on a loaded machine
	cfg.Owner = "paused"
	paused := worker.NewLease(r.Client, cfg)
	cfg.Owner = "successor"
	successor := worker.NewLease(r.Client, cfg)

	ok, err := paused.Acquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	stale, ok := paused.Fence()
	require.True(t, ok)
	event := func(tok string) db.Event {
		now := time.Now()
		return db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "FENCE-1", Principal: "p",
			Quantity: 1, ExpiresAt: now.Add(time.Minute), CreatedAt: now, At: now}
	}
	require.NoError(t, ledger.ApplyEvents(ctx, &stale, []db.Event{event("before-pause")}))

	// The pause: the holder renews nothing; the successor waits for the
	// lease to be free, as a live process would.
	eventually(t, 5*time.Second, "the successor takes the lease", func() (bool, string) {
		ok, err := successor.Acquire(ctx)
		return err == nil && ok, "lease still held"
	})
	fresh, ok := successor.Fence()
	require.True(t, ok)
	require.Greater(t, fresh.Token, stale.Token)
	require.NoError(t, ledger.ApplyEvents(ctx, &fresh, []db.Event{event("successor")}))

	// The paused holder resumes.
	require.False(t, paused.Held(), "a holder past two thirds of its TTL stops acting")
	_, ok = paused.Fence()
	require.False(t, ok)
	renewed, err := paused.Renew(ctx)
	require.NoError(t, err)
	require.False(t, renewed, "the lease is the successor's")
	err = ledger.ApplyEvents(ctx, &stale, []db.Event{event("stale")})
	require.True(t, errors.Is(err, db.ErrFenced), "stale batch: %v", err)

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stock_movements WHERE token = 'stale'`).Scan(&n))
	require.Zero(t, n, "the fenced batch left nothing behind")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE token = 'stale'`).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stock_movements WHERE token IN ('before-pause', 'successor')`).Scan(&n))
	require.Equal(t, 2, n)
	t.Logf("FIGURES fencing: stale_writes=1 refused=1 violations=0")
}

// The model refuses what it must: a second hold on the last unit, a sale
// after an expiry, a release of a sold unit. Without this the
// linearizability check could pass vacuously.
func TestStockModelRejectsBadHistories(t *testing.T) {
	t.Parallel()
	model := stockModel(1)
	op := func(id int, in lzInput, call, ret int64, out lzOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret}
	}
	good := []porcupine.Operation{
		op(1, lzInput{Kind: opReserve, Qty: 1}, 0, 10, lzOutput{Token: "a", ExpMs: 1000}),
		op(2, lzInput{Kind: opReserve, Qty: 1}, 5, 15, lzOutput{Code: "OUT_OF_STOCK"}),
		op(1, lzInput{Kind: opCommit, Token: "a"}, 20, 30, lzOutput{Status: "COMMITTED", RetMs: 1}),
	}
	require.True(t, porcupine.CheckOperations(model, good))
	oversell := []porcupine.Operation{
		op(1, lzInput{Kind: opReserve, Qty: 1}, 0, 10, lzOutput{Token: "a"}),
		op(2, lzInput{Kind: opReserve, Qty: 1}, 5, 15, lzOutput{Token: "b"}),
	}
	require.False(t, porcupine.CheckOperations(model, oversell))
	soldAndReleased := []porcupine.Operation{
		op(1, lzInput{Kind: opReserve, Qty: 1}, 0, 10, lzOutput{Token: "a", ExpMs: 1000}),
		op(1, lzInput{Kind: opCommit, Token: "a"}, 20, 30, lzOutput{Status: "COMMITTED", RetMs: 1}),
		op(3, lzInput{Kind: opExpire, Token: "a"}, 40, 50, lzOutput{}),
	}
	require.False(t, porcupine.CheckOperations(model, soldAndReleased))
	staleStock := []porcupine.Operation{
		op(1, lzInput{Kind: opReserve, Qty: 1}, 0, 10, lzOutput{Token: "a", ExpMs: 1000}),
		op(1, lzInput{Kind: opCancel, Token: "a"}, 20, 30, lzOutput{Status: "CANCELLED", RetMs: 1}),
		op(2, lzInput{Kind: opReserve, Qty: 1}, 40, 50, lzOutput{Code: "OUT_OF_STOCK"}),
	}
	require.False(t, porcupine.CheckOperations(model, staleStock))
}
