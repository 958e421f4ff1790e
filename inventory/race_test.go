package inventory_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/core"
)

// race runs fn in n goroutines released together and waits for all of them.
// fn must not assert (require stops only its own goroutine): it records what
// it saw for the test goroutine to check, or use raceCheck.
func race(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// raceCheck is race for an fn that returns what went wrong: it fails the
// test, on the test goroutine, with every error the goroutines returned.
func raceCheck(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

// drainOutbox applies every outbox event of every partition to the ledger, as
// the write-behind worker would, and returns the events by kind.
func (b *bundle) drainOutbox(t *testing.T) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	for p := 0; p < inventory.Partitions; p++ {
		msgs, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(p), "-", "+").Result()
		require.NoError(t, err)
		var events []db.Event
		for _, m := range msgs {
			ev, err := inventory.ParseEvent(m)
			require.NoError(t, err)
			events = append(events, ev)
			kinds[ev.Kind]++
		}
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, events))
	}
	return kinds
}

// loseOutbox deletes every entry of every partition's outbox, as a Redis that
// lost the stream (evicted, or deleted by hand) would: events the ledger has
// not applied are gone, and a rebuild cannot apply them first.
func (b *bundle) loseOutbox(t *testing.T) {
	t.Helper()
	for p := 0; p < inventory.Partitions; p++ {
		key := b.engine.Keys().Outbox(p)
		msgs, err := b.rdb.XRange(b.ctx, key, "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			require.NoError(t, b.rdb.XDel(b.ctx, key, m.ID).Err())
		}
	}
}

