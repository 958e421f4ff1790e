package inventory_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// holdField reads one field of a hold's hash in Redis.
func (b *bundle) holdField(t *testing.T, token, field string) string {
	t.Helper()
	p, err := strconv.Atoi(token[1:3])
	require.NoError(t, err)
	v, err := b.rdb.HGet(b.ctx, b.engine.Keys().Hold(p, token), field).Result()
	require.NoError(t, err)
	return v
}

// expiryScore is a token's score in its partition's expiry index (ms), or -1
// when it is not there.
func (b *bundle) expiryScore(t *testing.T, token string) int64 {
	t.Helper()
	p, err := strconv.Atoi(token[1:3])
	require.NoError(t, err)
	s, err := b.rdb.ZScore(b.ctx, b.engine.Keys().Expiry(p), token).Result()
	if err != nil {
		return -1
	}
	return int64(s)
}

func TestExtendHold(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{MaxHold: time.Minute, DefaultHold: 10 * time.Second})
		b.product(t, "EXT-1", 10, 0)
		alice, bob := buyer(1), buyer(2)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-1", Quantity: 2})
		require.NoError(t, err)
		require.Zero(t, h.Extensions)

		_, err = b.engine.Extend(b.ctx, bob, h.Token, inventory.ExtendRequest{HoldFor: 20 * time.Second})
		require.ErrorIs(t, err, inventory.ErrForbidden)
		for _, d := range []time.Duration{0, 500 * time.Millisecond, time.Minute + time.Second} {
			_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: d})
			var invalid *inventory.InvalidInputError
			require.ErrorAs(t, err, &invalid, "%s", d)
			require.Equal(t, "holdSeconds", invalid.Field)
		}
		require.Equal(t, h.ExpiresAt.UnixMilli(), b.expiryScore(t, h.Token), "refusals change nothing")

		before := time.Now()
		x1, err := b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 20 * time.Second})
		require.NoError(t, err)
		require.False(t, x1.Replayed)
		require.Equal(t, 1, x1.Extensions)
		require.Equal(t, inventory.StatusHeld, x1.Status)
		require.WithinDuration(t, before.Add(20*time.Second), x1.ExpiresAt, time.Second)
		require.Equal(t, x1.ExpiresAt.UnixMilli(), b.expiryScore(t, h.Token), "the sweeper sees the new expiry")
		require.Equal(t, strconv.FormatInt(x1.ExpiresAt.UnixMilli(), 10), b.holdField(t, h.Token, "exp"))

		// Past the longest hold after its creation: refused, nothing changes.
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: time.Minute})
		var limit *inventory.ExtensionLimitError
		require.ErrorAs(t, err, &limit)
		require.Equal(t, inventory.ExtensionLimitError{Limit: 2, Used: 1, Latest: h.CreatedAt.Add(time.Minute)}, *limit)
		require.Equal(t, inventory.ErrExtensionLimit.Code(), inventory.ErrorCode(err))

		x2, err := b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 30 * time.Second})
		require.NoError(t, err)
		require.Equal(t, 2, x2.Extensions)
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 5 * time.Second})
		require.ErrorAs(t, err, &limit)
		require.Equal(t, 2, limit.Used, "two extensions by default")
		got, err := b.engine.Reservation(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, x2.ExpiresAt, got.ExpiresAt)
		require.Equal(t, 2, got.Extensions)
		require.Equal(t, 8, b.requireBalanced(t, "EXT-1").Available, "an extension moves no stock")

		// The ledger has both extensions, each once, and the latest expiry.
		kinds := b.drainOutbox(t)
		require.Equal(t, 2, kinds["extend"])
		b.drainOutbox(t)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM stock_movements WHERE token = $1 AND kind = 'extend'`, h.Token))
		var exp time.Time
		var ext int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at, extensions FROM reservations WHERE token = $1`, h.Token).Scan(&exp, &ext))
		require.Equal(t, x2.ExpiresAt, exp.UTC())
		require.Equal(t, 2, ext)

		// Finished holds are not extended.
		c, err := b.engine.Commit(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, 2, c.Extensions)
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 5 * time.Second})
		require.ErrorIs(t, err, inventory.ErrAlreadyCommitted)
		h2, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-1", Quantity: 1})
		require.NoError(t, err)
		_, err = b.engine.Cancel(b.ctx, alice, h2.Token)
		require.NoError(t, err)
		_, err = b.engine.Extend(b.ctx, alice, h2.Token, inventory.ExtendRequest{HoldFor: 5 * time.Second})
		require.ErrorIs(t, err, inventory.ErrAlreadyCancelled)
	})
}

