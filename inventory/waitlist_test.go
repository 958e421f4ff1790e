package inventory_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

func waiter(i int) inventory.Principal { return inventory.Principal{ID: fmt.Sprintf("waiter-%d", i)} }

// joinInOrder makes n waiters join one after the other, each for qty units
// held for hold, and checks each got the next place.
func (b *bundle) joinInOrder(t *testing.T, sku string, n, qty int, hold time.Duration) {
	t.Helper()
	for i := 0; i < n; i++ {
		w, err := b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(i), inventory.JoinWaitlistRequest{SKU: sku, Quantity: qty, HoldFor: hold})
		require.NoError(t, err)
		require.Equal(t, inventory.WaitWaiting, w.Status)
		require.Equal(t, i+1, w.Position)
	}
}

// requireWaitlist checks, in Redis, that waiters [0, offered) are OFFERED a
// HELD reservation of their own of qty units, and waiters [offered, n) are
// WAITING in join order. It returns the offered tokens by waiter.
func (b *bundle) requireWaitlist(t *testing.T, sku string, n, offered, qty int) map[string]string {
	t.Helper()
	tokens := map[string]string{}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(i), sku)
		require.NoError(t, err)
		if i < offered {
			require.Equal(t, inventory.WaitOffered, w.Status, "waiter %d", i)
			require.NotNil(t, w.Reservation, "waiter %d", i)
			require.Equal(t, inventory.StatusHeld, w.Reservation.Status)
			require.Equal(t, waiter(i).ID, w.Reservation.Principal)
			require.Equal(t, qty, w.Reservation.Quantity)
			require.False(t, seen[w.Token], "a unit goes to exactly one waiter")
			seen[w.Token] = true
			tokens[waiter(i).ID] = w.Token
			continue
		}
		require.Equal(t, inventory.WaitWaiting, w.Status, "waiter %d", i)
		require.Equal(t, i-offered+1, w.Position, "waiter %d", i)
	}
	return tokens
}

// requireLedgerWaitlist checks the ledger, row by row, after the outbox is
// drained: the entries' statuses and tokens, and the offered reservations.
func (b *bundle) requireLedgerWaitlist(t *testing.T, sku string, n int, tokens map[string]string) {
	t.Helper()
	rows, err := b.engine.Ledger().Waitlists().WaitlistEntries(b.ctx, sku)
	require.NoError(t, err)
	require.Len(t, rows, n)
	for i, r := range rows {
		require.Equal(t, waiter(i).ID, r.Principal, "the ledger keeps the join order")
		if tok, ok := tokens[r.Principal]; ok {
			require.Equal(t, db.WaitOffered, r.Status, r.Principal)
			require.Equal(t, tok, r.Token)
			res, err := b.engine.Ledger().Reservations().Reservation(b.ctx, tok)
			require.NoError(t, err)
			require.Equal(t, r.Principal, res.Principal)
			require.Equal(t, db.StatusHeld, res.Status)
		} else {
			require.Equal(t, db.WaitWaiting, r.Status, r.Principal)
			require.Empty(t, r.Token)
		}
	}
}