func TestNoOversellUnderTenThousandBuyers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "HOT-1", 100, 0)
		var won, outOfStock, other atomic.Int64
		raceCheck(t, 10_000, func(i int) error {
			_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "HOT-1", Quantity: 1})
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, inventory.ErrOutOfStock):
				outOfStock.Add(1)
			default:
				other.Add(1)
				return fmt.Errorf("reserve %d: %w", i, err)
			}
			return nil
		})
		require.EqualValues(t, 100, won.Load())
		require.EqualValues(t, 9_900, outOfStock.Load())
		s := b.requireBalanced(t, "HOT-1")
		require.Equal(t, 0, s.Available)
		require.Equal(t, 100, s.Held)

		kinds := b.drainOutbox(t)
		require.Equal(t, map[string]int{"reserve": 100}, kinds, "the outbox holds exactly one event per hold")
		var held, movements, distinct int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE sku = 'HOT-1' AND status = 'HELD'`).Scan(&held))
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT token) FROM stock_movements WHERE kind = 'reserve'`).Scan(&movements, &distinct))
		require.Equal(t, 100, held)
		require.Equal(t, 100, movements)
		require.Equal(t, 100, distinct)
		// Applying the same events again changes nothing.
		b.drainOutbox(t)
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM stock_movements`).Scan(&movements))
		require.Equal(t, 101, movements, "100 reserves + the initial stock, once each")
	})
}

func TestBoundaryStockN(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		for _, n := range []int{1, 2, 20} {
			sku := fmt.Sprintf("EDGE-%d", n)
			b.product(t, sku, n, 0)
			var won, lost atomic.Int64
			var lastAvailable atomic.Int64
			raceCheck(t, n+1, func(i int) error {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
				var oos *inventory.OutOfStockError
				switch {
				case err == nil:
					won.Add(1)
				case errors.As(err, &oos):
					lost.Add(1)
					lastAvailable.Store(int64(oos.Available))
				default:
					return fmt.Errorf("reserve %d: %w", i, err)
				}
				return nil
			})
			require.EqualValues(t, n, won.Load(), "stock %d", n)
			require.EqualValues(t, 1, lost.Load(), "stock %d", n)
			require.EqualValues(t, 0, lastAvailable.Load())
			require.Equal(t, 0, b.requireBalanced(t, sku).Available)
		}

		// Quantities above one near the boundary: 10 units, buyers of 3.
		b.product(t, "EDGE-Q", 10, 0)
		var units atomic.Int64
		raceCheck(t, 50, func(i int) error {
			h, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "EDGE-Q", Quantity: 3})
			if err == nil {
				units.Add(int64(h.Quantity))
				return nil
			}
			var oos *inventory.OutOfStockError
			if !errors.As(err, &oos) || oos.Available >= 3 {
				return fmt.Errorf("reserve %d: want out of stock with fewer than 3 left, got %w", i, err)
			}
			return nil
		})
		require.EqualValues(t, 9, units.Load(), "three buyers of 3 fit in 10")
		s := b.requireBalanced(t, "EDGE-Q")
		require.Equal(t, 1, s.Available)
		_, err := b.engine.Reserve(b.ctx, buyer(99), inventory.ReserveRequest{SKU: "EDGE-Q", Quantity: 1})
		require.NoError(t, err, "the last unit is still for sale")
		_, err = b.engine.Reserve(b.ctx, buyer(98), inventory.ReserveRequest{SKU: "EDGE-Q", Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrOutOfStock)
	})
}

func TestQuotaUnderConcurrency(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "LIMIT-2", 1000, 2)
		alice := buyer(1)
		var won, refused atomic.Int64
		raceCheck(t, 200, func(i int) error {
			_, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LIMIT-2", Quantity: 1})
			var q *inventory.QuotaExceededError
			switch {
			case err == nil:
				won.Add(1)
			case errors.As(err, &q):
				if q.Limit != 2 || q.Held != 2 {
					return fmt.Errorf("reserve %d: want limit 2 and 2 held, got %w", i, err)
				}
				refused.Add(1)
			default:
				return fmt.Errorf("reserve %d: %w", i, err)
			}
			return nil
		})
		require.EqualValues(t, 2, won.Load())
		require.EqualValues(t, 198, refused.Load())
		require.Equal(t, 2, b.requireBalanced(t, "LIMIT-2").Held)

		// Bought units count too; a cancelled one frees its place.
		page := mustHolds(t, b, alice, "LIMIT-2")
		_, err := b.engine.Commit(b.ctx, alice, page[0])
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LIMIT-2", Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrQuotaExceeded)
		_, err = b.engine.Cancel(b.ctx, alice, page[1])
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LIMIT-2", Quantity: 1})
		require.NoError(t, err)
		// Another principal is not affected.
		_, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "LIMIT-2", Quantity: 2})
		require.NoError(t, err)
		b.requireBalanced(t, "LIMIT-2")
	})
}

// mustHolds lists the HELD tokens of a principal for a SKU, from Redis.
func mustHolds(t *testing.T, b *bundle, p inventory.Principal, sku string) []string {
	t.Helper()
	var tokens []string
	for part := 0; part < inventory.Partitions; part++ {
		toks, err := b.rdb.ZRange(b.ctx, b.engine.Keys().Expiry(part), 0, -1).Result()
		require.NoError(t, err)
		for _, tok := range toks {
			r, err := b.engine.Reservation(b.ctx, admin, tok)
			require.NoError(t, err)
			if r.Principal == p.ID && r.SKU == sku && r.Status == inventory.StatusHeld {
				tokens = append(tokens, tok)
			}
		}
	}
	return tokens
}

func TestIdempotentReserve(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "IDEM-1", 10, 0)
		b.product(t, "IDEM-2", 10, 0)
		alice := buyer(1)
		req := inventory.ReserveRequest{SKU: "IDEM-1", Quantity: 2, IdempotencyKey: "checkout-42"}

		results := make([]inventory.Reservation, 50)
		raceCheck(t, 50, func(i int) error {
			h, err := b.engine.Reserve(b.ctx, alice, req)
			results[i] = h
			return err
		})
		fresh := 0
		for _, r := range results {
			require.Equal(t, results[0].Token, r.Token, "every duplicate gets the same hold")
			require.Equal(t, results[0].ExpiresAt, r.ExpiresAt)
			if !r.Replayed {
				fresh++
			}
		}
		require.Equal(t, 1, fresh, "exactly one call made the hold")
		require.Equal(t, 2, b.requireBalanced(t, "IDEM-1").Held)

		// Replay after success, even after the hold was committed.
		_, err := b.engine.Commit(b.ctx, alice, results[0].Token)
		require.NoError(t, err)
		again, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		require.Equal(t, results[0].Token, again.Token)
		require.Equal(t, inventory.StatusCommitted, again.Status)

		// The same key with a different input is refused, for this SKU or another.
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "IDEM-1", Quantity: 3, IdempotencyKey: "checkout-42"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "IDEM-2", Quantity: 2, IdempotencyKey: "checkout-42"})
		require.ErrorIs(t, err, inventory.ErrIdempotencyKeyReused)
		// The key is scoped to its principal.
		bob, err := b.engine.Reserve(b.ctx, buyer(2), req)
		require.NoError(t, err)
		require.NotEqual(t, results[0].Token, bob.Token)

		// A rejection replays as the same rejection, even once stock is back.
		big := inventory.ReserveRequest{SKU: "IDEM-2", Quantity: 11, IdempotencyKey: "too-many"}
		_, err = b.engine.Reserve(b.ctx, alice, big)
		var oos *inventory.OutOfStockError
		require.ErrorAs(t, err, &oos)
		require.Equal(t, 10, oos.Available)
		_, err = b.engine.Catalog().Restock(b.ctx, admin, "IDEM-2", 5, "back-in-stock")
		require.NoError(t, err)
		_, err = b.engine.Reserve(b.ctx, alice, big)
		require.ErrorAs(t, err, &oos)
		require.Equal(t, 10, oos.Available, "the first outcome is replayed")
		b.requireBalanced(t, "IDEM-2")
	})
}

func TestConcurrentCommitsOfOneToken(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ONCE-1", 3, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ONCE-1", Quantity: 2})
		require.NoError(t, err)
		raceCheck(t, 20, func(i int) error {
			c, err := b.engine.Commit(b.ctx, alice, h.Token)
			if err == nil && c.Status != inventory.StatusCommitted {
				err = fmt.Errorf("commit %d: status %s, want %s", i, c.Status, inventory.StatusCommitted)
			}
			return err
		})
		var rows int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sales WHERE token = $1`, h.Token).Scan(&rows))
		require.Equal(t, 1, rows)
		s := b.requireBalanced(t, "ONCE-1")
		require.Equal(t, 2, s.Sold)
		require.Equal(t, 1, s.Available)
		kinds := b.drainOutbox(t)
		require.Equal(t, 1, kinds["commit"], "one commit event")
	})
}

