package inventory_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// outboxEvents reads every outbox event of every partition without applying
// it: a batch the write-behind worker has read and not yet written.
func (b *bundle) outboxEvents(t *testing.T) []db.Event {
	t.Helper()
	var events []db.Event
	for p := 0; p < inventory.Partitions; p++ {
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

func (b *bundle) ledgerStatus(t *testing.T, token string) string {
	t.Helper()
	var st string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM reservations WHERE token = $1`, token).Scan(&st))
	return st
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, query, args...).Scan(&n))
	return n
}

// A hold cancelled in Redis whose cancel reached the ledger only after Redis
// lost its data and the SKU was rebuilt (as HELD, from the older ledger row)
// must not be sold: the ledger has it as finished, so the sale is refused as
// cancelled and Redis gives the units back.
func TestCommitOfAHoldTheLedgerHasAsCancelledIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ENDED-1", 1, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ENDED-1", Quantity: 1})
		require.NoError(t, err)
		b.drainOutbox(t) // the ledger has the hold as HELD
		// The cancel's instance cannot reach Postgres: only its outbox event records it.
		_, err = b.deadEngine(t).Cancel(b.ctx, alice, h.Token)
		require.NoError(t, err)
		inFlight := b.outboxEvents(t) // read by the write-behind, not yet applied
		b.wipe(t)
		require.Equal(t, 1, b.requireBalanced(t, "ENDED-1").Held, "rebuilt from the older ledger row")
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, h.Token))

		_, err = b.engine.Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, h.Token), "the ledger row stays CANCELLED")
		require.Zero(t, b.count(t, `SELECT count(*)::int FROM sales WHERE token = $1`, h.Token))
		require.Equal(t, "CANCELLED", b.rawStatus(t, "ENDED-1", h.Token), "Redis agrees with the ledger")
		s := b.requireBalanced(t, "ENDED-1")
		require.Equal(t, 1, s.Available)
		require.Zero(t, s.Held)
		b.drainOutbox(t)
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements
			WHERE token = $1 AND kind IN ('commit', 'cancel', 'expire')`, h.Token), "released once, never sold")
	})
}

// A commit that beat its reserve event to the ledger, then Redis lost
// everything: the sale row must carry the idempotency key, so a client that
// retries the reserve gets its sold hold back, not a second one.
func TestIdempotencyAfterRedisLossWhenTheCommitBeatTheReserveEvent(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "IDEMSALE-1", 5, 0)
		alice := buyer(1)
		req := inventory.ReserveRequest{SKU: "IDEMSALE-1", Quantity: 1, IdempotencyKey: "k1"}
		first, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		_, err = b.engine.Commit(b.ctx, alice, first.Token)
		require.NoError(t, err)
		b.wipe(t) // the reserve event never reached Postgres

		again, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		require.Equal(t, first.Token, again.Token, "the retry replays the sold hold")
		require.Equal(t, inventory.StatusCommitted, again.Status)
		require.True(t, again.Replayed)
		s := b.requireBalanced(t, "IDEMSALE-1")
		require.Equal(t, 1, s.Sold)
		require.Zero(t, s.Held)
	})
}

// After Redis lost the claims pinning idempotency keys to their first SKU,
// reusing a key (whose reserve reached the ledger) with another SKU is still
// refused, and the key still replays its first hold.
func TestIdempotencyKeyClaimSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "CLAIM-1", 5, 0)
		b.product(t, "CLAIM-2", 5, 0)
		alice := buyer(1)
		req := inventory.ReserveRequest{SKU: "CLAIM-1", Quantity: 1, IdempotencyKey: "k1"}
		first, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		b.drainOutbox(t)
		b.wipe(t)

		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "CLAIM-2", Quantity: 1, IdempotencyKey: "k1"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
		require.Equal(t, 5, b.requireBalanced(t, "CLAIM-2").Available, "no hold made on the other SKU")
		again, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		require.Equal(t, first.Token, again.Token)
		require.True(t, again.Replayed)
		require.Equal(t, 1, b.requireBalanced(t, "CLAIM-1").Held)
		// A new key after the loss is accepted as before.
		other, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "CLAIM-2", Quantity: 1, IdempotencyKey: "k2"})
		require.NoError(t, err)
		require.False(t, other.Replayed)
	})
}

