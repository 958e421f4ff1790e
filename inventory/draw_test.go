package inventory_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/drawverify"
	"github.com/dropline/dropline/inventory"
)

// drawProduct creates a SKU sold by draw, its entries open now.
func (b *bundle) drawProduct(t testing.TB, sku string, stock int, closesIn, hold time.Duration) {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: "Draw " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: stock,
		Draw: &inventory.DrawInput{ClosesAt: time.Now().Add(closesIn), WinnerHold: hold},
	})
	require.NoError(t, err)
}

// closeDraw moves a draw's closesAt to now, on Postgres' clock.
func (b *bundle) closeDraw(t testing.TB, sku string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = $1`, sku)
	require.NoError(t, err)
}

// bulkEntries writes n entries straight into the ledger, quantity 1 to 3.
func (b *bundle) bulkEntries(t testing.TB, sku string, n int) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO draw_entries (sku, principal, quantity)
		SELECT $1, 'entrant-' || g, 1 + g % 3 FROM generate_series(1, $2) g`, sku, n)
	require.NoError(t, err)
}

// requireDrawApplied checks a drawn SKU against a recomputation from its
// revealed seed and its entries, and Redis against the ledger's result, row
// by row: every winner holds one HELD reservation of its quantity under the
// token the ledger gave it, the stock's held units are exactly the winners',
// and the losers wait in the waitlist in draw order (up to its bound). It
// returns the result by place.
func (b *bundle) requireDrawApplied(t *testing.T, sku string, waitlistMax int) []db.DrawEntry {
	t.Helper()
	d, err := b.engine.Draws().DrawOf(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, inventory.DrawDrawn, d.Status)
	require.True(t, d.Applied)
	require.Equal(t, db.SeedHash(d.Seed), d.SeedHash, "the revealed seed is the one committed to")
	entries, err := b.engine.Ledger().Draws().DrawEntries(b.ctx, sku)
	require.NoError(t, err)
	qty := make([]int, len(entries))
	for i, e := range entries {
		qty[i] = e.Quantity
	}
	places, won := inventory.DrawDecision(d.Seed, d.Stock, qty)
	winners, units := 0, 0
	for i, e := range entries {
		require.Equal(t, places[i], e.Place, "entry %d", e.ID)
		if won[i] {
			require.Equal(t, db.EntryWon, e.Status, "entry %d", e.ID)
			winners++
			units += e.Quantity
		} else {
			require.Equal(t, db.EntryLost, e.Status, "entry %d", e.ID)
		}
	}
	require.Equal(t, winners, d.Winners)
	require.LessOrEqual(t, units, d.Stock)

	result, err := b.engine.Ledger().Draws().DrawResult(b.ctx, sku)
	require.NoError(t, err)
	require.Len(t, result, len(entries))
	var losers []db.DrawEntry
	for _, e := range result {
		if e.Status != db.EntryWon {
			losers = append(losers, e)
			continue
		}
		h, err := b.rdb.HGetAll(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf(sku), e.Token)).Result()
		require.NoError(t, err)
		require.Equal(t, "HELD", h["st"], "winner %s", e.Principal)
		require.Equal(t, e.Principal, h["who"])
		require.Equal(t, fmt.Sprint(e.Quantity), h["qty"])
	}
	s := b.requireBalanced(t, sku)
	require.Equal(t, units, s.Held, "held units are exactly the winners'")
	queue, err := b.rdb.ZRange(b.ctx, b.engine.Keys().WaitQueue(sku), 0, -1).Result()
	require.NoError(t, err)
	want := make([]string, 0, len(losers))
	for _, e := range losers[:min(len(losers), waitlistMax)] {
		want = append(want, e.Principal)
	}
	require.Equal(t, want, queue, "losers wait in draw order")
	return result
}

// TestDrawShuffleIsDeterministicAndEven: one seed gives one order; over many
// seeds each of 3 entries takes the first place about a third of the time.
func TestDrawShuffleIsDeterministicAndEven(t *testing.T) {
	t.Parallel()
	seed := make([]byte, 32)
	require.Equal(t, inventory.DrawOrder(seed, 1000), inventory.DrawOrder(seed, 1000))
	seed2 := append([]byte{}, seed...)
	seed2[31] = 1
	require.NotEqual(t, inventory.DrawOrder(seed, 1000), inventory.DrawOrder(seed2, 1000))
	var first [3]int
	const runs = 30000
	for i := range runs {
		s := make([]byte, 32)
		s[0], s[1], s[2] = byte(i), byte(i>>8), byte(i>>16)
		first[inventory.DrawOrder(s, 3)[0]]++
	}
	for i, n := range first {
		require.InDelta(t, runs/3, n, runs/30, "entry %d first %d times of %d", i, n, runs)
	}
	// The fill skips an entry that does not fit and goes on.
	order, won := inventory.DrawWinners(seed, 3, []int{2, 2, 1, 3})
	left := 3
	for _, i := range order {
		q := []int{2, 2, 1, 3}[i]
		require.Equal(t, q <= left, won[i], "entry %d", i)
		if won[i] {
			left -= q
		}
	}
}

