package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// goAll runs fn(0..n-1) in n goroutines started together and returns their
// errors joined.
func goAll(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return errors.Join(errs...)
}

// stepper runs admission steps of r until stop is closed, from two
// goroutines at once, as two instances would during a lease handover.
func (b *bundle) stepper(t testing.TB, r queue.Ref, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				if _, err := b.queues.Step(b.ctx, r); err != nil {
					t.Errorf("step: %v", err)
					return
				}
			}
		})
	}
	return &wg
}

// requireAdmittedInOrder checks that the passes issued are exactly those
// of numbers 1..through: admission in ticket order, none skipped, none
// ahead.
func requireAdmittedInOrder(t testing.TB, st queueState) {
	t.Helper()
	admitted := map[int64]bool{}
	for who, raw := range st.Passes {
		parts := strings.Split(raw, "|")
		require.Len(t, parts, 4)
		n, err := strconv.ParseInt(parts[3], 10, 64)
		require.NoError(t, err)
		require.Equal(t, st.Numbers[who], n, "%s's pass is its number's", who)
		require.False(t, admitted[n], "number %d admitted twice", n)
		admitted[n] = true
		require.LessOrEqual(t, n, st.Through, "a pass past the admitted number")
	}
	for n := int64(1); n <= st.Through; n++ {
		require.True(t, admitted[n], "number %d skipped", n)
	}
}

// requireHoldsBoughtWithPasses checks, in Redis and in the ledger row by
// row, that every hold of the queued SKUs was bought with its principal's
// pass: one spent pass per hold, naming it, and no hold of a principal
// without one.
func (b *bundle) requireHoldsBoughtWithPasses(t testing.TB, r queue.Ref, st queueState, skus ...string) int {
	t.Helper()
	tickets := b.requireLedgerAgrees(t, r, st)
	spentFor := map[string]string{}
	for _, tk := range tickets {
		if tk.SpentAt != nil {
			spentFor[tk.Principal] = tk.SpentFor
		}
	}
	holds := 0
	for _, sku := range skus {
		rows, err := b.pool.Query(b.ctx, `SELECT token, principal FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
		require.NoError(t, err)
		for rows.Next() {
			var tok, who string
			require.NoError(t, rows.Scan(&tok, &who))
			require.Equal(t, tok, spentFor[who], "%s's hold %s was bought with its pass", who, tok)
			holds++
		}
		require.NoError(t, rows.Err())
		rows.Close()
	}
	require.Len(t, spentFor, holds, "one hold per spent pass")
	spent := 0
	for _, raw := range st.Passes {
		if strings.Split(raw, "|")[2] == "U" {
			spent++
		}
	}
	require.Equal(t, holds, spent, "Redis has as many spent passes as holds")
	return holds
}

// TestQueueRace: thousands of principals join a queued product at once,
// each twice; two steppers admit them while every person polls its ticket
// and buys with its pass (then tries the pass again), and bots reserve
// without a pass, with another's, or with a forged one. One ticket per
// principal, admission in ticket order, no hold without a valid pass, no
// unit oversold: in Redis and in the ledger, row by row.
func TestQueueRace(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		const people, units = 1500, 150
		r := b.queuedProduct(t, "Q-RACE", units, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 120_000})
		numbers := make([]int64, 2*people)
		joiners := people - people/4 // the bots do not join
		require.NoError(t, goAll(2*people, func(i int) error {
			if i%people%4 == 3 {
				return nil
			}
			tk, err := b.queues.Join(b.ctx, buyer(i%people).ID, r, queue.JoinInput{})
			numbers[i] = tk.Number
			return err
		}))
		for i := range people {
			require.Equal(t, numbers[i], numbers[i+people], "%s joined twice, one ticket", buyer(i).ID)
		}

		stop := make(chan struct{})
		steppers := b.stepper(t, r, stop)
		var held, botRefused, passReused atomic.Int64
		var firstPass atomic.Value
		ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
		defer cancel()
		err := goAll(people, func(i int) error {
			who := buyer(i)
			if i%4 == 3 { // a bot (it never joined): no pass, another's, a forged one
				who = inventory.Principal{ID: fmt.Sprintf("bot-%d", i)}
				for _, pass := range []string{"", "forged-pass", fmt.Sprint(firstPass.Load())} {
					_, err := b.engine.Reserve(ctx, who, inventory.ReserveRequest{SKU: r.ID, Quantity: 1, AdmissionPass: pass})
					switch {
					case errors.Is(err, inventory.ErrQueueRequired), errors.Is(err, inventory.ErrPassInvalid):
						botRefused.Add(1)
					case err == nil:
						return fmt.Errorf("bot %s held a unit with pass %q", who.ID, pass)
					default:
						return fmt.Errorf("bot %s: %w", who.ID, err)
					}
				}
				return nil
			}
			for ctx.Err() == nil {
				tk, _, err := b.queues.MyTicket(ctx, who.ID, r)
				if err != nil {
					return err
				}
				switch {
				case tk.Status == queue.TicketAdmitted:
					firstPass.CompareAndSwap(nil, tk.Pass)
					if _, err := b.engine.Reserve(ctx, who, inventory.ReserveRequest{SKU: r.ID, Quantity: 1, AdmissionPass: tk.Pass}); err != nil {
						return fmt.Errorf("%s with its pass: %w", who.ID, err)
					}
					held.Add(1)
					_, err := b.engine.Reserve(ctx, who, inventory.ReserveRequest{SKU: r.ID, Quantity: 1, AdmissionPass: tk.Pass})
					if !errors.Is(err, inventory.ErrPassInvalid) {
						return fmt.Errorf("%s reused its pass: %w", who.ID, err)
					}
					passReused.Add(1)
					return nil
				case tk.Status == queue.TicketWaiting && (tk.QueueStatus == queue.StatusPaused || tk.QueueStatus == queue.StatusSoldOut):
					return nil // every unit is held: nobody more is admitted
				}
				time.Sleep(20 * time.Millisecond)
			}
			return fmt.Errorf("%s: %w", who.ID, ctx.Err())
		})
		close(stop)
		steppers.Wait()
		require.NoError(t, err)

		require.EqualValues(t, units, held.Load(), "every unit bought, each with a pass")
		s, err := b.engine.Catalog().Stock(b.ctx, r.ID)
		require.NoError(t, err)
		require.Equal(t, units, s.Held)
		require.Zero(t, s.Available)
		b.drain(t)
		st := b.queueState(t, r)
		require.Len(t, st.Numbers, joiners)
		require.Equal(t, int64(joiners), st.Next, "numbers 1..n, dense")
		require.EqualValues(t, units, st.Through, "exactly as many admitted as units")
		requireAdmittedInOrder(t, st)
		require.Equal(t, units, b.requireHoldsBoughtWithPasses(t, r, st, r.ID))
		var ledgerHeld int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE sku = $1`, r.ID).Scan(&ledgerHeld))
		require.Equal(t, units, ledgerHeld, "no unit oversold in the ledger")
		t.Logf("%s: %d principals, %d joins (%d bots never joined), %d admitted and held, %d bot attempts refused, %d reused passes refused",
			backend, people, 2*joiners, people/4, held.Load(), botRefused.Load(), passReused.Load())
	})
}