// A batch the write-behind read before Redis lost its data and wrote after
// the SKU was rebuilt (a cancel of A, the reserve of B who took the freed
// unit): ReconcileApplied tells the rebuilt SKU what the ledger now says.
// A is released in Redis (never sold, released once in the ledger), B is
// adopted as HELD; a second call changes nothing.
func TestReconcileAppliedTellsTheRebuiltSKU(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "LATE-1", 1, 0)
		alice, bob := buyer(1), buyer(2)
		a, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LATE-1", Quantity: 1})
		require.NoError(t, err)
		b.drainOutbox(t)
		_, err = b.deadEngine(t).Cancel(b.ctx, alice, a.Token) // only the outbox records it
		require.NoError(t, err)
		bh, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "LATE-1", Quantity: 1, IdempotencyKey: "kb"})
		require.NoError(t, err)
		inFlight := b.outboxEvents(t)
		b.wipe(t)
		require.Equal(t, 1, b.requireBalanced(t, "LATE-1").Held, "rebuilt with A as HELD, without B")

		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
		p := inventory.PartitionOf("LATE-1")
		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, p, inFlight)
		require.NoError(t, err)
		require.Equal(t, 2, n, "A released, B adopted")
		n, err = b.engine.Maintenance().ReconcileApplied(b.ctx, p, inFlight)
		require.NoError(t, err)
		require.Zero(t, n, "idempotent")
		require.Equal(t, "CANCELLED", b.rawStatus(t, "LATE-1", a.Token))
		require.Equal(t, "HELD", b.rawStatus(t, "LATE-1", bh.Token))
		s := b.requireBalanced(t, "LATE-1")
		require.Equal(t, 1, s.Held)
		require.Zero(t, s.Available)

		again, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "LATE-1", Quantity: 1, IdempotencyKey: "kb"})
		require.NoError(t, err)
		require.Equal(t, bh.Token, again.Token, "B's key replays the adopted hold")
		_, err = b.engine.Commit(b.ctx, alice, a.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
		_, err = b.engine.Commit(b.ctx, bob, bh.Token)
		require.NoError(t, err)
		b.drainOutbox(t)
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements
			WHERE token = $1 AND kind IN ('commit', 'cancel', 'expire')`, a.Token), "A released once")
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, a.Token))
		require.Equal(t, db.StatusCommitted, b.ledgerStatus(t, bh.Token))
		require.Equal(t, 1, b.requireBalanced(t, "LATE-1").Sold)
	})
}

// A late reserve that no longer fits the rebuilt SKU (its unit was taken
// meanwhile) is closed as EXPIRED in Redis and, through its event, in the
// ledger: never left HELD.
func TestReconcileAppliedClosesALateReserveThatNoLongerFits(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "LATE-2", 1, 0)
		alice, carol := buyer(1), buyer(3)
		a, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LATE-2", Quantity: 1})
		require.NoError(t, err)
		inFlight := b.outboxEvents(t)
		b.wipe(t)
		_, err = b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: "LATE-2", Quantity: 1})
		require.NoError(t, err, "the rebuilt SKU did not know A: carol takes the unit")
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf("LATE-2"), inFlight)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "EXPIRED", b.rawStatus(t, "LATE-2", a.Token))
		b.drainOutbox(t)
		require.Equal(t, db.StatusExpired, b.ledgerStatus(t, a.Token))
		s := b.requireBalanced(t, "LATE-2")
		require.Equal(t, 1, s.Held, "carol's hold only")
	})
}

// A cancel the write-behind read before Redis lost its data (a failover:
// the promoted replica never had it) and wrote after the SKU was rebuilt,
// by when the hold was past its expiry: the rebuild, reading the hold as
// HELD, recorded it as EXPIRED; the ledger then took the cancel, and keeps
// it over the rebuild's expire event. ReconcileApplied makes Redis say
// CANCELLED too, moving no stock; a second call changes nothing.
func TestReconcileAppliedRestatesAnEndingTheRebuildGuessed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "LATE-4", 2, 0)
		alice := buyer(1)
		a, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LATE-4", Quantity: 1, IdempotencyKey: "ka", HoldFor: time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		_, err = b.deadEngine(t).Cancel(b.ctx, alice, a.Token) // only the outbox records it
		require.NoError(t, err)
		inFlight := b.outboxEvents(t)
		time.Sleep(time.Until(a.ExpiresAt) + 50*time.Millisecond)
		b.wipe(t)
		require.Equal(t, 2, b.requireBalanced(t, "LATE-4").Available, "rebuilt with A past its expiry")
		require.Equal(t, "EXPIRED", b.rawStatus(t, "LATE-4", a.Token))

		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
		p := inventory.PartitionOf("LATE-4")
		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, p, inFlight)
		require.NoError(t, err)
		require.Equal(t, 1, n, "A restated")
		b.drainOutbox(t) // the rebuild's expire event of A
		n, err = b.engine.Maintenance().ReconcileApplied(b.ctx, p, inFlight)
		require.NoError(t, err)
		require.Zero(t, n, "idempotent")
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, a.Token), "the ledger keeps the first ending it was told of")
		require.Equal(t, "CANCELLED", b.rawStatus(t, "LATE-4", a.Token))
		s := b.requireBalanced(t, "LATE-4")
		require.Equal(t, 2, s.Available)
		require.Zero(t, s.Held)
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements
			WHERE token = $1 AND kind IN ('commit', 'cancel', 'expire')`, a.Token), "A released once")
		_, err = b.engine.Commit(b.ctx, alice, a.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
	})
}

