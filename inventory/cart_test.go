package inventory_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// skusInPartitions returns n SKU names with the given prefix, each in a
// different partition, so a cart of them spans n partitions (and, on the
// cluster, several slots and masters).
func skusInPartitions(prefix string, n int) []string {
	seen := map[int]bool{}
	var out []string
	for i := 0; len(out) < n; i++ {
		sku := fmt.Sprintf("%s-%d", prefix, i)
		if p := inventory.PartitionOf(sku); !seen[p] {
			seen[p] = true
			out = append(out, sku)
		}
	}
	return out
}

func lines(skus []string, qty ...int) []inventory.CartLine {
	out := make([]inventory.CartLine, len(skus))
	for i, s := range skus {
		out[i] = inventory.CartLine{SKU: s, Quantity: qty[i]}
	}
	return out
}

func TestCartIsHeldWholeOrNotAtAll(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := skusInPartitions("CART", 3)
		b.product(t, skus[0], 5, 0)
		b.product(t, skus[1], 1, 0)
		b.product(t, skus[2], 5, 2)
		alice := buyer(1)

		// Two lines short: the second (stock) and the third (quota); the
		// first could be had. Nothing is held, each short line is named.
		_, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 2, 3, 3)})
		var refused *inventory.CartRefusedError
		require.ErrorAs(t, err, &refused)
		require.Len(t, refused.Lines, 2)
		require.Equal(t, 1, refused.Lines[0].Index)
		require.ErrorIs(t, refused.Lines[0].Err, inventory.ErrOutOfStock)
		require.Equal(t, 1, refused.Lines[0].Available())
		require.Equal(t, 2, refused.Lines[1].Index)
		require.ErrorIs(t, refused.Lines[1].Err, inventory.ErrQuotaExceeded)
		require.Equal(t, 2, refused.Lines[1].Available())
		for _, sku := range skus {
			s := b.requireBalanced(t, sku)
			require.Zero(t, s.Held, "a refused cart holds nothing")
		}
		require.Empty(t, b.drainOutbox(t), "a refused cart leaves nothing for the ledger")

		// Lines of one SKU are added up before the check: 1 + 1 of a SKU with 1 left.
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: []inventory.CartLine{
			{SKU: skus[1], Quantity: 1}, {SKU: skus[0], Quantity: 1}, {SKU: skus[1], Quantity: 1}}})
		require.ErrorAs(t, err, &refused)
		require.Len(t, refused.Lines, 2)
		require.Equal(t, 0, refused.Lines[0].Index)
		require.Equal(t, 2, refused.Lines[1].Index)
		require.Equal(t, 1, refused.Lines[1].Available())
		require.Zero(t, b.stock(t, skus[0]).Held)

		cart, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 2, 1, 2)})
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, cart.Status)
		require.Len(t, cart.Lines, 3)
		for i, l := range cart.Lines {
			require.Equal(t, skus[i], l.SKU)
			require.Equal(t, inventory.StatusHeld, l.Status)
			require.Equal(t, cart.ExpiresAt, l.ExpiresAt, "every line lasts as long as the cart")
			r, err := b.engine.Reservation(b.ctx, alice, l.Token)
			require.NoError(t, err)
			require.Equal(t, inventory.StatusHeld, r.Status)
			// A line is sold or let go with its cart only.
			_, err = b.engine.Commit(b.ctx, alice, l.Token)
			require.ErrorIs(t, err, inventory.ErrInvalidInput)
			_, err = b.engine.Cancel(b.ctx, alice, l.Token)
			require.ErrorIs(t, err, inventory.ErrInvalidInput)
			_, err = b.engine.Extend(b.ctx, alice, l.Token, inventory.ExtendRequest{HoldFor: time.Minute})
			require.ErrorIs(t, err, inventory.ErrInvalidInput)
		}
		require.Equal(t, map[string]int{"reserve": 3}, b.drainOutbox(t))
		_, err = b.engine.Carts().CommitCart(b.ctx, buyer(2), cart.Token)
		require.ErrorIs(t, err, inventory.ErrForbidden, "only the holder commits")

		sold, err := b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, sold.Status)
		again, err := b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		_, err = b.engine.Carts().CancelCart(b.ctx, alice, cart.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCommitted)
		for i, sku := range skus {
			s := b.requireBalanced(t, sku)
			require.Equal(t, []int{2, 1, 2}[i], s.Sold)
		}
		nlines, sales, err := b.engine.Ledger().Sales().CartSales(b.ctx, cart.Token)
		require.NoError(t, err)
		require.Equal(t, 3, nlines)
		require.Len(t, sales, 3)

		// Cancel gives every line back, once.
		cart, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus[:1], 3)})
		require.NoError(t, err)
		gone, err := b.engine.Carts().CancelCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCancelled, gone.Status)
		gone, err = b.engine.Carts().CancelCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.True(t, gone.Replayed)
		require.Equal(t, 3, b.requireBalanced(t, skus[0]).Available)
		_, err = b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
	})
}

func TestCartIdempotencyKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := skusInPartitions("IDEM", 2)
		b.product(t, skus[0], 100, 0)
		b.product(t, skus[1], 100, 0)
		alice := buyer(1)
		req := inventory.CartRequest{Lines: lines(skus, 1, 2), IdempotencyKey: "cart-1"}

		tokens := make([]string, 64)
		raceCheck(t, len(tokens), func(i int) error {
			c, err := b.engine.Carts().ReserveCart(b.ctx, alice, req)
			tokens[i] = c.Token
			return err
		})
		for _, tok := range tokens {
			require.Equal(t, tokens[0], tok, "concurrent duplicates get one cart")
		}
		require.Equal(t, 1, b.stock(t, skus[0]).Held)
		require.Equal(t, 2, b.stock(t, skus[1]).Held)

		// The lines in another order are the same request.
		c, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: []inventory.CartLine{
			{SKU: skus[1], Quantity: 2}, {SKU: skus[0], Quantity: 1}}, IdempotencyKey: "cart-1"})
		require.NoError(t, err)
		require.Equal(t, tokens[0], c.Token)
		require.True(t, c.Replayed)

		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 1), IdempotencyKey: "cart-1"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1, IdempotencyKey: "cart-1"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "a cart's key cannot serve a reserve")

		// A refusal replays too, even once the stock is back.
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 500), IdempotencyKey: "cart-2"})
		require.ErrorIs(t, err, inventory.ErrInvalidInput)
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 99), IdempotencyKey: "cart-3"})
		var refused *inventory.CartRefusedError
		require.ErrorAs(t, err, &refused)
		require.Equal(t, 98, refused.Lines[0].Available())
		_, err = b.engine.Carts().CancelCart(b.ctx, alice, tokens[0])
		require.NoError(t, err)
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 99), IdempotencyKey: "cart-3"})
		require.ErrorAs(t, err, &refused)
		require.Equal(t, 98, refused.Lines[0].Available(), "the first refusal, replayed")
	})
}

