package db_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

// TestASaleWaitingForTheWriteBehindDoesNotHoldTheProduct: a sale whose
// reservation row another transaction is inserting (the write-behind's
// batch) waits for it without holding the product's row, so another sale
// of the same SKU goes through meanwhile; once the batch commits, the
// waiting sale completes too.
func TestASaleWaitingForTheWriteBehindDoesNotHoldTheProduct(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "HOT-1", 10)
	ctx := context.Background()
	batch := insertingReservation(t, pool, saleOf("HOT-1", "a"))
	waiting := recordLater(l, saleOf("HOT-1", "a"))
	waitForLockWaits(t, pool, 1, "the sale of a waits for the batch")

	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := l.Sales().RecordSale(bctx, saleOf("HOT-1", "b"))
	require.NoError(t, err, "the sale of b is not held behind the wait of a")

	require.NoError(t, batch.Commit(ctx))
	require.NoError(t, <-waiting)
	p, err := l.Product(ctx, "HOT-1")
	require.NoError(t, err)
	require.Equal(t, 2, p.Sold)
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM reservations WHERE token = 'a'`).Scan(&status))
	require.Equal(t, db.StatusCommitted, status)
}

// TestSalesOverAPoolOfTheirOwnDoNotWaitForTheLedgersConnections: with
// WithSalePool, a sale is written while every connection of the ledger's
// own pool is taken (by the write-behind's batches, the reads), and it is
// in the ledger like any other.
func TestSalesOverAPoolOfTheirOwnDoNotWaitForTheLedgersConnections(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	sized := func(n int32) *pgxpool.Pool {
		cfg := pool.Config()
		cfg.MaxConns = n
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	shared, own := sized(1), sized(db.SaleConns)
	l := db.NewLedger(shared).WithSalePool(own)
	_, err := l.CreateProduct(ctx, db.Product{SKU: "OWN-1", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 10})
	require.NoError(t, err)

	busy, err := shared.Acquire(ctx)
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sale, err := l.Sales().RecordSale(sctx, saleOf("OWN-1", "a"))
	require.NoError(t, err, "the sale does not wait for the shared pool's only connection")
	require.Equal(t, "a", sale.Token)
	busy.Release()

	p, err := l.Product(ctx, "OWN-1")
	require.NoError(t, err)
	require.Equal(t, 1, p.Sold)
	got, err := l.Sales().Sale(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "OWN-1", got.SKU)
}

// TestConcurrentSalesAreEachAnsweredForThemselves: a thousand and more sales
// at once, of three SKUs, through the batches: sales that fit, repeats of
// the same tokens (at once and afterwards), reservations the ledger has as
// cancelled or expired, and, on one SKU, more demand than stock. Each call
// hears its own answer, and the ledger has each sale exactly once, row by
// row, with sold counts that match and nothing oversold.
func TestConcurrentSalesAreEachAnsweredForThemselves(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "GC-A", 1000)
	ctx := context.Background()
	for sku, total := range map[string]int{"GC-B": 1000, "GC-SCARCE": 150} {
		_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: total})
		require.NoError(t, err)
	}
	type sale struct {
		r     db.Reservation
		ended string // the ledger's status of the reservation, "" when it may be sold
	}
	var sales []sale
	at := time.Now().Truncate(time.Microsecond)
	add := func(sku string, n int) {
		for i := range n {
			tok := fmt.Sprintf("%s-%04d", sku, i)
			s := sale{r: db.Reservation{Token: tok, SKU: sku, Principal: "p-" + tok, Quantity: 1 + i%2,
				ExpiresAt: at.Add(time.Hour), CreatedAt: at, IdempotencyHash: "i-" + tok, RequestHash: "r-" + tok}}
			switch i % 25 {
			case 7:
				s.ended = db.StatusCancelled
			case 13:
				s.ended = db.StatusExpired
			}
			sales = append(sales, s)
		}
	}
	add("GC-A", 500)
	add("GC-B", 400)
	add("GC-SCARCE", 300) // 450 units asked of 150
	for _, s := range sales {
		if s.ended != "" {
			insertReservation(t, pool, s.r, s.ended)
		}
	}
	batches0, sent0, _ := l.SaleBatches()

	// Every sale twice at once (the second call of a token is a repeat,
	// whichever comes first), all calls released together.
	const callsPerSale = 2
	type answer struct {
		sale db.Sale
		err  error
	}
	answers := make([][callsPerSale]answer, len(sales))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range sales {
		for k := range callsPerSale {
			wg.Go(func() {
				<-start
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				s, err := l.Sales().RecordSale(cctx, sales[i].r)
				answers[i][k] = answer{s, err}
			})
		}
	}
	close(start)
	wg.Wait()

	sold := map[string]int{}
	soldTokens := map[string]db.Sale{}
	for i, s := range sales {
		a, b := answers[i][0], answers[i][1]
		switch {
		case s.ended != "":
			for _, x := range []answer{a, b} {
				var ended *db.EndedError
				require.ErrorAs(t, x.err, &ended, "%s is %s in the ledger", s.r.Token, s.ended)
				require.Equal(t, s.ended, ended.Status, s.r.Token)
			}
		case a.err == nil || b.err == nil:
			require.NoError(t, a.err, "%s: one call sold it, the other replays it", s.r.Token)
			require.NoError(t, b.err, s.r.Token)
			require.Equal(t, a.sale, b.sale, "both calls of %s hear the one sale", s.r.Token)
			require.Equal(t, db.Sale{Token: s.r.Token, SKU: s.r.SKU, Principal: s.r.Principal, Quantity: s.r.Quantity,
				CommittedAt: a.sale.CommittedAt}, a.sale)
			sold[s.r.SKU] += s.r.Quantity
			soldTokens[s.r.Token] = a.sale
		default:
			require.Equal(t, "GC-SCARCE", s.r.SKU, "%s refused: %v", s.r.Token, a.err)
			require.ErrorIs(t, a.err, db.ErrWouldOversell, s.r.Token)
			require.ErrorIs(t, b.err, db.ErrWouldOversell, s.r.Token)
		}
	}
	asked := map[string]int{}
	for _, s := range sales {
		if s.ended == "" {
			asked[s.r.SKU] += s.r.Quantity
		}
	}
	require.Equal(t, 690, asked["GC-A"])
	require.Equal(t, asked["GC-A"], sold["GC-A"], "every sale of GC-A fits and is sold")
	require.Equal(t, asked["GC-B"], sold["GC-B"], "every sale of GC-B fits and is sold")
	require.LessOrEqual(t, sold["GC-SCARCE"], 150)
	require.GreaterOrEqual(t, sold["GC-SCARCE"], 149, "the scarce SKU is sold out to the last unit a sale can take")

	// Row by row: the ledger has exactly the sales the callers heard of.
	rows, err := pool.Query(ctx, `SELECT s.token, s.sku, s.principal, s.quantity, s.committed_at, r.status, r.committed_at,
			coalesce(r.idempotency_hash, ''), coalesce(r.request_hash, ''),
			(SELECT count(*) FROM stock_movements m WHERE m.token = s.token AND m.kind = 'commit')
		FROM sales s LEFT JOIN reservations r USING (token)`)
	require.NoError(t, err)
	inLedger := 0
	for rows.Next() {
		var (
			got                  db.Sale
			status, idem, req    string
			reservationCommitted *time.Time
			movements            int
		)
		require.NoError(t, rows.Scan(&got.Token, &got.SKU, &got.Principal, &got.Quantity, &got.CommittedAt, &status,
			&reservationCommitted, &idem, &req, &movements))
		want, ok := soldTokens[got.Token]
		require.True(t, ok, "the ledger has a sale of %s no caller heard of", got.Token)
		require.True(t, want.CommittedAt.Equal(got.CommittedAt), got.Token)
		want.CommittedAt = got.CommittedAt
		require.Equal(t, want, got)
		require.Equal(t, db.StatusCommitted, status, got.Token)
		require.NotNil(t, reservationCommitted, got.Token)
		require.True(t, got.CommittedAt.Equal(*reservationCommitted), got.Token)
		require.Equal(t, "i-"+got.Token, idem)
		require.Equal(t, "r-"+got.Token, req)
		require.Equal(t, 1, movements, "one movement for the sale of %s", got.Token)
		inLedger++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(soldTokens), inLedger, "every sale a caller heard of is in the ledger, once")
	for _, sku := range []string{"GC-A", "GC-B", "GC-SCARCE"} {
		p, err := l.Product(ctx, sku)
		require.NoError(t, err)
		require.Equal(t, sold[sku], p.Sold, "sold count of %s", sku)
		require.LessOrEqual(t, p.Sold, p.Total)
	}
	var refusedWritten int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE status <> 'COMMITTED'
		AND (committed_at IS NOT NULL OR token IN (SELECT token FROM sales))`).Scan(&refusedWritten))
	require.Zero(t, refusedWritten, "a refused sale writes nothing")

	batches, sent, _ := l.SaleBatches()
	require.Equal(t, int64(len(sales)*callsPerSale), sent-sent0, "every call went through the batches")
	require.Less(t, batches-batches0, sent-sent0, "concurrent sales share batches")

	// A repeat afterwards, alone in its batch, replays the first sale.
	for tok, want := range soldTokens {
		for _, s := range sales {
			if s.r.Token == tok {
				again, err := l.Sales().RecordSale(ctx, s.r)
				require.NoError(t, err)
				require.Equal(t, want, again)
			}
		}
		break
	}
}