// TestDrawEndToEndInTheEngine, on a single Redis and a cluster: entries from 1,000 concurrent entrants (each
// entering twice at once: one entry each), reserves and waitlist joins
// refused, entries refused once closed, four concurrent draws of which one
// draws, and the result in Redis and in the ledger row by row.
func TestDrawEndToEndInTheEngine(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) { drawEndToEndInTheEngine(t, backend) })
}

func drawEndToEndInTheEngine(t *testing.T, backend string) {
	b := setup(t, backend, inventory.Config{})
	const sku, stock, entrants = "DRAW-1", 300, 1000
	b.drawProduct(t, sku, stock, time.Hour, time.Minute)

	d, err := b.engine.Draws().DrawOf(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, inventory.DrawOpen, d.Status)
	require.Nil(t, d.Seed, "the seed stays secret until the draw")
	require.Len(t, d.SeedHash, 64)

	_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1})
	require.ErrorIs(t, err, inventory.ErrDrawOnly)
	require.Equal(t, inventory.ErrDrawOnly.Code(), inventory.ErrorCode(err))
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, buyer(1), inventory.JoinWaitlistRequest{SKU: sku, Quantity: 1})
	require.ErrorIs(t, err, inventory.ErrDrawOnly, "a draw's waitlist is its losers only")

	var wg sync.WaitGroup
	var replays atomic.Int64
	errs := make(chan error, 2*entrants)
	for i := range entrants {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, 1+i%2)
				if err != nil {
					errs <- err
					return
				}
				if e.Replayed {
					replays.Add(1)
				}
				if e.Status != inventory.EntryEntered || e.Quantity != 1+i%2 {
					errs <- fmt.Errorf("entrant %d: %+v", i, e)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, entrants, replays.Load(), "the second entry of each entrant replays the first")
	require.Equal(t, entrants, b.count(t, `SELECT count(*) FROM draw_entries WHERE sku = $1`, sku))

	_, err = b.engine.Draws().RunDraw(b.ctx, sku)
	var inv *inventory.InvalidInputError
	require.ErrorAs(t, err, &inv, "no draw before closesAt")

	b.closeDraw(t, sku)
	_, err = b.engine.Draws().EnterDraw(b.ctx, buyer(entrants+1), sku, 1)
	var closed *inventory.SaleNotActiveError
	require.ErrorAs(t, err, &closed, "no entry once closed")
	again, err := b.engine.Draws().EnterDraw(b.ctx, buyer(3), sku, 1)
	require.NoError(t, err, "an entrant entering again after the close gets its entry back")
	require.True(t, again.Replayed)

	var drew atomic.Int64
	var dwg sync.WaitGroup
	derrs := make(chan error, 4)
	for range 4 {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			rep, err := b.engine.Draws().RunDraw(b.ctx, sku)
			if err != nil {
				derrs <- err
				return
			}
			if rep.Drew {
				drew.Add(1)
			}
		}()
	}
	dwg.Wait()
	close(derrs)
	for err := range derrs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, drew.Load(), "exactly one call draws")
	result := b.requireDrawApplied(t, sku, inventory.DefaultWaitlistMax)

	// Each entrant sees its outcome; a winner its reservation.
	for _, e := range result[:5] {
		mine, err := b.engine.Draws().MyDrawEntries(b.ctx, inventory.Principal{ID: e.Principal})
		require.NoError(t, err)
		require.Len(t, mine, 1)
		require.Equal(t, e.Status, mine[0].Status)
		require.Equal(t, e.Place, mine[0].Place)
		if e.Status == db.EntryWon {
			require.NotNil(t, mine[0].Reservation)
			require.Equal(t, inventory.StatusHeld, mine[0].Reservation.Status)
		}
	}

	// The ledger gets the winners' reservations and the losers' waitlist
	// entries through the outbox, like every other hold and join.
	b.drainOutbox(t)
	won := b.count(t, `SELECT count(*) FROM draw_results WHERE sku = $1 AND won`, sku)
	require.Equal(t, won, b.count(t, `SELECT count(*) FROM reservations v JOIN draw_results r ON r.token = v.token
		JOIN draw_entries e ON e.id = r.entry_id
		WHERE r.sku = $1 AND v.status = 'HELD' AND v.principal = e.principal AND v.quantity = e.quantity`, sku))
	require.Equal(t, entrants-won, b.count(t, `SELECT count(*) FROM waitlist_entries w JOIN draw_entries e
		ON e.sku = w.sku AND e.principal = w.principal JOIN draw_results r ON r.entry_id = e.id
		WHERE w.sku = $1 AND NOT r.won AND w.status = 'WAITING'`, sku))

	// A winner who cancels passes its units to the first loser, in draw
	// order, whose quantity fits.
	var winner db.DrawEntry
	for _, e := range result {
		if e.Status == db.EntryWon {
			winner = e
			break
		}
	}
	free := b.stock(t, sku).Available + winner.Quantity
	_, err = b.engine.Cancel(b.ctx, inventory.Principal{ID: winner.Principal}, winner.Token)
	require.NoError(t, err)
	for _, e := range result {
		if e.Status == db.EntryLost && e.Quantity <= free {
			w, err := b.engine.Waitlists().Waitlist(b.ctx, inventory.Principal{ID: e.Principal}, sku)
			require.NoError(t, err)
			require.Equal(t, inventory.WaitOffered, w.Status, "the first loser who fits is served first")
			break
		}
	}
	b.requireBalanced(t, sku)
}

