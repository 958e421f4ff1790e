package inventory_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// dropWithSizes makes a drop of limit units per person and one SKU per size,
// each with stock units.
func (b *bundle) dropWithSizes(t *testing.T, drop string, limit, stock int, sizes ...string) []string {
	t.Helper()
	_, err := b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: drop, Name: "Drop " + drop, MaxPerUser: limit})
	require.NoError(t, err)
	skus := make([]string, len(sizes))
	for i, size := range sizes {
		skus[i] = drop + "-" + size
		_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
			SKU: skus[i], Name: "Size " + size, Price: inventory.Money{Amount: 12000, Currency: "EUR"},
			Stock: stock, Drop: drop,
		})
		require.NoError(t, err)
	}
	return skus
}

func TestDropLimitAcrossSizes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := b.dropWithSizes(t, "AJ1", 2, 5, "40", "41", "42")
		for _, sku := range skus {
			require.Equal(t, inventory.DropPartition("AJ1"), b.engine.Keys().PartitionOf(sku), "%s lives in its drop's partition", sku)
			p, err := b.engine.Catalog().Product(b.ctx, sku)
			require.NoError(t, err)
			require.Equal(t, "AJ1", p.Drop)
		}
		d, err := b.engine.Drops().Drop(b.ctx, "AJ1")
		require.NoError(t, err)
		require.Equal(t, skus, d.SKUs)
		require.Equal(t, 2, d.MaxPerUser)

		alice, bob := buyer(1), buyer(2)
		h40, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[1], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[2], Quantity: 1})
		var quota *inventory.QuotaExceededError
		require.ErrorAs(t, err, &quota)
		require.Equal(t, inventory.QuotaExceededError{Limit: 2, Held: 2}, *quota, "one pair per person, across sizes")
		_, err = b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: skus[2], Quantity: 2})
		require.NoError(t, err, "the limit is per person")

		// A cancel frees the count; a sale keeps it.
		_, err = b.engine.Cancel(b.ctx, alice, h40.Token)
		require.NoError(t, err)
		h42, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[2], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Commit(b.ctx, alice, h42.Token)
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.ErrorAs(t, err, &quota)
		require.Equal(t, 2, quota.Held)
		for _, sku := range skus {
			b.requireBalanced(t, sku)
		}

		// Lost with Redis, the drop's count comes back from the ledger.
		b.drainOutbox(t)
		b.wipe(t)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.ErrorAs(t, err, &quota, "after Redis lost everything")
		require.Equal(t, inventory.QuotaExceededError{Limit: 2, Held: 2}, *quota)
		_, err = b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: skus[1], Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrQuotaExceeded, "bob's hold of another size was restored and counts")
		for _, sku := range skus {
			b.requireBalanced(t, sku)
		}
	})
}

// The drop's window applies to every SKU of the drop, whatever the SKU's own.
func TestDropWindowAppliesToEverySize(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		_, err := b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: "LATER", Name: "Later", MaxPerUser: 1, SaleStartsAt: &start})
		require.NoError(t, err)
		_, err = b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
			SKU: "LATER-43", Name: "43", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 3, Drop: "LATER"})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "LATER-43", Quantity: 1})
		var window *inventory.SaleNotActiveError
		require.ErrorAs(t, err, &window)
		require.Equal(t, start, *window.StartsAt)

		_, err = b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
			SKU: "NO-DROP", Name: "x", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 3, Drop: "MISSING"})
		var nf *inventory.NotFoundError
		require.ErrorAs(t, err, &nf)
		require.Equal(t, inventory.NotFoundError{Kind: "drop", Key: "MISSING", Field: "drop"}, *nf)
		_, err = b.engine.Catalog().Product(b.ctx, "NO-DROP")
		require.ErrorIs(t, err, inventory.ErrNotFound, "nothing was created")
		_, err = b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: "LATER", Name: "Again", MaxPerUser: 1})
		require.ErrorIs(t, err, inventory.ErrInvalidInput)
		_, err = b.engine.Drops().CreateDrop(b.ctx, buyer(1), inventory.DropInput{ID: "MINE", Name: "x", MaxPerUser: 1})
		require.ErrorIs(t, err, inventory.ErrForbidden)
		_, err = b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: "ZERO", Name: "x", MaxPerUser: 0})
		require.ErrorIs(t, err, inventory.ErrInvalidInput)
	})
}

