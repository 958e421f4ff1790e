package queue_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// otherPartition returns a SKU name whose partition is not sku's.
func otherPartition(prefix, sku string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if inventory.PartitionOf(name) != inventory.PartitionOf(sku) {
			return name
		}
	}
}

// TestFailedCartGivesThePassBack: a cart whose lines live in two partitions
// spends its admission pass on its queued line's provisional hold; when the
// cart fails (a line refused in the other partition; the caller stalled
// past its deadline and the cart sweep let it go) the line is released and
// the pass is the principal's again, unspent, counted against the stock
// again and absent from the ledger's spendings; it then buys a hold, once.
func TestFailedCartGivesThePassBack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		const settle = 500 * time.Millisecond
		b := setupWith(t, backend, inventory.Config{CartSettle: settle,
			CartPause: inventory.CartPause{At: inventory.CartPauseHeld, For: 3 * settle}})
		r := b.queuedProduct(t, "Q-RET", 2, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 600_000})
		gone, plain := otherPartition("GONE", r.ID), otherPartition("PLAIN", r.ID)
		b.product(t, gone, 0)
		b.product(t, plain, 5)
		alice := buyer(1)
		_, err := b.queues.Join(b.ctx, alice.ID, r, queue.JoinInput{})
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond)
		require.Equal(t, int64(1), b.step(t, r).Through)
		pass := b.passOf(t, r, alice.ID)
		require.NotEmpty(t, pass)
		ticket := func() queue.Ticket {
			tk, _, err := b.queues.MyTicket(b.ctx, alice.ID, r)
			require.NoError(t, err)
			return tk
		}

		// 1. A line refused in the other partition: nothing is held.
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{AdmissionPass: pass,
			Lines: []inventory.CartLine{{SKU: r.ID, Quantity: 1}, {SKU: gone, Quantity: 1}}})
		require.ErrorIs(t, err, inventory.ErrOutOfStock)
		require.Equal(t, queue.TicketAdmitted, ticket().Status)
		require.Equal(t, pass, ticket().Pass)

		// 2. Both lines held provisionally, then the caller stalls past the
		// deadline: the sweep lets the cart go and the pass comes back.
		var wg sync.WaitGroup
		var cartErr error
		wg.Go(func() {
			_, cartErr = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{AdmissionPass: pass,
				Lines: []inventory.CartLine{{SKU: r.ID, Quantity: 1}, {SKU: plain, Quantity: 1}}})
		})
		sawSpent := false
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			tk := ticket()
			sawSpent = sawSpent || tk.Status == queue.TicketUsed
			s, err := b.engine.Catalog().Stock(b.ctx, r.ID)
			require.NoError(t, err)
			if sawSpent && s.Held == 0 {
				break
			}
			_, err = b.engine.Maintenance().AbandonStaleCarts(b.ctx, 100)
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond)
		}
		require.True(t, sawSpent, "the provisional line spent the pass")
		wg.Wait()
		require.Error(t, cartErr, "the cart was let go")
		tk := ticket()
		require.Equal(t, queue.TicketAdmitted, tk.Status, "the pass is back")
		require.Equal(t, pass, tk.Pass)
		res := b.step(t, r)
		require.Equal(t, 1, res.Unspent, "it counts against the stock again")
		require.Equal(t, int64(1), res.Through, "and nobody else was admitted for the unit it holds")

		kinds := b.drain(t)
		require.Zero(t, kinds[db.KindQueueSpend], "a failed cart records no spending")
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: r.ID, Quantity: 1, AdmissionPass: pass})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: r.ID, Quantity: 1, AdmissionPass: pass})
		require.ErrorIs(t, err, inventory.ErrPassInvalid, "a pass buys once")
		require.Equal(t, 1, b.drain(t)[db.KindQueueSpend])
		b.requireLedgerAgrees(t, r, b.queueState(t, r))
		tickets, err := b.engine.Ledger().Queues().QueueTickets(b.ctx, r.String())
		require.NoError(t, err)
		require.Len(t, tickets, 1)
		require.NotNil(t, tickets[0].SpentAt)
		require.Equal(t, h.Token, tickets[0].SpentFor)
	})
}