func TestWaitlistTakesFreedUnitsBeforeAnyone(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku, stock, waiters, outsiders = "WL-RACE", 200, 300, 1000
		b.product(t, sku, stock, 0)
		holds := make([]inventory.Reservation, stock)
		for i := range holds {
			r, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
			require.NoError(t, err)
			holds[i] = r
		}
		b.joinInOrder(t, sku, waiters, 1, time.Minute)

		// Every holder cancels while outsiders try to reserve and waiters
		// join again, all released together.
		var outsiderWon, replays atomic.Int64
		raceCheck(t, stock+outsiders+waiters, func(i int) error {
			switch {
			case i < stock:
				r, err := b.engine.Cancel(b.ctx, buyer(i), holds[i].Token)
				if err != nil {
					return fmt.Errorf("cancel %d: %w", i, err)
				}
				if r.Status != inventory.StatusCancelled {
					return fmt.Errorf("cancel %d: %s", i, r.Status)
				}
			case i < stock+outsiders:
				_, err := b.engine.Reserve(b.ctx, buyer(10_000+i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
				if err == nil {
					outsiderWon.Add(1)
				} else if !errors.Is(err, inventory.ErrOutOfStock) {
					return fmt.Errorf("outsider %d: %w", i, err)
				}
			default:
				w := i - stock - outsiders
				e, err := b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(w), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
				if err != nil {
					return fmt.Errorf("join again %d: %w", w, err)
				}
				if e.Replayed {
					replays.Add(1)
				}
			}
			return nil
		})
		require.Zero(t, outsiderWon.Load(), "nobody outside the queue gets a unit while waiters can take it")
		require.EqualValues(t, waiters, replays.Load(), "joining twice replays")
		s := b.requireBalanced(t, sku)
		require.Equal(t, 0, s.Available)
		require.Equal(t, stock, s.Held)
		tokens := b.requireWaitlist(t, sku, waiters, stock, 1)

		// The offers were made in join order: the outbox has them so.
		msgs, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(inventory.PartitionOf(sku)), "-", "+").Result()
		require.NoError(t, err)
		next := 0
		for _, m := range msgs {
			ev, err := inventory.ParseEvent(m)
			require.NoError(t, err)
			if ev.Kind == db.KindWaitOffer {
				require.Equal(t, waiter(next).ID, ev.Principal, "offer %d", next)
				require.Equal(t, tokens[ev.Principal], ev.Token)
				next++
			}
		}
		require.Equal(t, stock, next)

		kinds := b.drainOutbox(t)
		require.Equal(t, waiters, kinds[db.KindWaitJoin])
		require.Equal(t, stock, kinds[db.KindWaitOffer])
		require.Equal(t, 2*stock, kinds["reserve"], "the holders' and the offers' reservations")
		require.Equal(t, stock, kinds["cancel"])
		b.requireLedgerWaitlist(t, sku, waiters, tokens)

		// A restock goes to the next waiters too: as many as the restock's
		// run has room for, the rest by the walk sweep (as the worker group
		// runs it); meanwhile no outsider can take them.
		_, err = b.engine.Catalog().Restock(b.ctx, admin, sku, 50, "po-1")
		require.NoError(t, err)
		if b.walkPending(t, sku) {
			_, err = b.engine.Reserve(b.ctx, buyer(20_000), inventory.ReserveRequest{SKU: sku, Quantity: 1})
			require.ErrorIs(t, err, inventory.ErrOutOfStock, "the walk decides first, and gives every unit to a waiter")
		}
		b.finishWalks(t, sku)
		tokens = b.requireWaitlist(t, sku, waiters, stock+50, 1)
		s = b.requireBalanced(t, sku)
		require.Equal(t, 0, s.Available)

		// Redis loses everything: the rebuild restores the queue in order.
		b.drainOutbox(t)
		b.wipe(t)
		tokens2 := b.requireWaitlist(t, sku, waiters, stock+50, 1)
		require.Equal(t, tokens, tokens2)
		b.requireLedgerWaitlist(t, sku, waiters, tokens)
		// ... and goes on handing out in that order.
		_, err = b.engine.Cancel(b.ctx, waiter(0), tokens[waiter(0).ID])
		require.NoError(t, err)
		w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(stock+50), sku)
		require.NoError(t, err)
		require.Equal(t, inventory.WaitOffered, w.Status)
		b.requireBalanced(t, sku)
	})
}

