package db_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestConcurrentMigrateAppliesEachMigrationOnce(t *testing.T) {
	t.Parallel()
	// An empty database (not the migrated template): create it by hand.
	admin := testenv.Postgres(t) // any pool on the server, to create a database
	ctx := context.Background()
	name := "dropline_migrate_" + time.Now().Format("150405.000000")
	name = "m" + sanitize(name)
	_, err := admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL(name))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	n, err := db.Pending(ctx, pool)
	require.NoError(t, err)
	migrations, err := db.Migrations()
	require.NoError(t, err)
	require.Equal(t, len(migrations), n)

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = db.Migrate(ctx, pool) }()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	n, err = db.Pending(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, n)
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&applied))
	require.Equal(t, len(migrations), applied)
}

func sanitize(s string) string {
	out := []byte{}
	for _, c := range []byte(s) {
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '_' {
			out = append(out, c)
		}
	}
	return string(out)
}

// ledgerWithProduct is a ledger on the test's own database with one
// product of total units.
func ledgerWithProduct(t *testing.T, sku string, total int) (*pgxpool.Pool, *db.Ledger) {
	t.Helper()
	pool := testenv.Postgres(t)
	l := db.NewLedger(pool)
	_, err := l.CreateProduct(context.Background(), db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: total})
	require.NoError(t, err)
	return pool, l
}

func TestLedgerRefusesWhatMustNeverHappen(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "L-1", 2)
	ctx := context.Background()
	_, err := l.CreateProduct(ctx, db.Product{SKU: "L-1", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 2})
	require.ErrorIs(t, err, db.ErrExists)
	_, err = l.CreateProduct(ctx, db.Product{SKU: "bad sku", Name: "n", PriceAmount: 1, PriceCurrency: "EUR"})
	require.ErrorIs(t, err, db.ErrInvalid)

	r := func(tok string, qty int) db.Reservation {
		return db.Reservation{Token: tok, SKU: "L-1", Principal: "p", Quantity: qty, ExpiresAt: time.Now(), CreatedAt: time.Now()}
	}
	first, err := l.Sales().RecordSale(ctx, r("t1", 2))
	require.NoError(t, err)
	again, err := l.Sales().RecordSale(ctx, r("t1", 2))
	require.NoError(t, err)
	require.Equal(t, first.CommittedAt, again.CommittedAt, "a repeated sale returns the first")
	_, err = l.Sales().RecordSale(ctx, r("t2", 1))
	require.ErrorIs(t, err, db.ErrWouldOversell)
	p, err := l.Product(ctx, "L-1")
	require.NoError(t, err)
	require.Equal(t, 2, p.Sold)
	var sales int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM sales`).Scan(&sales))
	require.Equal(t, 1, sales, "the refused sale left nothing behind")

	_, err = pool.Exec(ctx, `UPDATE stock_movements SET quantity = 99`)
	require.ErrorContains(t, err, "append-only")
	_, err = pool.Exec(ctx, `DELETE FROM stock_movements`)
	require.ErrorContains(t, err, "append-only")
}

func TestApplyEventsIsIdempotentAndOnlyMovesForward(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "E-1", 10)
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Millisecond)
	ev := func(kind, tok string) db.Event {
		return db.Event{ID: kind + ":" + tok, Kind: kind, Token: tok, SKU: "E-1", Principal: "p", Quantity: 1,
			ExpiresAt: at.Add(time.Minute), CreatedAt: at, At: at}
	}
	batch := []db.Event{ev("reserve", "a"), ev("reserve", "b"), ev("cancel", "a"), ev("reserve", "c"), ev("expire", "c")}
	require.NoError(t, l.ApplyEvents(ctx, nil, batch))
	require.NoError(t, l.ApplyEvents(ctx, nil, batch))
	// A late reserve event never turns a finished reservation back to HELD.
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("reserve", "a")}))
	status := func(tok string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM reservations WHERE token = $1`, tok).Scan(&s))
		return s
	}
	require.Equal(t, "CANCELLED", status("a"))
	require.Equal(t, "HELD", status("b"))
	require.Equal(t, "EXPIRED", status("c"))
	var movements int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stock_movements WHERE kind <> 'create'`).Scan(&movements))
	require.Equal(t, 5, movements)

	// Fencing: a newer token wins, an older one is refused and writes nothing.
	require.NoError(t, l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p00", Token: 7}, []db.Event{ev("cancel", "b")}))
	err := l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p00", Token: 6}, []db.Event{ev("reserve", "z")})
	require.ErrorIs(t, err, db.ErrFenced)
	var z int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE token = 'z'`).Scan(&z))
	require.Zero(t, z)
}