func TestHolderSafety(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "MINE-1", 5, 0)
		alice, mallory := buyer(1), buyer(666)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MINE-1", Quantity: 1})
		require.NoError(t, err)
		before := b.stock(t, "MINE-1")

		_, err = b.engine.Commit(b.ctx, mallory, h.Token)
		require.ErrorIs(t, err, inventory.ErrForbidden)
		_, err = b.engine.Cancel(b.ctx, mallory, h.Token)
		require.ErrorIs(t, err, inventory.ErrForbidden)
		_, err = b.engine.Reservation(b.ctx, mallory, h.Token)
		require.ErrorIs(t, err, inventory.ErrForbidden)
		after := b.stock(t, "MINE-1")
		require.Equal(t, before.Available, after.Available)
		require.Equal(t, before.Held, after.Held)
		got, err := b.engine.Reservation(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, got.Status)

		// An admin may cancel anyone's hold, but not commit it.
		_, err = b.engine.Commit(b.ctx, admin, h.Token)
		require.ErrorIs(t, err, inventory.ErrForbidden)
		c, err := b.engine.Cancel(b.ctx, admin, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCancelled, c.Status)
		require.Equal(t, 5, b.requireBalanced(t, "MINE-1").Available)

		// Forged and malformed tokens.
		_, err = b.engine.Commit(b.ctx, alice, "r03.aaaaaaaaaaaaaaaaaaaaaaaaaa")
		require.ErrorIs(t, err, inventory.ErrNotFound)
		for _, bad := range []string{"", "nope", "r99.aaaaaaaaaaaaaaaaaaaaaaaaaa", "r03.AAAAAAAAAAAAAAAAAAAAAAAAAA", "r03.aaaa"} {
			_, err = b.engine.Commit(b.ctx, alice, bad)
			require.ErrorIs(t, err, inventory.ErrInvalidInput, "token %q", bad)
		}
	})
}