// A hold past its expiry that the sweeper has not released yet is EXPIRED to
// an extension, and nothing changes: the sweeper releases it as due.
func TestExtendAfterExpiryChangesNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "EXT-LATE", 1, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-LATE", Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(5 * time.Millisecond)) },
			3*time.Second, 10*time.Millisecond)
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: time.Minute})
		require.ErrorIs(t, err, inventory.ErrExpired)
		require.Equal(t, "HELD", b.holdField(t, h.Token, "st"), "nothing sweeps here, and the extension released nothing")
		require.Equal(t, h.ExpiresAt.UnixMilli(), b.expiryScore(t, h.Token))
		require.Equal(t, 1, b.requireBalanced(t, "EXT-LATE").Held)
		expired, err := b.engine.Maintenance().ExpireDue(b.ctx, inventory.PartitionOf("EXT-LATE"), 100)
		require.NoError(t, err)
		require.Len(t, expired, 1)
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: time.Minute})
		require.ErrorIs(t, err, inventory.ErrExpired)
		require.Zero(t, b.drainOutbox(t)["extend"])
	})
}

// Extensions racing the expiry sweeper: every hold is either extended or
// expired, never both, in Redis and in the ledger. Both outcomes happen by
// construction, whatever the machine's load: a third of the holds is
// extended long before its expiry (it must be extended), a third only after
// it (it must be refused EXPIRED), and the last third around the instant,
// from 500 ms before to 10 ms after, where either may win.
func TestExtensionRacingExpiry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const holds = 2000
		const (
			early = iota // hold for a minute, extended at once: certainly before its expiry
			late         // hold for 1 s, extended 50 ms after its expiry: certainly after it
			band         // hold for 2 s, extended around its expiry: either may win
		)
		group := func(i int) int { return i % 3 }
		holdFor := [...]time.Duration{early: time.Minute, late: time.Second, band: 2 * time.Second}
		b.product(t, "EXT-RACE", holds, 0)
		done := make(chan struct{})
		var sweeps sync.WaitGroup
		sweepErrs := make([]error, 4)
		var swept atomic.Int64
		for w := range sweepErrs {
			sweeps.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					for p := 0; p < inventory.Partitions; p++ {
						out, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100)
						if err != nil {
							sweepErrs[w] = fmt.Errorf("sweeper %d, partition %d: %w", w, p, err)
							return
						}
						swept.Add(int64(len(out)))
					}
				}
			})
		}
		stopSweeps := sync.OnceFunc(func() {
			close(done)
			sweeps.Wait()
		})
		defer stopSweeps()
		tokens := make([]string, holds)
		expires := make([]time.Time, holds)
		extended := make([]bool, holds)
		newExp := make([]time.Time, holds)
		// Each hold's extension is timed from its own reserve's answer, not
		// from the slowest of the 2,000: on a loaded machine the last reserve
		// answers seconds after the first.
		raceCheck(t, holds, func(i int) error {
			h, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "EXT-RACE", Quantity: 1, HoldFor: holdFor[group(i)]})
			if err != nil {
				return fmt.Errorf("reserve %d: %w", i, err)
			}
			tokens[i], expires[i] = h.Token, h.ExpiresAt
			switch group(i) {
			case late:
				time.Sleep(time.Until(expires[i].Add(50 * time.Millisecond)))
			case band:
				time.Sleep(time.Until(expires[i].Add(time.Duration(i%511-500) * time.Millisecond)))
			}
			x, err := b.engine.Extend(b.ctx, buyer(i), h.Token, inventory.ExtendRequest{HoldFor: 2 * time.Minute})
			switch {
			case err == nil:
				extended[i], newExp[i] = true, x.ExpiresAt
				return nil
			case errors.Is(err, inventory.ErrExpired):
				return nil
			default:
				return fmt.Errorf("extend %d: %w", i, err)
			}
		})
		nExtended, bandExtended := 0, 0
		for i, x := range extended {
			switch {
			case group(i) == early:
				require.True(t, x, "hold %d was extended long before its expiry", i)
			case group(i) == late:
				require.False(t, x, "hold %d was extended after its expiry", i)
			case x:
				bandExtended++
			}
			if x {
				nExtended++
			}
		}
		// Let the sweepers release every hold that was not extended.
		var last time.Time
		for i, exp := range expires {
			if group(i) != early && exp.After(last) {
				last = exp
			}
		}
		time.Sleep(time.Until(last))
		assert.Eventually(t, func() bool {
			s, err := b.engine.Catalog().Stock(b.ctx, "EXT-RACE")
			return err == nil && s.Held == nExtended
		}, 10*time.Second, 10*time.Millisecond)
		stopSweeps()
		require.NoError(t, errors.Join(sweepErrs...))
		t.Logf("%s: %d extended, %d expired (%d released by the sweepers); of the %d extended around their expiry, %d won",
			backend, nExtended, holds-nExtended, swept.Load(), (holds+1)/3, bandExtended)
		s := b.requireBalanced(t, "EXT-RACE")
		require.Equal(t, nExtended, s.Held)
		require.Equal(t, holds-nExtended, s.Available)
		require.EqualValues(t, holds-nExtended, swept.Load(), "each expired hold released once")

		kinds := b.drainOutbox(t)
		require.Equal(t, nExtended, kinds["extend"])
		require.Equal(t, holds-nExtended, kinds["expire"])
		type row struct {
			status string
			exp    time.Time
			ext    int
		}
		rows := map[string]row{}
		q, err := b.pool.Query(b.ctx, `SELECT token, status, expires_at, extensions FROM reservations WHERE sku = 'EXT-RACE'`)
		require.NoError(t, err)
		for q.Next() {
			var tok string
			var r row
			require.NoError(t, q.Scan(&tok, &r.status, &r.exp, &r.ext))
			rows[tok] = r
		}
		require.NoError(t, q.Err())
		movements := map[string]map[string]int{}
		q, err = b.pool.Query(b.ctx, `SELECT token, kind FROM stock_movements WHERE sku = 'EXT-RACE' AND token IS NOT NULL`)
		require.NoError(t, err)
		for q.Next() {
			var tok, kind string
			require.NoError(t, q.Scan(&tok, &kind))
			if movements[tok] == nil {
				movements[tok] = map[string]int{}
			}
			movements[tok][kind]++
		}
		require.NoError(t, q.Err())
		require.Len(t, rows, holds)
		for i, tok := range tokens {
			r, m := rows[tok], movements[tok]
			st := b.holdField(t, tok, "st")
			if extended[i] {
				require.Equal(t, "HELD", st, "hold %d was extended", i)
				require.Equal(t, "1", b.holdField(t, tok, "ext"))
				require.Equal(t, newExp[i].UnixMilli(), b.expiryScore(t, tok))
				require.Equal(t, row{"HELD", newExp[i], 1}, row{r.status, r.exp.UTC(), r.ext}, "ledger row of hold %d", i)
				require.Equal(t, map[string]int{"reserve": 1, "extend": 1}, m, "movements of hold %d", i)
			} else {
				require.Equal(t, "EXPIRED", st, "hold %d expired", i)
				require.Equal(t, -int64(1), b.expiryScore(t, tok))
				require.Equal(t, "EXPIRED", r.status, "ledger row of hold %d", i)
				require.Zero(t, r.ext)
				require.Equal(t, map[string]int{"reserve": 1, "expire": 1}, m, "movements of hold %d", i)
			}
		}
	})
}