// TestDrawCrashResumesWithoutDrawingTwice stops the draw as a crash would,
// first before its transaction commits, then after one batch of its result
// reached Redis, and runs it again each time: the result is the one the seed
// gives, and nothing is handed out twice.
func TestDrawCrashResumesWithoutDrawingTwice(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) { drawCrashResumesWithoutDrawingTwice(t, backend) })
}

func drawCrashResumesWithoutDrawingTwice(t *testing.T, backend string) {
	b := setup(t, backend, inventory.Config{})
	const sku, stock, entrants = "DRAW-CRASH", 1500, 3000
	b.drawProduct(t, sku, stock, time.Hour, time.Minute)
	b.bulkEntries(t, sku, entrants)
	b.closeDraw(t, sku)
	crash := errors.New("killed")

	_, err := b.engine.Draws().RunDrawSteps(b.ctx, sku, func(st inventory.DrawStage, _ int) error {
		if st == inventory.DrawDecided {
			return crash
		}
		return nil
	})
	require.ErrorIs(t, err, crash)
	d, err := b.engine.Draws().DrawOf(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, inventory.DrawOpen, d.Status, "a crash before the commit leaves no draw")
	require.Zero(t, b.count(t, `SELECT count(*) FROM draw_results WHERE sku = $1`, sku))
	require.Zero(t, b.stock(t, sku).Held)

	rep, err := b.engine.Draws().RunDrawSteps(b.ctx, sku, func(st inventory.DrawStage, applied int) error {
		if st == inventory.DrawApplying && applied >= 1000 {
			return crash
		}
		return nil
	})
	require.ErrorIs(t, err, crash)
	require.True(t, rep.Drew)
	half, err := b.engine.Ledger().Draws().DrawResult(b.ctx, sku)
	require.NoError(t, err)
	require.Positive(t, b.stock(t, sku).Held, "the first batch reached Redis")

	rep, err = b.engine.Draws().RunDraw(b.ctx, sku)
	require.NoError(t, err)
	require.False(t, rep.Drew, "the resumed call does not draw again")
	result := b.requireDrawApplied(t, sku, inventory.DefaultWaitlistMax)
	require.Equal(t, half, result, "the result committed before the crash is the one applied")

	rep, err = b.engine.Draws().RunDraw(b.ctx, sku)
	require.NoError(t, err)
	require.False(t, rep.Drew)
	require.Zero(t, rep.Holds+rep.Queued, "a finished draw writes nothing")
	b.requireDrawApplied(t, sku, inventory.DefaultWaitlistMax)
}

// TestDrawOfTwentyThousandEntriesInManyBatches draws 20,000 entries for
// 4,000 units, a result carried to Redis in batches of 250 entries of
// apply_draw.lua, and checks Redis and the ledger against a recomputation,
// entry by entry. How long a draw takes is BenchmarkDrawOfHundredThousandEntries'.
func TestDrawOfTwentyThousandEntriesInManyBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	const sku, stock, entrants = "DRAW-20K", 4000, 20000
	b.drawProduct(t, sku, stock, time.Hour, time.Minute)
	b.bulkEntries(t, sku, entrants)
	b.closeDraw(t, sku)
	rep, err := b.engine.Draws().RunDraw(b.ctx, sku)
	require.NoError(t, err)
	require.True(t, rep.Drew)
	require.Equal(t, entrants, rep.Draw.Entries)
	b.requireDrawApplied(t, sku, inventory.DefaultWaitlistMax)
}