// A hold is released at most once in the ledger, and a finished reservation
// is never sold: two lives of a SKU in Redis can each end the same hold after
// a rebuild, and the ledger keeps the first ending.
func TestLedgerReleasesOnceAndNeverSellsAFinishedReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, l := ledgerWithProduct(t, "ONCE-1", 2)
	now := time.Now()
	ev := func(kind, tok string) db.Event {
		return db.Event{ID: kind + ":" + tok, Kind: kind, Token: tok, SKU: "ONCE-1", Principal: "alice", Quantity: 1,
			ExpiresAt: now.Add(time.Minute), CreatedAt: now, At: now}
	}
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("reserve", "t1"), ev("cancel", "t1"), ev("expire", "t1")}))
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("expire", "t1")}))
	r, err := l.Reservations().Reservation(ctx, "t1")
	require.NoError(t, err)
	require.Equal(t, db.StatusCancelled, r.Status)
	_, err = l.Sales().RecordSale(ctx, db.Reservation{Token: "t1", SKU: "ONCE-1", Principal: "alice", Quantity: 1,
		ExpiresAt: now.Add(time.Minute), CreatedAt: now})
	require.ErrorIs(t, err, db.ErrEnded)
	var ended *db.EndedError
	require.ErrorAs(t, err, &ended)
	require.Equal(t, db.StatusCancelled, ended.Status)
	_, err = l.Sales().Sale(ctx, "t1")
	require.ErrorIs(t, err, db.ErrNotFound)
	p, err := l.Product(ctx, "ONCE-1")
	require.NoError(t, err)
	require.Zero(t, p.Sold)

	// A sold hold whose release arrives late records no release.
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("reserve", "t2")}))
	_, err = l.Sales().RecordSale(ctx, db.Reservation{Token: "t2", SKU: "ONCE-1", Principal: "alice", Quantity: 1,
		ExpiresAt: now.Add(time.Minute), CreatedAt: now, IdempotencyHash: "h2", RequestHash: "f2"})
	require.NoError(t, err)
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{ev("cancel", "t2")}))
	r, err = l.Reservations().Reservation(ctx, "t2")
	require.NoError(t, err)
	require.Equal(t, db.StatusCommitted, r.Status)
	require.Equal(t, "h2", r.IdempotencyHash, "the sale records the idempotency key")
	byKind := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT kind, count(*)::int FROM stock_movements WHERE sku = 'ONCE-1' GROUP BY kind`)
	require.NoError(t, err)
	for rows.Next() {
		var kind string
		var n int
		require.NoError(t, rows.Scan(&kind, &n))
		byKind[kind] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"create": 1, "reserve": 2, "cancel": 1, "commit": 1}, byKind)
}

// A batch is one transaction although its statements are sent in one round
// trip: when a statement late in the batch fails (here the waitlist's, on a
// SKU the catalogue does not have), the movements and reservations the
// earlier statements wrote are rolled back with it; and a fenced batch,
// waitlist events included, writes nothing at all.
func TestApplyEventsIsAllOrNothing(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "AON-1", 10)
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Millisecond)
	reserve := db.Event{ID: "reserve:r1", Kind: "reserve", Token: "r1", SKU: "AON-1", Principal: "p", Quantity: 1,
		ExpiresAt: at.Add(time.Minute), CreatedAt: at, At: at}
	join := func(sku string) db.Event {
		return db.Event{ID: "wjoin:" + sku + ":1", Kind: db.KindWaitJoin, SKU: sku, Principal: "p", Quantity: 1,
			Seq: 1, HoldMillis: 60_000, CreatedAt: at, At: at}
	}
	count := func() (movements, reservations, waits int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stock_movements WHERE kind <> 'create'),
			(SELECT count(*) FROM reservations),
			(SELECT count(*) FROM waitlist_entries) + (SELECT count(*) FROM waitlist_movements)`).Scan(&movements, &reservations, &waits))
		return movements, reservations, waits
	}

	err := l.ApplyEvents(ctx, nil, []db.Event{reserve, join("AON-MISSING")})
	require.ErrorIs(t, err, db.ErrRefused)
	m, r, w := count()
	require.Equal(t, [3]int{0, 0, 0}, [3]int{m, r, w}, "movements, reservations, waitlist rows after a refused batch")

	// A reservation's event of a SKU the catalogue does not have is refused
	// as a foreign key would refuse it, and the batch writes nothing.
	ghost := reserve
	ghost.ID, ghost.Token, ghost.SKU = "reserve:g1", "g1", "AON-GHOST"
	err = l.ApplyEvents(ctx, nil, []db.Event{reserve, ghost})
	require.ErrorIs(t, err, db.ErrRefused)
	require.ErrorIs(t, err, db.ErrNotFound)
	m, r, w = count()
	require.Equal(t, [3]int{0, 0, 0}, [3]int{m, r, w}, "movements, reservations, waitlist rows after a batch naming no product")

	require.NoError(t, l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p01", Token: 5}, []db.Event{join("AON-1")}))
	err = l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p01", Token: 4}, []db.Event{reserve, join("AON-1")})
	require.ErrorIs(t, err, db.ErrFenced)
	require.NotErrorIs(t, err, db.ErrRefused, "a fenced batch is not the values' fault")
	m, r, w = count()
	require.Equal(t, [3]int{0, 0, 2}, [3]int{m, r, w}, "movements, reservations, waitlist rows after a fenced batch")

	require.NoError(t, l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p01", Token: 5}, []db.Event{reserve, join("AON-1")}))
	m, r, w = count()
	require.Equal(t, [3]int{1, 1, 2}, [3]int{m, r, w}, "movements, reservations, waitlist rows after the batch")
}

// A database whose schema is behind this version (`dropline serve` starts,
// and its workers run, while migrations are pending) does not refuse a
// batch's values: the batch fails like an outage, so the write-behind
// retries it whole once the migration is applied, rather than split it and
// set its events aside as refused after RefuseLimit tries.
func TestApplyEventsOnASchemaBehindIsNotARefusal(t *testing.T) {
	t.Parallel()
	pool, l := ledgerWithProduct(t, "BEHIND-1", 10)
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Millisecond)
	reserve := db.Event{ID: "reserve:r1", Kind: "reserve", Token: "r1", SKU: "BEHIND-1", Principal: "p", Quantity: 1,
		ExpiresAt: at.Add(time.Minute), CreatedAt: at, At: at}
	// As before migration 0009.
	_, err := pool.Exec(ctx, `DROP FUNCTION worker_fence(text, bigint)`)
	require.NoError(t, err)

	err = l.ApplyEvents(ctx, &db.Fence{Name: "flusher:p01", Token: 1}, []db.Event{reserve})
	require.Error(t, err)
	require.ErrorIs(t, err, db.ErrSchemaBehind)
	require.NotErrorIs(t, err, db.ErrRefused, "a missing function is the schema's fault, not the values'")
	require.NotErrorIs(t, err, db.ErrFenced)
}