func TestWaitlistSkipsWaitersThatDoNotFit(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	const sku = "WL-FIT"
	b.product(t, sku, 3, 2)
	var holds []inventory.Reservation
	for i := 0; i < 3; i++ {
		r, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
		require.NoError(t, err)
		holds = append(holds, r)
	}
	big, err := b.engine.Waitlists().JoinWaitlist(b.ctx, buyer(3), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 2})
	require.NoError(t, err)
	require.Equal(t, 1, big.Position)
	small, err := b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(0), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)
	require.Equal(t, 2, small.Position)
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(1), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 3})
	require.ErrorIs(t, err, inventory.ErrQuotaExceeded, "a quantity above the limit could never be served")
	// buyer-1 holds one unit already: with a limit of 2, 2 more could never be its.
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, buyer(1), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 2})
	var quota *inventory.QuotaExceededError
	require.ErrorAs(t, err, &quota, "what it holds and what it asks are above the limit")
	require.Equal(t, inventory.QuotaExceededError{Limit: 2, Held: 1}, *quota)

	_, err = b.engine.Cancel(b.ctx, buyer(0), holds[0].Token)
	require.NoError(t, err)
	w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(0), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitOffered, w.Status, "the first waiter whose quantity fits gets the unit")
	w, err = b.engine.Waitlists().Waitlist(b.ctx, buyer(3), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitWaiting, w.Status)
	require.Equal(t, 1, w.Position)

	_, err = b.engine.Cancel(b.ctx, buyer(1), holds[1].Token)
	require.NoError(t, err)
	w, err = b.engine.Waitlists().Waitlist(b.ctx, buyer(3), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitWaiting, w.Status, "one unit does not fit two")
	require.Equal(t, 1, b.stock(t, sku).Available, "what no waiter can take is available to everyone")
	_, err = b.engine.Cancel(b.ctx, buyer(2), holds[2].Token)
	require.NoError(t, err)
	w, err = b.engine.Waitlists().Waitlist(b.ctx, buyer(3), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitOffered, w.Status)
	require.Equal(t, 2, w.Reservation.Quantity)
	require.Equal(t, 0, b.stock(t, sku).Available)

	left, err := b.engine.Waitlists().LeaveWaitlist(b.ctx, buyer(3), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitLeft, left.Status)
	again, err := b.engine.Waitlists().LeaveWaitlist(b.ctx, buyer(3), sku)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	b.drainOutbox(t)
	rows, err := b.engine.Ledger().Waitlists().WaitlistEntries(b.ctx, sku)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, db.WaitLeft, rows[0].Status)
	require.NotEmpty(t, rows[0].Token, "a left entry keeps the reservation it was offered")
	require.Equal(t, db.WaitOffered, rows[1].Status)
	mine, err := b.engine.Waitlists().MyWaitlist(b.ctx, buyer(3))
	require.NoError(t, err)
	require.Len(t, mine, 1)
	require.Equal(t, inventory.WaitLeft, mine[0].Status)
}

func TestWaitlistExpiryPassesUnitsOn(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{WaitlistMax: 2})
	const sku = "WL-EXP"
	b.product(t, sku, 1, 0)
	r, err := b.engine.Reserve(b.ctx, buyer(0), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err := b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(i), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
	}
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(2), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1})
	var full *inventory.WaitlistFullError
	require.ErrorAs(t, err, &full)
	require.Equal(t, 2, full.Limit)

	expireUntil := func(who inventory.Principal) {
		require.Eventually(t, func() bool {
			_, err := b.engine.Maintenance().ExpireDue(b.ctx, inventory.PartitionOf(sku), 100)
			require.NoError(t, err)
			w, err := b.engine.Waitlists().Waitlist(b.ctx, who, sku)
			require.NoError(t, err)
			return w.Status == inventory.WaitOffered
		}, 5*time.Second, 50*time.Millisecond)
	}
	expireUntil(waiter(0))
	_, err = b.engine.Reservation(b.ctx, buyer(0), r.Token)
	require.NoError(t, err)
	expireUntil(waiter(1))
	w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(0), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.StatusExpired, w.Reservation.Status)
	b.requireBalanced(t, sku)
}

// A commit that arrives after the hold's expiry releases the hold itself
// (before the sweeper): those units go to the waiters too.
func TestWaitlistTakesUnitsALateCommitReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	const sku = "WL-LATE"
	b.product(t, sku, 1, 0)
	r, err := b.engine.Reserve(b.ctx, buyer(0), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Second})
	require.NoError(t, err)
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(0), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Now().After(r.ExpiresAt.Add(50 * time.Millisecond)) }, 3*time.Second, 20*time.Millisecond)
	_, err = b.engine.Commit(b.ctx, buyer(0), r.Token)
	require.ErrorIs(t, err, inventory.ErrExpired)
	w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(0), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitOffered, w.Status, "the unit the late commit released went to the waiter")
	require.Equal(t, 0, b.stock(t, sku).Available)
}

// A cart's commit that arrives after its lines' expiry releases them itself,
// as a hold's late commit does: those units go to the waiters too.
func TestWaitlistTakesUnitsALateCartCommitReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	const sku = "WL-LATECART"
	b.product(t, sku, 1, 0)
	cart, err := b.engine.Carts().ReserveCart(b.ctx, buyer(0), inventory.CartRequest{Lines: lines([]string{sku}, 1), HoldFor: time.Second})
	require.NoError(t, err)
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(0), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Now().After(cart.ExpiresAt.Add(50 * time.Millisecond)) }, 3*time.Second, 20*time.Millisecond)
	_, err = b.engine.Carts().CommitCart(b.ctx, buyer(0), cart.Token)
	require.ErrorIs(t, err, inventory.ErrExpired)
	w, err := b.engine.Waitlists().Waitlist(b.ctx, waiter(0), sku)
	require.NoError(t, err)
	require.Equal(t, inventory.WaitOffered, w.Status, "the unit the late cart commit released went to the waiter")
	require.Equal(t, 0, b.stock(t, sku).Available)
}