// BenchmarkDrawOfHundredThousandEntries times one draw of 100,000 entries
// for 20,000 units, decided in Postgres and carried to Redis (holds and
// waitlist), each on a new SKU; the draw alone is timed. On a quiet machine,
// without -race: go test -run '^$' -bench DrawOfHundredThousand ./inventory/
func BenchmarkDrawOfHundredThousandEntries(b *testing.B) {
	bb := setup(b, "single", inventory.Config{})
	const stock, entrants = 20000, 100000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sku := fmt.Sprintf("DRAW-100K-%d", i)
		bb.drawProduct(b, sku, stock, time.Hour, time.Minute)
		bb.bulkEntries(b, sku, entrants)
		bb.closeDraw(b, sku)
		b.StartTimer()
		rep, err := bb.engine.Draws().RunDraw(bb.ctx, sku)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Drew || rep.Draw.Entries != entrants {
			b.Fatalf("drew %+v, want one draw of %d entries", rep, entrants)
		}
		b.ReportMetric(rep.Decide.Seconds(), "postgres-s/draw")
		b.ReportMetric(rep.Apply.Seconds(), "redis-s/draw")
	}
}

// TestCartCannotEmptyADraw, on a single Redis and a cluster: a draw product
// of 3 units is refused to a reserve (DRAW_ONLY) and to a cart line alike, so
// after the draw every winner holds its units and no one else does.
func TestCartCannotEmptyADraw(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "DRAW-CART"
		b.drawProduct(t, sku, 3, time.Hour, time.Minute)
		b.product(t, "CART-OTHER", 5, 0)
		cartBuyer := buyer(99)

		_, err := b.engine.Reserve(b.ctx, cartBuyer, inventory.ReserveRequest{SKU: sku, Quantity: 3})
		require.ErrorIs(t, err, inventory.ErrDrawOnly)
		_, err = b.engine.Carts().ReserveCart(b.ctx, cartBuyer, inventory.CartRequest{Lines: []inventory.CartLine{
			{SKU: "CART-OTHER", Quantity: 1}, {SKU: sku, Quantity: 3}}})
		var refused *inventory.CartRefusedError
		require.ErrorAs(t, err, &refused, "a cart line may not take a draw's units")
		require.Len(t, refused.Lines, 1)
		require.Equal(t, 1, refused.Lines[0].Index)
		require.ErrorIs(t, refused.Lines[0].Err, inventory.ErrDrawOnly)
		require.Equal(t, inventory.ErrDrawOnly.Code(), inventory.ErrorCode(refused.Lines[0].Err))
		require.Zero(t, b.requireBalanced(t, sku).Held)
		require.Zero(t, b.requireBalanced(t, "CART-OTHER").Held, "the cart is refused whole")

		for i := range 3 {
			_, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, 1)
			require.NoError(t, err)
		}
		b.closeDraw(t, sku)
		rep, err := b.engine.Draws().RunDraw(b.ctx, sku)
		require.NoError(t, err)
		require.Equal(t, 3, rep.Draw.Stock)
		require.Equal(t, 3, rep.Holds, "every winner holds its unit")
		b.requireDrawApplied(t, sku, inventory.DefaultWaitlistMax)
	})
}