// TestAStuckSaleDoesNotHoldTheOthers: while one batch waits for the
// write-behind (its reservation row is being inserted), the sales that
// arrive meanwhile are written by the other batches, and the stuck one
// completes when the insert does.
func TestAStuckSaleDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "HOT-2", 100)
	ctx := context.Background()
	r := func(tok string) db.Reservation { return saleOf("HOT-2", tok) }
	batch := insertingReservation(t, pool, r("stuck"))
	waiting := recordLater(l, r("stuck"))
	waitForLockWaits(t, pool, 1, "the sale of stuck waits for the insert")

	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, errs[i] = l.Sales().RecordSale(cctx, r(fmt.Sprintf("free-%02d", i)))
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "the sales that came later are not held behind the stuck one")
	}
	require.NoError(t, batch.Commit(ctx))
	require.NoError(t, <-waiting)
	p, err := l.Product(ctx, "HOT-2")
	require.NoError(t, err)
	require.Equal(t, 51, p.Sold)

	// A sale whose sale row another transaction is writing (it waits for
	// it after the batch has written others) is written alone, and its
	// batch goes on without it.
	_, _, alone0 := l.SaleBatches()
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `INSERT INTO sales (token, sku, principal, quantity) VALUES ('busy', 'HOT-2', 'p-busy', 1)`)
	require.NoError(t, err)
	waiting = recordLater(l, r("busy"))
	require.Eventually(t, func() bool {
		_, _, alone := l.SaleBatches()
		return alone > alone0
	}, 10*time.Second, 5*time.Millisecond, "the busy sale is sent alone")
	_, err = l.Sales().RecordSale(ctx, r("free-after"))
	require.NoError(t, err)
	require.NoError(t, other.Rollback(ctx))
	require.NoError(t, <-waiting)
	p, err = l.Product(ctx, "HOT-2")
	require.NoError(t, err)
	require.Equal(t, 53, p.Sold)
}