// A hold the ledger has as HELD past its expiry that Redis does not have
// (its reserve reached the ledger after the rebuild and nothing told Redis)
// is closed as EXPIRED, exactly once; a hold Redis has is never touched.
func TestCloseOverdueHolds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "OVERDUE-1", 3, 0)
		alice, bob := buyer(1), buyer(2)
		a, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "OVERDUE-1", Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		inFlight := b.outboxEvents(t)
		b.wipe(t)
		require.Equal(t, 3, b.requireBalanced(t, "OVERDUE-1").Available)
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight)) // and nothing told Redis
		live, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "OVERDUE-1", Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		require.Equal(t, db.StatusHeld, b.ledgerStatus(t, a.Token))
		require.Eventually(t, func() bool { return time.Now().After(live.ExpiresAt.Add(50 * time.Millisecond)) }, 5*time.Second, 10*time.Millisecond)

		p := inventory.PartitionOf("OVERDUE-1")
		n, err := b.engine.Maintenance().CloseOverdueHolds(b.ctx, p, 0, 100)
		require.NoError(t, err)
		require.Equal(t, 1, n, "only the hold Redis does not have")
		require.Equal(t, "HELD", b.rawStatus(t, "OVERDUE-1", live.Token), "the sweeper's hold is untouched")
		n, err = b.engine.Maintenance().CloseOverdueHolds(b.ctx, p, 0, 100)
		require.NoError(t, err)
		require.Zero(t, n, "exactly once")
		b.drainOutbox(t)
		require.Equal(t, db.StatusExpired, b.ledgerStatus(t, a.Token))
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements WHERE token = $1 AND kind = 'expire'`, a.Token))
		s := b.requireBalanced(t, "OVERDUE-1")
		require.Equal(t, 1, s.Held, "bob's hold waits for the sweeper")
		require.Equal(t, 2, s.Available)
	})
}

// A hold Redis has ended in the SKU's current generation (expired, or
// cancelled) whose ending never reached the ledger (its outbox entry is gone)
// stays HELD in the ledger for good unless the overdue pass repairs the
// ledger from Redis: Redis is the authority for a hold the ledger has as HELD.
func TestCloseOverdueHoldsRedisEnded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "OVERDUE-2"
		b.product(t, sku, 3, 0)
		p := inventory.PartitionOf(sku)
		alice, bob, carol := buyer(1), buyer(2), buyer(3)
		expired, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		// Bob's hold outlives the steps up to its cancel on a loaded machine.
		cancelled, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: 5 * time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		b.dropOutbox(t, p)

		// Redis ends both; neither ending reaches the ledger: the cancel's
		// own ledger write fails (Postgres unreachable from that instance)
		// and both outbox entries are lost.
		_, err = b.deadEngine(t).Cancel(b.ctx, bob, cancelled.Token)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return time.Now().After(expired.ExpiresAt.Add(50 * time.Millisecond)) }, 5*time.Second, 10*time.Millisecond)
		out, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100)
		require.NoError(t, err)
		require.Len(t, out, 1)
		b.dropOutbox(t, p)
		// A hold Redis still has as HELD past its expiry is the sweeper's.
		held, err := b.engine.Reserve(b.ctx, carol, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		last := held.ExpiresAt
		if cancelled.ExpiresAt.After(last) {
			last = cancelled.ExpiresAt
		}
		require.Eventually(t, func() bool { return time.Now().After(last.Add(50 * time.Millisecond)) }, 10*time.Second, 10*time.Millisecond)
		for _, tok := range []string{expired.Token, cancelled.Token, held.Token} {
			require.Equal(t, db.StatusHeld, b.ledgerStatus(t, tok))
		}

		n, err := b.engine.Maintenance().CloseOverdueHolds(b.ctx, p, 0, 100)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the holds Redis ended")
		require.Equal(t, db.StatusExpired, b.ledgerStatus(t, expired.Token))
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, cancelled.Token))
		require.Equal(t, db.StatusHeld, b.ledgerStatus(t, held.Token))
		require.Equal(t, "HELD", b.rawStatus(t, sku, held.Token))
		n, err = b.engine.Maintenance().CloseOverdueHolds(b.ctx, p, 0, 100)
		require.NoError(t, err)
		require.Zero(t, n, "exactly once")
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements WHERE token = $1 AND kind = 'expire'`, expired.Token))
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements WHERE token = $1 AND kind = 'cancel'`, cancelled.Token))
		s := b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Held, "carol's hold waits for the sweeper")
		require.Equal(t, 2, s.Available)
	})
}

// dropOutbox removes every entry of partition p's outbox, as if the events
// were lost on their way to the ledger.
func (b *bundle) dropOutbox(t *testing.T, p int) {
	t.Helper()
	require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().Outbox(p)).Err())
}

// A cancel is in the ledger when it answers (the outbox event stays the
// guarantee): a rebuild right after it cannot bring the hold back.
func TestCancelIsInTheLedgerWhenItAnswers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "SYNC-1", 1, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "SYNC-1", Quantity: 1})
		require.NoError(t, err)
		b.drainOutbox(t)
		_, err = b.engine.Cancel(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, db.StatusCancelled, b.ledgerStatus(t, h.Token), "written before the reply")
		b.wipe(t) // the cancel event is lost with Redis
		require.Equal(t, 1, b.requireBalanced(t, "SYNC-1").Available, "the rebuild does not bring the hold back")
		_, err = b.engine.Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
		require.Equal(t, 1, b.count(t, `SELECT count(*)::int FROM stock_movements WHERE event_id = $1`, "cancel:"+h.Token))
	})
}