// TestQueuePairs races the queue against the other rules a unit is held
// to, on a queued drop of two SKUs with a per-person limit of one: an
// admitted principal reserves one SKU, puts both in a cart and joins the
// other's waitlist, all at once, with its one pass; and a second queued
// drop races the first with the same principals, whose passes are each
// their own queue's. A draw cannot be queued.
func TestQueuePairs(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		const people, units = 400, 40
		opens := time.Now().Add(-time.Second)
		drops := []string{"QD-ONE", "QD-TWO"}
		skus := map[string][]string{}
		for _, d := range drops {
			_, err := b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: d, Name: "Drop " + d, MaxPerUser: 1,
				Queue: &inventory.QueueSettings{OpensAt: opens, AdmitPerMinute: 600_000}})
			require.NoError(t, err)
			for _, s := range []string{d + "-A", d + "-B"} {
				_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: s, Name: "Product " + s,
					Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: units / 2, Drop: d})
				require.NoError(t, err)
				skus[d] = append(skus[d], s)
			}
		}
		_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: "Q-DRAW", Name: "Drawn",
			Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: 1,
			Draw: &inventory.DrawInput{ClosesAt: time.Now().Add(time.Hour), WinnerHold: time.Minute}, Queue: &inventory.QueueSettings{OpensAt: opens, AdmitPerMinute: 60}})
		var invalid *inventory.InvalidInputError
		require.ErrorAs(t, err, &invalid, "a draw is no queue")
		require.Equal(t, "queue", invalid.Field)

		refs := []queue.Ref{{Kind: queue.OfDrop, ID: drops[0]}, {Kind: queue.OfDrop, ID: drops[1]}}
		require.NoError(t, goAll(2*people, func(i int) error {
			_, err := b.queues.Join(b.ctx, buyer(i%people).ID, refs[i/people], queue.JoinInput{})
			return err
		}))
		stop := make(chan struct{})
		var steppers []*sync.WaitGroup
		for _, r := range refs {
			steppers = append(steppers, b.stepper(t, r, stop))
		}
		ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
		defer cancel()
		var bought [2]atomic.Int64
		var wrongQueue atomic.Int64
		err = goAll(2*people, func(i int) error {
			who, q := buyer(i%people), i/people
			r, mine := refs[q], skus[drops[q]]
			for ctx.Err() == nil {
				tk, _, err := b.queues.MyTicket(ctx, who.ID, r)
				if err != nil {
					return err
				}
				if tk.Status == queue.TicketWaiting && (tk.QueueStatus == queue.StatusPaused || tk.QueueStatus == queue.StatusSoldOut) {
					return nil
				}
				if tk.Status != queue.TicketAdmitted {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				// The pass is this queue's only.
				other := skus[drops[1-q]][0]
				_, err = b.engine.Reserve(ctx, who, inventory.ReserveRequest{SKU: other, Quantity: 1, AdmissionPass: tk.Pass})
				if !errors.Is(err, inventory.ErrPassInvalid) && !errors.Is(err, inventory.ErrQueueRequired) && !errors.Is(err, inventory.ErrQuotaExceeded) && err != nil {
					return fmt.Errorf("%s's pass of %s on %s: %w", who.ID, r, other, err)
				} else if err == nil {
					return fmt.Errorf("%s's pass of %s bought %s", who.ID, r, other)
				}
				wrongQueue.Add(1)
				// One pass, three ways to spend it, at once: one wins.
				var wins atomic.Int64
				spend := goAll(3, func(j int) error {
					var err error
					switch j {
					case 0:
						_, err = b.engine.Reserve(ctx, who, inventory.ReserveRequest{SKU: mine[0], Quantity: 1, AdmissionPass: tk.Pass})
					case 1:
						_, err = b.engine.Carts().ReserveCart(ctx, who, inventory.CartRequest{AdmissionPass: tk.Pass,
							Lines: []inventory.CartLine{{SKU: mine[0], Quantity: 1}, {SKU: mine[1], Quantity: 1}}})
					case 2:
						_, err = b.engine.Waitlists().JoinWaitlist(ctx, who, inventory.JoinWaitlistRequest{SKU: mine[1], Quantity: 1, AdmissionPass: tk.Pass})
					}
					switch {
					case err == nil:
						wins.Add(1)
					case errors.Is(err, inventory.ErrPassInvalid), errors.Is(err, inventory.ErrQuotaExceeded),
						errors.Is(err, inventory.ErrOutOfStock), errors.Is(err, inventory.ErrQueueRequired):
					default:
						return fmt.Errorf("%s, way %d: %w", who.ID, j, err)
					}
					return nil
				})
				if spend != nil {
					return spend
				}
				if wins.Load() != 1 {
					return fmt.Errorf("%s's one pass bought %d things", who.ID, wins.Load())
				}
				bought[q].Add(1)
				return nil
			}
			return fmt.Errorf("%s: %w", who.ID, ctx.Err())
		})
		close(stop)
		for _, s := range steppers {
			s.Wait()
		}
		require.NoError(t, err)
		b.drain(t)
		for q, r := range refs {
			st := b.queueState(t, r)
			requireAdmittedInOrder(t, st)
			b.requireLedgerAgrees(t, r, st)
			tickets, err := b.engine.Ledger().Queues().QueueTickets(b.ctx, r.String())
			require.NoError(t, err)
			spent := map[string]bool{}
			for _, tk := range tickets {
				if tk.SpentAt != nil {
					spent[tk.Principal] = true
				}
			}
			require.EqualValues(t, bought[q].Load(), len(spent), "%s: one spending per buyer", r)
			// The drop's limit: at most one unit per person across its SKUs,
			// held or offered, in the ledger.
			rows, err := b.pool.Query(b.ctx, `SELECT principal, sum(quantity) FROM reservations
				WHERE sku = ANY($1) AND status = 'HELD' GROUP BY principal`, skus[drops[q]])
			require.NoError(t, err)
			holders := 0
			for rows.Next() {
				var who string
				var n int
				require.NoError(t, rows.Scan(&who, &n))
				require.Equal(t, 1, n, "%s holds %d units of %s", who, n, drops[q])
				require.True(t, spent[who], "%s holds a unit of %s without a spent pass", who, drops[q])
				holders++
			}
			require.NoError(t, rows.Err())
			rows.Close()
			var units2 int
			for _, sku := range skus[drops[q]] {
				s, err := b.engine.Catalog().Stock(b.ctx, sku)
				require.NoError(t, err)
				require.GreaterOrEqual(t, s.Available, 0)
				units2 += s.Held
			}
			require.LessOrEqual(t, units2, units, "no unit oversold")
			var waiting int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM waitlist_entries WHERE sku = ANY($1)`, skus[drops[q]]).Scan(&waiting))
			require.EqualValues(t, bought[q].Load(), holders+waiting-offeredOverlap(t, b, skus[drops[q]]),
				"%s: each pass bought a hold or a waitlist place", r)
			t.Logf("%s %s: %d bought (%d holders, %d waitlist entries)", backend, r, bought[q].Load(), holders, waiting)
		}
		require.Positive(t, wrongQueue.Load())
	})
}

// offeredOverlap counts waitlist entries that were offered a unit: the
// hold they were handed counts among the holders already.
func offeredOverlap(t testing.TB, b *bundle, skus []string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM waitlist_entries WHERE sku = ANY($1) AND status = 'OFFERED'`, skus).Scan(&n))
	return n
}