// TestASaleWhoseCallerLeftBeforeItsBatchIsNotWritten: a sale still waiting
// for its batch when its caller gives up is not sent, and says so (it is
// safe to retry); one already sent may be written, and then it is whole.
func TestASaleWhoseCallerLeftBeforeItsBatchIsNotWritten(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "LEFT-1", 100)
	ctx := context.Background()
	r := func(tok string) db.Reservation { return saleOf("LEFT-1", tok) }
	// Two batches waiting for the product's row, which another transaction
	// holds, fill the batches in flight.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM products WHERE sku = 'LEFT-1' FOR NO KEY UPDATE`)
	require.NoError(t, err)
	waiting := make(chan error, 2)
	for i, tok := range []string{"s1", "s2"} {
		go func() {
			_, err := l.Sales().RecordSale(ctx, r(tok))
			waiting <- err
		}()
		require.Eventually(t, func() bool {
			b, _, _ := l.SaleBatches()
			return b >= int64(i+1)
		}, 10*time.Second, 5*time.Millisecond)
	}
	waitForLockWaits(t, pool, 2, "both batches wait")

	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = l.Sales().RecordSale(lctx, r("left"))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, pgconn.SafeToRetry(err), "a sale that never left is safe to retry: %v", err)

	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-waiting)
	require.NoError(t, <-waiting)
	// The next batches drop the sale whose caller left.
	_, err = l.Sales().RecordSale(ctx, r("after"))
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM sales WHERE token = 'left'`).Scan(&n))
	require.Zero(t, n, "the sale whose caller left was not written")
	p, err := l.Product(ctx, "LEFT-1")
	require.NoError(t, err)
	require.Equal(t, 3, p.Sold)
}

// saleOf is a reservation of one unit of sku, held for an hour, to sell.
func saleOf(sku, tok string) db.Reservation {
	return db.Reservation{Token: tok, SKU: sku, Principal: "p-" + tok, Quantity: 1,
		ExpiresAt: time.Now().Add(time.Hour), CreatedAt: time.Now()}
}

// insertReservation writes r with status into the reservations, as the
// write-behind does, through q (the pool, or a transaction left open).
func insertReservation(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, r db.Reservation, status string) {
	t.Helper()
	_, err := q.Exec(context.Background(), `INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, r.Token, r.SKU, r.Principal, r.Quantity, status, r.ExpiresAt, r.CreatedAt)
	require.NoError(t, err)
}

// insertingReservation opens a transaction that inserts r as held and
// keeps it open (the write-behind's batch on its way): a sale of r waits
// for it. The test commits it or it is rolled back.
func insertingReservation(t *testing.T, pool *pgxpool.Pool, r db.Reservation) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	insertReservation(t, tx, r, db.StatusHeld)
	return tx
}

// recordLater sells r in the background; its error comes on the channel.
func recordLater(l *db.Ledger, r db.Reservation) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := l.Sales().RecordSale(context.Background(), r)
		done <- err
	}()
	return done
}

// waitForLockWaits waits until n statements of the test's database wait
// for a lock.
func waitForLockWaits(t *testing.T, pool *pgxpool.Pool, n int, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got))
		return got == n
	}, 10*time.Second, 5*time.Millisecond, what)
}