// TestOverlappingCartsConcurrently buys carts of overlapping SKUs in
// thousands of goroutines: no SKU is oversold, no cart is held or sold in
// part, and Redis and the ledger agree row by row.
func TestOverlappingCartsConcurrently(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := skusInPartitions("OVL", 6)
		for _, sku := range skus {
			b.product(t, sku, 150, 0)
		}
		const carts = 2000
		type outcome struct {
			cart      inventory.Cart
			committed bool
			cancelled bool
		}
		results := make([]outcome, carts)
		var refusedN, unavailableN atomic.Int64
		raceCheck(t, carts, func(i int) error {
			// Three overlapping SKUs per cart, 1-2 units each.
			l := []inventory.CartLine{
				{SKU: skus[i%6], Quantity: 1 + i%2}, {SKU: skus[(i+1)%6], Quantity: 1}, {SKU: skus[(i+3)%6], Quantity: 1 + (i/2)%2}}
			c, err := b.engine.Carts().ReserveCart(b.ctx, buyer(i), inventory.CartRequest{Lines: l})
			for errors.Is(err, inventory.ErrUnavailable) {
				unavailableN.Add(1)
				c, err = b.engine.Carts().ReserveCart(b.ctx, buyer(i), inventory.CartRequest{Lines: l})
			}
			var refused *inventory.CartRefusedError
			switch {
			case errors.As(err, &refused):
				refusedN.Add(1)
				return nil
			case err != nil:
				return fmt.Errorf("cart %d: %w", i, err)
			}
			results[i].cart = c
			if i%3 == 0 {
				if _, err := b.engine.Carts().CancelCart(b.ctx, buyer(i), c.Token); err != nil {
					return fmt.Errorf("cancel %d: %w", i, err)
				}
				results[i].cancelled = true
				return nil
			}
			for {
				_, err := b.engine.Carts().CommitCart(b.ctx, buyer(i), c.Token)
				if errors.Is(err, inventory.ErrUnavailable) {
					continue
				}
				if err != nil {
					return fmt.Errorf("commit %d: %w", i, err)
				}
				results[i].committed = true
				return nil
			}
		})
		require.Positive(t, refusedN.Load(), "the stock runs out")
		t.Logf("%d carts: %d refused, %d tries answered UNAVAILABLE (too slow under load) and retried", carts, refusedN.Load(), unavailableN.Load())
		sold := map[string]int{}
		held := map[string]int{}
		var committed int
		for i, r := range results {
			if r.cart.Token == "" {
				continue
			}
			c, err := b.engine.Carts().CartOf(b.ctx, buyer(i), r.cart.Token)
			require.NoError(t, err)
			for _, l := range c.Lines {
				want := inventory.StatusHeld
				switch {
				case r.committed:
					want = inventory.StatusCommitted
					sold[l.SKU] += l.Quantity
				case r.cancelled:
					want = inventory.StatusCancelled
				default:
					held[l.SKU] += l.Quantity
				}
				require.Equal(t, want, l.Status, "cart %d: every line has the cart's fate", i)
			}
			if r.committed {
				committed++
				n, sales, err := b.engine.Ledger().Sales().CartSales(b.ctx, c.Token)
				require.NoError(t, err)
				require.Equal(t, 3, n)
				require.Len(t, sales, 3, "cart %d is sold whole in the ledger", i)
			}
		}
		require.Positive(t, committed)
		b.drainOutbox(t)
		for _, sku := range skus {
			s := b.requireBalanced(t, sku)
			require.Equal(t, sold[sku], s.Sold, sku)
			require.Equal(t, held[sku], s.Held, sku)
			require.LessOrEqual(t, s.Sold+s.Held, 150)
		}
		// Row by row: every sale of a cart line belongs to a cart sold whole,
		// and no ledger reservation of a line is left HELD but for carts still held.
		var partial int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM carts c
			WHERE c.lines <> (SELECT count(*) FROM sales s WHERE s.cart = c.token)`).Scan(&partial))
		require.Zero(t, partial, "no cart is sold in part")
		var loose, cartRows int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sales WHERE starts_with(token, 'l') AND cart IS NULL`).Scan(&loose))
		require.Zero(t, loose, "every line was sold with its cart")
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM carts`).Scan(&cartRows))
		require.Equal(t, committed, cartRows)
		var ledgerHeld int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(quantity), 0) FROM reservations WHERE status = 'HELD'`).Scan(&ledgerHeld))
		total := 0
		for _, n := range held {
			total += n
		}
		require.Equal(t, total, ledgerHeld, "the ledger holds what Redis holds")
	})
}