// A SKU another instance put in a drop after this one started is found in
// its drop's partition here too: its first use rebuilds it from the ledger,
// which places it, and no key of it is ever written elsewhere.
func TestDropSKUCreatedByAnotherInstance(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		other, err := inventory.NewEngine(b.ctx, inventory.Config{KeyPrefix: b.prefix}, b.rdb, b.pool, zerolog.Nop())
		require.NoError(t, err)
		skus := b.dropWithSizes(t, "LATE-JOIN", 1, 4, "S", "M")
		require.Equal(t, inventory.PartitionOf(skus[1]), other.Keys().PartitionOf(skus[1]), "not placed yet")
		require.NotEqual(t, inventory.PartitionOf(skus[1]), inventory.DropPartition("LATE-JOIN"), "the test needs a SKU whose own partition differs")

		h, err := other.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: skus[1], Quantity: 1})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("r%02d.", inventory.DropPartition("LATE-JOIN")), h.Token[:4])
		_, err = other.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrQuotaExceeded)
		n, err := b.rdb.Exists(b.ctx, b.engine.Keys().Base(inventory.PartitionOf(skus[1]))+"sku:"+skus[1]).Result()
		require.NoError(t, err)
		require.Zero(t, n, "nothing of it in its own partition")
		require.Equal(t, 1, b.requireBalanced(t, skus[1]).Held)
	})
}

