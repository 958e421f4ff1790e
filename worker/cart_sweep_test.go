package worker

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// 600 held carts of 50 lines each fall due while their server is dead (it
// was killed with its leases live, and nothing ran meanwhile); the server
// restarted finds all 30,000 lines and 600 carts due at once. Every unit
// comes back, once, and the cart sweep, each of its steps bounded to about
// BatchSize lines, lets go of every cart. How long that takes is logged,
// not bounded: at this size it is Redis' work of 30,000 releases (see
// docs/reliability.md), beyond the 2.5 s an interrupted cart is given.
func TestSixHundredFullCartsFallingDueAfterACrash(t *testing.T) {
	const carts, lines = 600, inventory.MaxCartLines
	b := setup(t)
	// The 50 SKUs live in four partitions, as a drop's sizes would in one.
	var skus []string
	for i := 0; len(skus) < lines; i++ {
		sku := "FULLCART-" + strconv.Itoa(i)
		if inventory.PartitionOf(sku) < 4 {
			skus = append(skus, sku)
		}
	}
	for _, sku := range skus {
		b.product(t, sku, carts)
	}
	req := inventory.CartRequest{HoldFor: 5 * time.Second}
	for _, sku := range skus {
		req.Lines = append(req.Lines, inventory.CartLine{SKU: sku, Quantity: 1})
	}

	dead, _ := b.startGroup(t, fastConfig("dead"))
	waitHeld(t, dead.Sweeper.leases, inventory.Partitions, "the first process owns every partition")
	dead.kill(t)

	began := time.Now()
	errs := make([]error, 32)
	var wg sync.WaitGroup
	for g := range errs {
		wg.Go(func() {
			for i := g; i < carts; i += len(errs) {
				_, err := b.engine.Carts().ReserveCart(b.ctx, inventory.Principal{ID: fmt.Sprintf("cart-buyer-%d", i)}, req)
				errs[g] = errors.Join(errs[g], err)
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	t.Logf("held %d carts of %d lines in %s", carts, lines, time.Since(began))
	for _, sku := range skus {
		require.Equal(t, carts, b.stock(t, sku).Held, sku)
	}
	var lastDue int64
	for p := range inventory.Partitions {
		zs, err := b.rdb.ZRangeWithScores(b.ctx, b.engine.Keys().Expiry(p), -1, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			lastDue = max(lastDue, int64(z.Score))
		}
	}
	eventually(t, time.Minute, func() bool {
		now, err := b.rdb.Time(b.ctx).Result()
		require.NoError(t, err)
		return now.UnixMilli() > lastDue
	}, "every line is due")

	restarted := time.Now()
	g, reg := b.startGroup(t, fastConfig("restarted"))
	var freed time.Duration
	eventually(t, 30*time.Second, func() bool {
		for _, sku := range skus {
			if b.stock(t, sku).Available != carts {
				return false
			}
		}
		freed = time.Since(restarted)
		return true
	}, "every unit is back")
	eventually(t, 30*time.Second, func() bool {
		for p := range inventory.Partitions {
			if n, err := b.rdb.ZCard(b.ctx, b.engine.Keys().CartsPending(p)).Result(); err != nil || n > 0 {
				return false
			}
		}
		return true
	}, "the cart sweep let go of every cart")
	swept := time.Since(restarted)
	t.Logf("restarted with %d lines of %d carts due: every unit back %s after the restart, every cart let go after %s",
		carts*lines, carts, freed.Round(time.Millisecond), swept.Round(time.Millisecond))

	// Each line released once: stock whole, one release per line.
	for _, sku := range skus {
		s := b.stock(t, sku)
		require.Equal(t, carts, s.Available, sku)
		require.Zero(t, s.Held, sku)
	}
	released := metric(t, reg, "dropline_holds_expired_total")
	t.Logf("the hold sweeper released %.0f lines, the cart sweep the other %.0f", released, float64(carts*lines)-released)
	stop(t, g.Group)
}