// TestDrawGivesOutOnlyUnitsNotHeld: a draw product of 5 units of which 2 are
// held when the draw runs (a hold the ledger knows, restored into Redis by a
// rebuild) draws for 3, so every winner gets its hold and the verifier
// accepts the result.
func TestDrawGivesOutOnlyUnitsNotHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	const sku = "DRAW-HELD"
	b.drawProduct(t, sku, 5, time.Hour, time.Minute)
	p := b.engine.Keys().PartitionOf(sku)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		VALUES ($1, $2, 'earlier', 2, 'HELD', now() + interval '1 hour', now())`, fmt.Sprintf("r%02d.%s", p, "aaaaaaaaaaaaaaaaaaaaaaaaaa"), sku)
	require.NoError(t, err)
	b.wipe(t)
	require.Equal(t, 2, b.stock(t, sku).Held, "the rebuild restored the hold")
	for i := range 5 {
		_, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, 1)
		require.NoError(t, err)
	}
	b.closeDraw(t, sku)
	rep, err := b.engine.Draws().RunDraw(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, 3, rep.Draw.Stock, "the draw gives out what is not held")
	require.Equal(t, 3, rep.Holds)
	require.Zero(t, rep.Unheld)
	result, err := b.engine.Ledger().Draws().DrawResult(b.ctx, sku)
	require.NoError(t, err)
	for _, e := range result {
		if e.Status == db.EntryWon {
			r, err := b.engine.Reservation(b.ctx, inventory.Principal{ID: e.Principal}, e.Token)
			require.NoError(t, err)
			require.Equal(t, inventory.StatusHeld, r.Status)
		}
	}
	require.Equal(t, 5, b.requireBalanced(t, sku).Held, "the earlier hold and the winners'")
	var out strings.Builder
	require.NoError(t, drawverify.Verify(b.ctx, &out, b.engine.Ledger(), sku), out.String())
}

// TestDrawWinnerNotHeldWaitsFirst, on a single Redis and a cluster: when the
// units a draw counted are not all in Redis as it carries the result (made
// here by taking 2 of 5 away in Redis after the draw decided), the winners
// who do not fit are not skipped: each is recorded in the ledger's result
// with the policy's refusal, counted, and put in the waitlist ahead of every
// loser, so the first unit freed is theirs; and the verifier rejects the
// draw, naming them.
func TestDrawWinnerNotHeldWaitsFirst(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		reg := prometheus.NewRegistry()
		b := setup(t, backend, inventory.Config{Registerer: reg})
		const sku, stock, entrants = "DRAW-SHORT", 5, 8
		b.drawProduct(t, sku, stock, time.Hour, time.Minute)
		for i := range entrants {
			_, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, 1)
			require.NoError(t, err)
		}
		b.closeDraw(t, sku)
		rep, err := b.engine.Draws().RunDrawSteps(b.ctx, sku, func(st inventory.DrawStage, _ int) error {
			if st == inventory.DrawDecided {
				key := b.engine.Keys().SKU(sku)
				if err := b.rdb.HIncrBy(b.ctx, key, "avail", -2).Err(); err != nil {
					return err
				}
				return b.rdb.HIncrBy(b.ctx, key, "held", 2).Err()
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, stock, rep.Draw.Winners)
		require.Equal(t, 3, rep.Holds)
		require.Equal(t, 2, rep.Unheld, "two winners could not be held, and say so")
		require.EqualValues(t, 2, testutil.ToFloat64(collectorOf(t, reg, "dropline_draw_winners_unheld_total")))

		result, err := b.engine.Ledger().Draws().DrawResult(b.ctx, sku)
		require.NoError(t, err)
		var held, short, losers []db.DrawEntry
		for _, e := range result {
			switch {
			case e.Status == db.EntryLost:
				losers = append(losers, e)
			case b.rdb.Exists(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf(sku), e.Token)).Val() == 1:
				held = append(held, e)
			default:
				short = append(short, e)
			}
		}
		require.Len(t, held, 3)
		require.Len(t, short, 2)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM draw_results WHERE sku = $1 AND won AND unheld = 'OUT_OF_STOCK'`, sku))
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM reservations v JOIN draw_results r ON r.token = v.token
			WHERE r.sku = $1 AND v.status = 'HELD'`, sku), "the winners' holds are in the ledger once the draw is applied")
		queue, err := b.rdb.ZRange(b.ctx, b.engine.Keys().WaitQueue(sku), 0, -1).Result()
		require.NoError(t, err)
		var want []string
		for _, e := range append(short, losers...) {
			want = append(want, e.Principal)
		}
		require.Equal(t, want, queue, "the winners not held wait first, in draw order, then the losers")

		var out strings.Builder
		err = drawverify.Verify(b.ctx, &out, b.engine.Ledger(), sku)
		require.ErrorContains(t, err, "does NOT verify")
		require.Contains(t, out.String(), "its hold could not be made (OUT_OF_STOCK)")

		_, err = b.engine.Cancel(b.ctx, inventory.Principal{ID: held[0].Principal}, held[0].Token)
		require.NoError(t, err)
		w, err := b.engine.Waitlists().Waitlist(b.ctx, inventory.Principal{ID: short[0].Principal}, sku)
		require.NoError(t, err)
		require.Equal(t, inventory.WaitOffered, w.Status, "the first unit freed goes to the first winner not held")
		w, err = b.engine.Waitlists().Waitlist(b.ctx, inventory.Principal{ID: losers[0].Principal}, sku)
		require.NoError(t, err)
		require.Equal(t, inventory.WaitWaiting, w.Status)
	})
}