// TestCartWhoseCallerStalledIsLetGo pauses a cart between its steps far past
// its deadline, as a caller that died would: its units are back for other
// buyers within the deadline and the sweep, counted from the cart's opening,
// and the caller, waking up, is told the cart was not held and holds nothing.
//
// Not parallel: the bound is on the wall clock, so it runs in make test's
// quiet pass, with nothing else loading Redis and both cores.
func TestCartWhoseCallerStalledIsLetGo(t *testing.T) {
	testenv.Quiet(t)
	forEachBackend(t, func(t *testing.T, backend string) {
		const settle = time.Second
		b := setup(t, backend, inventory.Config{CartSettle: settle, CartPause: inventory.CartPause{At: inventory.CartPauseConfirmed, For: 2500 * time.Millisecond}})
		skus := skusInPartitions("STALL", 3)
		for _, sku := range skus {
			b.product(t, sku, 1, 0)
		}
		start := time.Now()
		var wg sync.WaitGroup
		var cartErr error
		wg.Go(func() {
			_, cartErr = b.engine.Carts().ReserveCart(b.ctx, buyer(1), inventory.CartRequest{Lines: lines(skus, 1, 1, 1)})
		})
		// While the caller sleeps, the sweepers run. The cart opened settle
		// before its deadline, which is its score in the index of pending
		// carts (ms, Redis' clock).
		var opened time.Time
		var freedAt time.Duration
		for freedAt == 0 && time.Since(start) < 5*time.Second {
			for p := range inventory.Partitions {
				_, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100)
				require.NoError(t, err)
			}
			_, err := b.engine.Maintenance().AbandonStaleCarts(b.ctx, 100)
			require.NoError(t, err)
			free, heldAll := true, true
			for _, sku := range skus {
				s := b.stock(t, sku)
				free = free && s.Available == 1
				heldAll = heldAll && s.Held == 1
			}
			if heldAll && opened.IsZero() {
				// Only this loop lets the cart go, so it is still pending.
				opened = time.UnixMilli(b.lastPendingDeadline(t)).Add(-settle)
			}
			if free && !opened.IsZero() {
				freedAt = time.Since(opened)
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.NotZero(t, freedAt)
		t.Logf("%s: the units were back %s after the cart opened", backend, freedAt.Round(time.Millisecond))
		require.Less(t, freedAt, 2*time.Second, "the units are back within the settle time and the sweep")
		wg.Wait()
		require.ErrorIs(t, cartErr, inventory.ErrUnavailable)
		for _, sku := range skus {
			require.Equal(t, 1, b.requireBalanced(t, sku).Available)
		}
	})
}

// lastPendingDeadline returns the latest deadline (ms) in the indexes of
// pending carts, of the cart opened last.
func (b *bundle) lastPendingDeadline(t *testing.T) int64 {
	t.Helper()
	var last int64
	for p := range inventory.Partitions {
		zs, err := b.rdb.ZRangeWithScores(b.ctx, b.engine.Keys().CartsPending(p), -1, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			last = max(last, int64(z.Score))
		}
	}
	require.NotZero(t, last, "no pending cart")
	return last
}

func TestExtendCart(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := skusInPartitions("EXTC", 3)
		for _, sku := range skus {
			b.product(t, sku, 2, 0)
		}
		alice := buyer(1)
		cart, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 1, 1), HoldFor: 30 * time.Second})
		require.NoError(t, err)
		_, err = b.engine.Carts().ExtendCart(b.ctx, buyer(2), cart.Token, inventory.ExtendRequest{HoldFor: time.Minute})
		require.ErrorIs(t, err, inventory.ErrForbidden)

		before := time.Now()
		longer, err := b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, inventory.ExtendRequest{HoldFor: 20 * time.Minute})
		require.NoError(t, err)
		require.WithinDuration(t, before.Add(20*time.Minute), longer.ExpiresAt, 5*time.Second)
		for _, l := range longer.Lines {
			require.Equal(t, inventory.StatusHeld, l.Status)
			require.Equal(t, 1, l.Extensions)
			require.False(t, l.ExpiresAt.After(longer.ExpiresAt), "no line outlives its cart")
			require.WithinDuration(t, longer.ExpiresAt, l.ExpiresAt, time.Second)
		}
		require.Equal(t, 3, b.drainOutbox(t)["extend"], "each line's extension reaches the ledger")
		_, err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, inventory.ExtendRequest{HoldFor: 20 * time.Minute})
		require.NoError(t, err)
		_, err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, inventory.ExtendRequest{HoldFor: 20 * time.Minute})
		var limit *inventory.ExtensionLimitError
		require.ErrorAs(t, err, &limit, "two extensions by default, for the cart as for a hold")
		sold, err := b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, sold.Status)
		_, err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, inventory.ExtendRequest{HoldFor: time.Minute})
		require.ErrorIs(t, err, inventory.ErrAlreadyCommitted)

		// An extension interrupted after one line: that line ends with its
		// cart all the same, let go by the cart sweep.
		cart, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 1, 1), HoldFor: time.Second})
		require.NoError(t, err)
		first := cart.Lines[0]
		later := time.Now().Add(time.Hour).UnixMilli()
		p := inventory.PartitionOf(first.SKU)
		require.NoError(t, b.rdb.HSet(b.ctx, b.engine.Keys().Hold(p, first.Token), "exp", later).Err())
		require.NoError(t, b.rdb.ZAdd(b.ctx, b.engine.Keys().Expiry(p), redis.Z{Score: float64(later), Member: first.Token}).Err())
		require.Eventually(t, func() bool {
			for p := range inventory.Partitions {
				if _, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100); err != nil {
					return false
				}
			}
			if _, err := b.engine.Maintenance().AbandonStaleCarts(b.ctx, 100); err != nil {
				return false
			}
			for _, sku := range skus {
				if b.stock(t, sku).Held != 0 {
					return false
				}
			}
			return true
		}, 5*time.Second, 20*time.Millisecond, "every line is let go by the cart's expiry")
		r, err := b.engine.Reservation(b.ctx, alice, first.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCancelled, r.Status, "the line that outlived its cart is let go")
		for _, sku := range skus {
			b.requireBalanced(t, sku)
		}
	})
}
