package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// wipe deletes every key of the test's prefix, as a FLUSHALL would.
func (b *bundle) wipe(t *testing.T) {
	t.Helper()
	iter := b.rdb.Scan(b.ctx, 0, b.prefix+"*", 1000).Iterator()
	for iter.Next(b.ctx) {
		require.NoError(t, b.rdb.Del(b.ctx, iter.Val()).Err())
	}
	require.NoError(t, iter.Err())
}

// outbox reads every outbox event without applying it.
func (b *bundle) outbox(t *testing.T) []db.Event {
	t.Helper()
	var events []db.Event
	for p := range inventory.Partitions {
		msgs, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(p), "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			ev, err := inventory.ParseEvent(m)
			require.NoError(t, err)
			events = append(events, ev)
		}
	}
	return events
}

func (b *bundle) holdStatus(t *testing.T, sku, token string) string {
	t.Helper()
	st, err := b.rdb.HGet(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf(sku), token), "st").Result()
	require.NoError(t, err)
	return st
}

func (b *bundle) ledgerStatus(t *testing.T, token string) string {
	t.Helper()
	var st string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM reservations WHERE token = $1`, token).Scan(&st))
	return st
}

// The flusher has read a batch (A's cancel, and the reserve of B who took
// the freed unit) when Redis loses its data and the SKU is rebuilt from the
// ledger, which still has A as HELD and knows nothing of B. After writing the
// batch, the flusher tells Redis: A is released, B adopted.
func TestFlusherTellsARebuiltSKUWhatTheLedgerSays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sku = "LATE-1"
	b.product(t, sku, 1)
	alice, bob := inventory.Principal{ID: "alice"}, inventory.Principal{ID: "bob"}
	a, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)
	require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, b.outbox(t)))
	// The cancel's instance cannot reach Postgres: only the outbox records it.
	deadPool, err := pgxpool.New(b.ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(deadPool.Close)
	dead, err := inventory.NewEngine(b.ctx, inventory.Config{KeyPrefix: b.prefix}, b.rdb, deadPool, zerolog.Nop())
	require.NoError(t, err)
	_, err = dead.Cancel(b.ctx, alice, a.Token)
	require.NoError(t, err)
	bh, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	f := NewFlusher(FlusherConfig{Options: fastConfig("late").Options, PollInterval: 20 * time.Millisecond},
		b.engine.Maintenance(), b.rdb, b.log, reg)
	var once sync.Once
	f.hooks.beforeApply = func(_ int, events []db.Event) {
		for _, ev := range events {
			if ev.ID == "cancel:"+a.Token {
				once.Do(func() {
					b.wipe(t)
					require.NoError(t, b.engine.Rebuild(context.WithoutCancel(b.ctx), sku))
				})
			}
		}
	}
	f.initSignals()
	require.NoError(t, f.Start(b.ctx))
	t.Cleanup(func() { stop(t, f) })
	// A batch is counted as applied after Redis heard what it changed.
	waitUntil(t, 10*time.Second, "the flusher reconciled both holds",
		func() bool { return metric(t, reg, "dropline_writebehind_holds_reconciled_total") == 2 }, f.applied.C())
	require.Equal(t, "CANCELLED", b.holdStatus(t, sku, a.Token))
	require.Equal(t, "HELD", b.holdStatus(t, sku, bh.Token))
	s := b.stock(t, sku)
	require.Equal(t, 1, s.Held)
	require.Zero(t, s.Available)
	require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, a.Token))
	require.Equal(t, db.StatusHeld, b.ledgerStatus(t, bh.Token))
	_, err = b.engine.Commit(b.ctx, alice, a.Token)
	require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
}

// A reserve that reached the ledger after its SKU was rebuilt without it,
// and that nothing told Redis about: once past its expiry (plus the grace),
// the commit reconciler closes it as EXPIRED, through the outbox, once.
func TestReconcilerClosesOverdueHoldsRedisDoesNotHave(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sku = "OVERDUE-1"
	b.product(t, sku, 2)
	a, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "alice"}, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
	require.NoError(t, err)
	inFlight := b.outbox(t)
	b.wipe(t)
	require.NoError(t, b.engine.Rebuild(b.ctx, sku))
	require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
	require.Equal(t, db.StatusHeld, b.ledgerStatus(t, a.Token))

	cfg := fastConfig("overdue")
	cfg.Reconciler.OverdueGrace = 200 * time.Millisecond
	g, reg := b.startGroup(t, cfg)
	waitTotal(t, "the reconciler closes the overdue hold, once", 1, closedOverdue(g))
	// The expiry reaches the ledger through the outbox.
	b.waitDrained(t, 20*time.Second, "the write-behind drained", g.Flusher)
	require.Equal(t, db.StatusExpired, b.ledgerStatus(t, a.Token), "the overdue hold is closed in the ledger")
	require.Equal(t, "EXPIRED", b.holdStatus(t, sku, a.Token))
	require.Equal(t, 1.0, metric(t, reg, "dropline_overdue_holds_closed_total"))
	var expires int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM stock_movements WHERE token = $1 AND kind = 'expire'`, a.Token).Scan(&expires))
	require.Equal(t, 1, expires)
	s := b.stock(t, sku)
	require.Equal(t, 2, s.Available)
	require.Zero(t, s.Held)
}