// One buyer sends 200 reserves at once over the sizes of a drop: exactly the
// drop's limit of them get units, in Redis and in the ledger.
func TestDropLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		sizes := []string{"38", "39", "40", "41", "42", "43", "44", "45"}
		const limit, reserves = 3, 200
		skus := b.dropWithSizes(t, "RUSH", limit, 50, sizes...)
		alice := buyer(1)
		var got, refused atomic.Int64
		tokens := make([]string, reserves)
		raceCheck(t, reserves, func(i int) error {
			h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[i%len(skus)], Quantity: 1 + i%2})
			switch {
			case err == nil:
				got.Add(int64(h.Quantity))
				tokens[i] = h.Token
				return nil
			case errors.Is(err, inventory.ErrQuotaExceeded):
				refused.Add(1)
				return nil
			}
			return fmt.Errorf("reserve %d: %w", i, err)
		})
		t.Logf("%s: %d units held, %d reserves refused", backend, got.Load(), refused.Load())
		require.LessOrEqual(t, got.Load(), int64(limit), "never more than the drop's limit")
		require.GreaterOrEqual(t, got.Load(), int64(limit-1), "a refusal leaves at most one unit unused (a reserve of 2 when 1 was left)")
		held := 0
		for _, sku := range skus {
			s := b.requireBalanced(t, sku)
			held += s.Held
			q, err := b.rdb.HGet(b.ctx, b.engine.Keys().Quota(sku), alice.ID).Int()
			if err == nil {
				require.Equal(t, s.Held, q, "%s: the buyer's count is what is held", sku)
			}
		}
		require.EqualValues(t, got.Load(), held)

		kinds := b.drainOutbox(t)
		var ledgerUnits, ledgerRows int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(quantity), 0), count(*) FROM reservations
			WHERE principal = $1 AND status = 'HELD'`, alice.ID).Scan(&ledgerUnits, &ledgerRows))
		require.EqualValues(t, got.Load(), ledgerUnits)
		require.Equal(t, kinds["reserve"], ledgerRows)
		for i, tok := range tokens {
			if tok != "" {
				require.Equal(t, "HELD", b.ledgerStatus(t, tok), "reserve %d", i)
			}
		}
	})
}

// Units freed on a SKU of a drop go to a waiter only within the drop's
// limit: a waiter who holds the limit in another size is passed over, and
// one who holds it already when it joins is refused (it could never be
// served).
func TestWaitlistHandoffKeepsTheDropLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := b.dropWithSizes(t, "PAIR", 1, 1, "A", "B")
		alice, bob, carol, dave := buyer(1), buyer(2), buyer(3), buyer(4)
		hb, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: skus[1], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, alice, inventory.JoinWaitlistRequest{SKU: skus[1], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.NoError(t, err, "alice waits for B and buys A meanwhile")
		_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, bob, inventory.JoinWaitlistRequest{SKU: skus[0], Quantity: 1})
		var quota *inventory.QuotaExceededError
		require.ErrorAs(t, err, &quota, "bob holds the drop's one pair: he could never be served")
		require.Equal(t, inventory.QuotaExceededError{Limit: 1, Held: 1}, *quota)
		_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, dave, inventory.JoinWaitlistRequest{SKU: skus[1], Quantity: 2})
		require.ErrorAs(t, err, &quota, "two are above the drop's limit of one")
		require.Equal(t, inventory.QuotaExceededError{Limit: 1, Held: 0}, *quota)
		_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, carol, inventory.JoinWaitlistRequest{SKU: skus[1], Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Cancel(b.ctx, bob, hb.Token)
		require.NoError(t, err)
		wa, err := b.engine.Waitlists().Waitlist(b.ctx, alice, skus[1])
		require.NoError(t, err)
		require.Equal(t, inventory.WaitStatus("WAITING"), wa.Status, "alice holds the drop's one pair already")
		wc, err := b.engine.Waitlists().Waitlist(b.ctx, carol, skus[1])
		require.NoError(t, err)
		require.NotEqual(t, inventory.WaitStatus("WAITING"), wc.Status, "the next waiter got the unit")
		s := b.requireBalanced(t, skus[1])
		require.Equal(t, 1, s.Held)
	})
}

// A cart's lines of a drop's SKUs are held to the drop's window and limit,
// as reserves are: counted with what the buyer holds or bought of the drop
// and with the cart's other lines of it. A refused cart holds nothing.
func TestCartKeepsTheDropLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := b.dropWithSizes(t, "CARTDROP", 2, 5, "A", "B", "C")
		b.product(t, "PLAIN-TEE", 5, 0)
		alice, bob := buyer(1), buyer(2)
		_, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[0], Quantity: 1})
		require.NoError(t, err)

		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: []inventory.CartLine{
			{SKU: "PLAIN-TEE", Quantity: 1}, {SKU: skus[1], Quantity: 1}, {SKU: skus[2], Quantity: 1}}})
		var refused *inventory.CartRefusedError
		require.ErrorAs(t, err, &refused)
		require.Len(t, refused.Lines, 1, "1 held and the cart's first line fill the limit of 2: the second is one too many")
		require.Equal(t, 2, refused.Lines[0].Index)
		var quota *inventory.QuotaExceededError
		require.ErrorAs(t, refused.Lines[0].Err, &quota)
		require.Equal(t, inventory.QuotaExceededError{Limit: 2, Held: 1}, *quota)
		require.Equal(t, 1, b.requireBalanced(t, skus[0]).Held, "alice's reserve")
		for _, sku := range []string{"PLAIN-TEE", skus[1], skus[2]} {
			require.Zero(t, b.requireBalanced(t, sku).Held, "a refused cart holds nothing (%s)", sku)
		}

		cart, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: []inventory.CartLine{
			{SKU: "PLAIN-TEE", Quantity: 1}, {SKU: skus[1], Quantity: 1}}})
		require.NoError(t, err, "1 held and 1 in the cart are within the limit")
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[2], Quantity: 1})
		require.ErrorAs(t, err, &quota, "the cart's line counts against the drop's limit")
		require.Equal(t, inventory.QuotaExceededError{Limit: 2, Held: 2}, *quota)
		_, err = b.engine.Carts().ReserveCart(b.ctx, bob, inventory.CartRequest{Lines: []inventory.CartLine{{SKU: skus[2], Quantity: 3}}})
		require.ErrorAs(t, err, &refused, "a line above the drop's limit on its own")
		_, err = b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.Equal(t, 1, b.requireBalanced(t, skus[1]).Sold)
	})
}

// Carts and reserves of one buyer racing over a drop's sizes never take
// more than the drop's limit: each is decided by may_take in the drop's
// partition, in one script.
func TestCartsAndReservesRacingKeepTheDropLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const limit = 3
		skus := b.dropWithSizes(t, "CARTRACE", limit, 50, "A", "B", "C", "D")
		alice := buyer(1)
		var held atomic.Int64
		raceCheck(t, 200, func(i int) error {
			units := 1
			var err error
			if i%2 == 0 {
				_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: skus[i%4], Quantity: 1})
			} else {
				units = 2
				_, err = b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: []inventory.CartLine{
					{SKU: skus[i%4], Quantity: 1}, {SKU: skus[(i+1)%4], Quantity: 1}}})
			}
			switch {
			case err == nil:
				held.Add(int64(units))
			case !errors.Is(err, inventory.ErrQuotaExceeded):
				return err
			}
			return nil
		})
		require.EqualValues(t, limit, held.Load(), "the buyer holds exactly the drop's limit")
		total := 0
		for _, sku := range skus {
			total += b.requireBalanced(t, sku).Held
		}
		require.Equal(t, limit, total, "Redis agrees")
		b.drainOutbox(t)
		require.Equal(t, limit, b.count(t, `SELECT coalesce(sum(quantity), 0)::int FROM reservations
			WHERE principal = $1 AND status = 'HELD'`, alice.ID), "and the ledger, row by row")
	})
}