func TestCommitRacingExpiry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const holds = 1000
		b.product(t, "RACE-1", holds, 0)
		tokens := make([]string, holds)
		who := make([]inventory.Principal, holds)
		raceCheck(t, holds, func(i int) error {
			who[i] = buyer(i)
			h, err := b.engine.Reserve(b.ctx, who[i], inventory.ReserveRequest{SKU: "RACE-1", Quantity: 1, HoldFor: time.Second})
			tokens[i] = h.Token
			return err
		})
		first, err := b.engine.Reservation(b.ctx, admin, tokens[0])
		require.NoError(t, err)
		// Wait until just before the holds fall due, then let commits and the
		// expiry sweep run against each other across the expiry instant.
		time.Sleep(time.Until(first.ExpiresAt.Add(-5 * time.Millisecond)))
		var committed, expired atomic.Int64
		// The sweepers stop before the test ends, however it ends, and what
		// they hit is asserted here, on the test goroutine.
		done := make(chan struct{})
		var sweeps sync.WaitGroup
		sweepErrs := make([]error, 4)
		for w := range sweepErrs {
			sweeps.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					for p := 0; p < inventory.Partitions; p++ {
						if _, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100); err != nil {
							sweepErrs[w] = fmt.Errorf("sweeper %d, partition %d: %w", w, p, err)
							return
						}
					}
				}
			})
		}
		stopSweeps := sync.OnceFunc(func() {
			close(done)
			sweeps.Wait()
		})
		defer stopSweeps()
		// A commit answered UNAVAILABLE (Postgres slower than CommitTimeout,
		// as on a loaded machine) leaves its hold COMMITTING, out of reach of
		// expiry; the buyer retries, as the answer says, and the retry asks
		// Postgres and finishes the hold either way.
		var retried atomic.Int64
		raceCheck(t, holds, func(i int) error {
			for attempt := 1; ; attempt++ {
				_, err := b.engine.Commit(b.ctx, who[i], tokens[i])
				switch {
				case err == nil:
					committed.Add(1)
					return nil
				case errors.Is(err, inventory.ErrExpired):
					expired.Add(1)
					return nil
				case errors.Is(err, inventory.ErrUnavailable) && attempt < 5:
					retried.Add(1)
				default:
					return fmt.Errorf("commit %d, attempt %d: %w", i, attempt, err)
				}
			}
		})
		// Let the sweepers finish whatever is still due.
		assert.Eventually(t, func() bool {
			s, err := b.engine.Catalog().Stock(b.ctx, "RACE-1")
			return err == nil && s.Held == 0
		}, 10*time.Second, 10*time.Millisecond)
		stopSweeps()
		require.NoError(t, errors.Join(sweepErrs...))
		require.Zero(t, b.stock(t, "RACE-1").Held, "the sweepers ended every hold")
		t.Logf("%s: %d committed, %d expired, %d commits retried after UNAVAILABLE", backend, committed.Load(), expired.Load(), retried.Load())
		require.EqualValues(t, holds, committed.Load()+expired.Load())

		s := b.requireBalanced(t, "RACE-1")
		require.EqualValues(t, committed.Load(), s.Sold)
		require.EqualValues(t, expired.Load(), s.Available)

		kinds := b.drainOutbox(t)
		require.EqualValues(t, committed.Load(), kinds["commit"])
		require.EqualValues(t, expired.Load(), kinds["expire"])
		var both int
		require.NoError(t, b.pool.QueryRow(b.ctx, `
			SELECT count(*) FROM sales s JOIN stock_movements m ON m.token = s.token AND m.kind IN ('expire', 'cancel')`).Scan(&both))
		require.Zero(t, both, "no unit is both sold and released")
		var statuses int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE status = 'HELD'`).Scan(&statuses))
		require.Zero(t, statuses)
	})
}

func TestCommitAfterExpiry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "LATE-1", 2, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "LATE-1", Quantity: 2, HoldFor: time.Second})
		require.NoError(t, err)
		// Nothing sweeps in this test: the commit itself finds the hold past due.
		require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(5 * time.Millisecond)) },
			3*time.Second, 10*time.Millisecond)
		_, err = b.engine.Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrExpired)
		require.Equal(t, 2, b.requireBalanced(t, "LATE-1").Available, "commit after expiry releases the units once")
		_, err = b.engine.Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrExpired)
		expired, err := b.engine.Maintenance().ExpireDue(b.ctx, inventory.PartitionOf("LATE-1"), 100)
		require.NoError(t, err)
		require.Empty(t, expired, "already released: the sweeper has nothing to do")
		require.Equal(t, 2, b.requireBalanced(t, "LATE-1").Available)
	})
}

// Concurrent first uses of many keys, each sent twice for one SKU and
// twice for another at once, their claims sharing the reserves' pipelined
// transport: each key ends pinned to one SKU, which holds once and replays
// that hold to its duplicate, while both requests for the other SKU are
// refused as reused. Redis (the claims, the holds, the stock) and the
// ledger agree key by key.
func TestConcurrentClaimsOfManyKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const keys = 500
		b.product(t, "CLAIMS-A", keys, 0)
		b.product(t, "CLAIMS-B", keys, 0)
		alice := buyer(1)
		skus := [4]string{"CLAIMS-A", "CLAIMS-A", "CLAIMS-B", "CLAIMS-B"}
		results := make([]inventory.Reservation, 4*keys)
		errs := make([]error, 4*keys)
		raceCheck(t, 4*keys, func(i int) error {
			req := inventory.ReserveRequest{SKU: skus[i%4], Quantity: 1, IdempotencyKey: "claim-" + strconv.Itoa(i/4)}
			results[i], errs[i] = b.engine.Reserve(b.ctx, alice, req)
			if errs[i] != nil && !errors.Is(errs[i], inventory.ErrIdempotencyKeyReused) {
				return errs[i]
			}
			return nil
		})

		held := map[string]int{}  // by SKU
		made := map[string]bool{} // the holds' tokens
		for k := range keys {
			key := "claim-" + strconv.Itoa(k)
			var won string
			var tokens []string
			fresh := 0
			for j := range 4 {
				i := 4*k + j
				if errs[i] != nil {
					continue
				}
				require.True(t, won == "" || won == skus[j], "%s held for both SKUs", key)
				won = skus[j]
				tokens = append(tokens, results[i].Token)
				if !results[i].Replayed {
					fresh++
				}
			}
			require.NotEmpty(t, won, "%s: every request refused", key)
			require.Len(t, tokens, 2, "%s: both requests for %s answered with the hold", key, won)
			require.Equal(t, tokens[0], tokens[1], key)
			require.Equal(t, 1, fresh, "%s: one request made the hold", key)
			for j := range 4 {
				if skus[j] != won {
					require.ErrorIs(t, errs[4*k+j], inventory.ErrIdempotencyKeyReused, key)
				}
			}
			claim, err := b.rdb.Get(b.ctx, b.engine.Keys().IdempotencyClaim(core.IdempotencyHash(alice.ID, key))).Result()
			require.NoError(t, err)
			require.Equal(t, won, claim, key)
			held[won]++
			made[tokens[0]] = true
		}
		require.Equal(t, keys, held["CLAIMS-A"]+held["CLAIMS-B"])
		for _, sku := range []string{"CLAIMS-A", "CLAIMS-B"} {
			require.Equal(t, held[sku], b.requireBalanced(t, sku).Held, sku)
		}
		b.drainOutbox(t)
		rows, err := b.pool.Query(b.ctx, `SELECT token, sku FROM reservations WHERE status = 'HELD'`)
		require.NoError(t, err)
		inLedger := map[string]int{}
		n := 0
		for rows.Next() {
			var token, sku string
			require.NoError(t, rows.Scan(&token, &sku))
			require.True(t, made[token], "ledger row %s is a hold a key made", token)
			inLedger[sku]++
			n++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, keys, n, "one ledger row per key")
		require.Equal(t, held["CLAIMS-A"], inLedger["CLAIMS-A"])
		require.Equal(t, held["CLAIMS-B"], inLedger["CLAIMS-B"])
	})
}