// An extension the ledger has survives Redis losing its data: the rebuilt
// hold keeps its new expiry and the extensions it has used.
func TestExtensionSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "EXT-LOSS", 3, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-LOSS", Quantity: 1, HoldFor: 30 * time.Second})
		require.NoError(t, err)
		b.drainOutbox(t)
		x, err := b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 20 * time.Minute})
		require.NoError(t, err)
		// The write-behind has not run: only the extension's own write is in the ledger.
		b.wipe(t)

		got, err := b.engine.Reservation(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, x.ExpiresAt, got.ExpiresAt, "rebuilt with the extended expiry")
		require.Equal(t, 1, got.Extensions)
		require.Equal(t, x.ExpiresAt.UnixMilli(), b.expiryScore(t, h.Token))
		x2, err := b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 30 * time.Minute})
		require.NoError(t, err)
		require.Equal(t, 2, x2.Extensions)
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 30 * time.Minute})
		require.ErrorIs(t, err, inventory.ErrExtensionLimit, "the used extensions survive the loss")
		require.Equal(t, 1, b.requireBalanced(t, "EXT-LOSS").Held)
	})
}

// An extension sent with an idempotency key extends once, however often and
// however concurrently it is sent: a retry answers the hold as it is (even
// once the extensions are used up, or it was sold), the key with another
// length or another hold is refused, and so is a key a reserve used. The
// same for a cart, line by line.
func TestExtensionIdempotencyKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "EXT-KEY", 5, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-KEY", Quantity: 1, HoldFor: 30 * time.Second})
		require.NoError(t, err)

		// 50 concurrent duplicates: one extension.
		pay := inventory.ExtendRequest{HoldFor: 2 * time.Minute, IdempotencyKey: "pay-1"}
		const dups = 50
		answers := make([]inventory.Reservation, dups)
		raceCheck(t, dups, func(i int) error {
			var err error
			answers[i], err = b.engine.Extend(b.ctx, alice, h.Token, pay)
			return err
		})
		first := 0
		for _, a := range answers {
			if !a.Replayed {
				first++
			}
			require.Equal(t, 1, a.Extensions)
			require.Equal(t, answers[0].ExpiresAt, a.ExpiresAt)
		}
		require.Equal(t, 1, first, "one call extended, the others replayed it")
		require.Equal(t, answers[0].ExpiresAt.UnixMilli(), b.expiryScore(t, h.Token))

		// The retry a frontend sends after a timeout, a moment later.
		time.Sleep(28 * time.Millisecond)
		again, err := b.engine.Extend(b.ctx, alice, h.Token, pay)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, 1, again.Extensions, "the retry burns no extension")
		require.Equal(t, answers[0].ExpiresAt, again.ExpiresAt, "nor moves the expiry")

		// The second extension, with its own key; then the first key again
		// still replays, though no extension is left.
		second, err := b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 3 * time.Minute, IdempotencyKey: "pay-2"})
		require.NoError(t, err)
		require.False(t, second.Replayed)
		require.Equal(t, 2, second.Extensions)
		again, err = b.engine.Extend(b.ctx, alice, h.Token, pay)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, second.ExpiresAt, again.ExpiresAt, "the hold as it is now")

		// The key with anything else.
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: 5 * time.Minute, IdempotencyKey: "pay-1"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "another length")
		other, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "EXT-KEY", Quantity: 1, IdempotencyKey: "buy-1"})
		require.NoError(t, err)
		_, err = b.engine.Extend(b.ctx, alice, other.Token, pay)
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "another hold")
		_, err = b.engine.Extend(b.ctx, alice, other.Token, inventory.ExtendRequest{HoldFor: 2 * time.Minute, IdempotencyKey: "buy-1"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "a reserve's key")
		_, err = b.engine.Extend(b.ctx, buyer(2), h.Token, pay)
		require.ErrorIs(t, err, inventory.ErrForbidden, "keys are per principal: another's is a new call, and refused")
		_, err = b.engine.Extend(b.ctx, alice, h.Token, inventory.ExtendRequest{HoldFor: time.Minute, IdempotencyKey: strings.Repeat("k", 129)})
		require.ErrorIs(t, err, inventory.ErrInvalidInput)

		// Sold, the key still answers the hold.
		_, err = b.engine.Commit(b.ctx, alice, h.Token)
		require.NoError(t, err)
		again, err = b.engine.Extend(b.ctx, alice, h.Token, pay)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, inventory.StatusCommitted, again.Status)

		require.Equal(t, 2, b.drainOutbox(t)["extend"])
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM stock_movements WHERE token = $1 AND kind = 'extend'`, h.Token))
		require.Equal(t, 2, b.count(t, `SELECT extensions FROM reservations WHERE token = $1`, h.Token))

		// A cart: 50 concurrent duplicates extend each line once.
		skus := skusInPartitions("EXT-KEY-CART", 3)
		for _, sku := range skus {
			b.product(t, sku, 2, 0)
		}
		cart, err := b.engine.Carts().ReserveCart(b.ctx, alice, inventory.CartRequest{Lines: lines(skus, 1, 1, 1), HoldFor: 30 * time.Second})
		require.NoError(t, err)
		payCart := inventory.ExtendRequest{HoldFor: 10 * time.Minute, IdempotencyKey: "pay-cart"}
		carts := make([]inventory.Cart, dups)
		raceCheck(t, dups, func(i int) error {
			var err error
			carts[i], err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, payCart)
			return err
		})
		extended, err := b.engine.Carts().CartOf(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		for _, l := range extended.Lines {
			require.Equal(t, 1, l.Extensions, "line %s extended once", l.SKU)
			require.False(t, l.ExpiresAt.After(extended.ExpiresAt), "no line outlives its cart")
		}
		time.Sleep(28 * time.Millisecond)
		retried, err := b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, payCart)
		require.NoError(t, err)
		require.True(t, retried.Replayed)
		require.Equal(t, extended.ExpiresAt, retried.ExpiresAt)
		for _, l := range retried.Lines {
			require.Equal(t, 1, l.Extensions)
		}
		_, err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, inventory.ExtendRequest{HoldFor: 20 * time.Minute, IdempotencyKey: "pay-cart"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
		_, err = b.engine.Carts().ExtendCart(b.ctx, alice, cart.Token, pay)
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused, "a hold's key")
		b.drainOutbox(t)
		for _, l := range cart.Lines {
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM stock_movements WHERE token = $1 AND kind = 'extend'`, l.Token),
				"one extension of line %s in the ledger", l.SKU)
			require.Equal(t, 1, b.requireBalanced(t, l.SKU).Held)
		}
	})
}