// A commit the ledger refuses (it has the hold as cancelled, or the sale
// would exceed the total) releases the hold in finish_commit.lua: those
// units go to the waiters first too, not back to plain stock.
func TestWaitlistTakesUnitsARefusedCommitReleases(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		t.Run("ledger has it cancelled", func(t *testing.T) {
			b := setup(t, backend, inventory.Config{})
			const sku = "WL-ENDED"
			b.product(t, sku, 1, 0)
			alice := buyer(1)
			h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1})
			require.NoError(t, err)
			b.drainOutbox(t)
			_, err = b.deadEngine(t).Cancel(b.ctx, alice, h.Token) // only the outbox records it
			require.NoError(t, err)
			inFlight := b.outboxEvents(t)
			b.wipe(t)
			require.Equal(t, 1, b.requireBalanced(t, sku).Held, "rebuilt from the older ledger row")
			b.joinInOrder(t, sku, 1, 1, time.Minute)
			require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))

			_, err = b.engine.Commit(b.ctx, alice, h.Token)
			require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
			tokens := b.requireWaitlist(t, sku, 1, 1, 1)
			s := b.requireBalanced(t, sku)
			require.Zero(t, s.Available, "the released unit went to the waiter")
			require.Equal(t, 1, s.Held)
			b.drainOutbox(t)
			b.requireLedgerWaitlist(t, sku, 1, tokens)
		})
		t.Run("sale beyond the total", func(t *testing.T) {
			b := setup(t, backend, inventory.Config{})
			const sku = "WL-REFUSED"
			b.product(t, sku, 2, 0)
			alice := buyer(1)
			h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 2})
			require.NoError(t, err)
			b.joinInOrder(t, sku, 1, 1, time.Minute)
			// A sale Redis never heard of (it lost what it had promised)
			// leaves the ledger one unit short of alice's two.
			_, err = b.engine.Ledger().Sales().RecordSale(b.ctx, db.Reservation{Token: "r00.lostsale", SKU: sku, Principal: "someone",
				Quantity: 1, ExpiresAt: time.Now().Add(time.Minute), CreatedAt: time.Now()})
			require.NoError(t, err)

			_, err = b.engine.Commit(b.ctx, alice, h.Token)
			var short *inventory.OutOfStockError
			require.ErrorAs(t, err, &short)
			b.requireWaitlist(t, sku, 1, 1, 1)
			s := b.stock(t, sku)
			require.Equal(t, 1, s.Available, "one unit went to the waiter, the other to everyone")
			require.Equal(t, 1, s.Held)
		})
	})
}

// The reconciler releases a hold a rebuild restored as HELD when the ledger
// has it as cancelled (reconcile_hold.lua): its units go to the waiters
// first.
func TestWaitlistTakesUnitsTheReconcilerReleases(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "WL-RECON"
		b.product(t, sku, 1, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: sku, Quantity: 1})
		require.NoError(t, err)
		b.drainOutbox(t)
		_, err = b.deadEngine(t).Cancel(b.ctx, alice, h.Token) // only the outbox records it
		require.NoError(t, err)
		inFlight := b.outboxEvents(t)
		b.wipe(t)
		require.Equal(t, 1, b.requireBalanced(t, sku).Held, "rebuilt from the older ledger row")
		b.joinInOrder(t, sku, 1, 1, time.Minute)

		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, inFlight))
		n, err := b.engine.Maintenance().ReconcileApplied(b.ctx, inventory.PartitionOf(sku), inFlight)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "CANCELLED", b.rawStatus(t, sku, h.Token))
		tokens := b.requireWaitlist(t, sku, 1, 1, 1)
		s := b.requireBalanced(t, sku)
		require.Zero(t, s.Available, "the released unit went to the waiter")
		require.Equal(t, 1, s.Held)
		b.drainOutbox(t)
		b.requireLedgerWaitlist(t, sku, 1, tokens)
	})
}
