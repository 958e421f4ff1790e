package db_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

// A batch with many fresh holds writes them by binary COPY. The ledger it
// leaves, row by row and movement by movement, is the one the same batch
// leaves written by inserts; applying it again (its copied rows exist now:
// the COPY fails and the batch goes again as upserts) changes nothing; and
// a fresh hold whose row a sale wrote first sends the copied batch the
// same way, keeping the sale.
func TestACopiedBatchWritesWhatItsInsertsWould(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	var batch []db.Event
	for i := range 80 {
		tok := fmt.Sprintf("c%03d", i)
		e := db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "COPY-" + fmt.Sprint(i%2), Principal: "p-" + tok,
			Quantity: 1 + i%3, ExpiresAt: at.Add(time.Duration(i) * time.Second), CreatedAt: at, At: at.Add(time.Duration(i) * time.Millisecond)}
		if i%4 != 0 { // some without hashes: NULL in the ledger
			e.IdempotencyHash, e.RequestHash = "h-"+tok, "q-"+tok
		}
		batch = append(batch, e)
	}
	// Holds that are not fresh ride in the same batch, as upserts.
	for i := range 6 {
		tok := fmt.Sprintf("o%02d", i)
		r := db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "COPY-0", Principal: "p-" + tok, Quantity: 1,
			ExpiresAt: at.Add(time.Hour), CreatedAt: at, At: at}
		end := r
		end.ID, end.Kind, end.At = []string{"commit", "cancel", "expire"}[i%3]+":"+tok, []string{"commit", "cancel", "expire"}[i%3], at.Add(time.Second)
		batch = append(batch, r, end)
	}

	ledger := func(copyMin int) *db.Ledger {
		l := db.NewLedger(testenv.Postgres(t))
		db.SetCopyMinRows(l, copyMin)
		for _, sku := range []string{"COPY-0", "COPY-1"} {
			_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 1000})
			require.NoError(t, err)
		}
		return l
	}
	copied, inserted := ledger(1), ledger(math.MaxInt)
	copiedPool, insertedPool := db.PoolOf(copied), db.PoolOf(inserted)
	conns := copiedPool.Stat().NewConnsCount()
	require.NoError(t, copied.ApplyEvents(ctx, nil, batch))
	require.Equal(t, conns, copiedPool.Stat().NewConnsCount(), "the connection went back to the pool, idle, not closed")
	require.NoError(t, inserted.ApplyEvents(ctx, nil, batch))
	require.Equal(t, int64(1), db.CopiedBatches(copied), "the batch was copied")
	require.Equal(t, int64(0), db.CopiedBatches(inserted), "the batch was inserted")
	state := wholeLedger(t, copiedPool)
	require.Equal(t, wholeLedger(t, insertedPool), state, "the ledger after the batch copied and inserted")
	require.Contains(t, state[0], "(c000,COPY-0,p-c000,1,HELD,,,") // NULL hashes
	var n int
	require.NoError(t, copiedPool.QueryRow(ctx, `SELECT count(*) FROM reservations`).Scan(&n))
	require.Equal(t, 86, n)

	require.NoError(t, copied.ApplyEvents(ctx, nil, batch), "the batch applied again")
	require.Equal(t, state, wholeLedger(t, copiedPool), "the ledger after the batch was applied again")
	require.Equal(t, int64(1), db.CopiedBatches(copied), "the second time, its rows existed: upserts")

	// A sale wrote one fresh hold's row first: the batch is written as
	// upserts, the sale stays, every other hold is written.
	third := ledger(1)
	_, err := third.Sales().RecordSale(ctx, db.Reservation{Token: "c007", SKU: "COPY-1", Principal: "p-c007", Quantity: 2,
		ExpiresAt: at.Add(7 * time.Second), CreatedAt: at})
	require.NoError(t, err)
	require.NoError(t, third.ApplyEvents(ctx, nil, batch))
	require.Equal(t, int64(0), db.CopiedBatches(third))
	r, err := third.Reservations().Reservation(ctx, "c007")
	require.NoError(t, err)
	require.Equal(t, db.StatusCommitted, r.Status)
	var moves int
	require.NoError(t, db.PoolOf(third).QueryRow(ctx, `SELECT count(*) FROM stock_movements WHERE kind = 'reserve'`).Scan(&moves))
	require.Equal(t, 86, moves, "one reserve movement per hold")

	// A fenced batch is refused whole, copied or not.
	fenced := ledger(1)
	require.NoError(t, fenced.ApplyEvents(ctx, &db.Fence{Name: "wb", Token: 5}, batch[:70]))
	err = fenced.ApplyEvents(ctx, &db.Fence{Name: "wb", Token: 4}, batch[70:])
	require.ErrorIs(t, err, db.ErrFenced)
	require.NoError(t, db.PoolOf(fenced).QueryRow(ctx, `SELECT count(*) FROM reservations`).Scan(&n))
	require.Equal(t, 70, n)
}

// turnConn counts a connection's round trips: the reads that follow a
// write (however many reads and writes each side takes).
type turnConn struct {
	net.Conn
	turns   *atomic.Int64
	written atomic.Bool
}

func (c *turnConn) Write(p []byte) (int, error) {
	c.written.Store(true)
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	if c.written.Swap(false) {
		c.turns.Add(1)
	}
	return c.Conn.Read(p)
}

// A batch of fresh holds only is one round trip to PostgreSQL: the begin,
// the fence, the products' locks (the SKUs written into the query, quotes
// and backslashes as they are), both COPYs and the commit go in one write.
// A batch that also has upserts sends them first: two. Refused batches
// (fenced, or a COPY's unique violation, sent again as upserts) leave the
// connection in the pool, idle, and the ledger unchanged.
func TestACopiedBatchOfFreshHoldsIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.NewDatabase(t))
	require.NoError(t, err)
	var turns atomic.Int64
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &turnConn{Conn: c, turns: &turns}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l := db.NewLedger(pool)
	db.SetCopyMinRows(l, 1)
	skus := []string{"A-1", "B.2", "c_3"}
	wb := `wb'\`
	for _, sku := range skus {
		_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 1000})
		require.NoError(t, err)
	}
	at := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	reserves := func(prefix string, n int) []db.Event {
		var evs []db.Event
		for i := range n {
			tok := fmt.Sprintf("%s%03d", prefix, i)
			evs = append(evs, db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: skus[i%len(skus)],
				Principal: "p-" + tok, Quantity: 1, ExpiresAt: at.Add(time.Hour), CreatedAt: at, At: at})
		}
		return evs
	}
	count := func() (res, moves int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM reservations), (SELECT count(*) FROM stock_movements WHERE kind = 'reserve')`).Scan(&res, &moves))
		return res, moves
	}
	conns := pool.Stat().NewConnsCount()
	apply := func(fence *db.Fence, evs []db.Event) (int64, error) {
		t.Helper()
		before := turns.Load()
		err := l.ApplyEvents(ctx, fence, evs)
		return turns.Load() - before, err
	}

	first := reserves("a", 30)
	n, err := apply(&db.Fence{Name: wb, Token: 5}, first)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "round trips of a batch of fresh holds")
	require.Equal(t, int64(1), db.CopiedBatches(l))
	res, moves := count()
	require.Equal(t, 30, res)
	require.Equal(t, 30, moves)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT token FROM worker_fences WHERE name = $1`, wb).Scan(&token))
	require.Equal(t, int64(5), token)

	// A SKU the catalogue does not have, whatever it is made of: refused.
	odd := reserves("o", 1)
	odd[0].SKU = `no'such\`
	_, err = apply(&db.Fence{Name: wb, Token: 5}, odd)
	require.ErrorIs(t, err, db.ErrRefused)
	require.ErrorIs(t, err, db.ErrNotFound, "the SKU looked up, not a syntax error")

	// Fenced off: refused, nothing written.
	_, err = apply(&db.Fence{Name: wb, Token: 4}, reserves("b", 30))
	require.ErrorIs(t, err, db.ErrFenced)
	res, _ = count()
	require.Equal(t, 30, res)

	// Applied again: the COPY fails on the existing rows, the batch goes
	// again as upserts and changes nothing.
	_, err = apply(&db.Fence{Name: wb, Token: 5}, first)
	require.NoError(t, err)
	res, moves = count()
	require.Equal(t, 30, res)
	require.Equal(t, 30, moves)
	require.Equal(t, int64(1), db.CopiedBatches(l))

	// Fresh holds with the commit of an earlier one: the upserts first
	// (the first time, pgx prepares their statements: one more).
	for i, prefix := range []string{"c", "d"} {
		tok := fmt.Sprintf("a%03d", i)
		mixed := append(reserves(prefix, 30), db.Event{ID: "commit:" + tok, Kind: "commit", Token: tok, SKU: skus[i],
			Principal: "p-" + tok, Quantity: 1, ExpiresAt: at.Add(time.Hour), CreatedAt: at, At: at.Add(time.Second)})
		n, err = apply(&db.Fence{Name: wb, Token: 5}, mixed)
		require.NoError(t, err)
		require.Equal(t, int64(2+1-i), n, "round trips of a batch with upserts")
	}
	require.Equal(t, int64(3), db.CopiedBatches(l))
	res, moves = count()
	require.Equal(t, 90, res)
	require.Equal(t, 90, moves)
	var sold int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE status = 'COMMITTED'`).Scan(&sold))
	require.Equal(t, 2, sold)

	// Committed unflushed, with the commit's report: one round trip too.
	before := turns.Load()
	c, err := l.ApplyEventsUnflushed(ctx, &db.Fence{Name: wb, Token: 5}, reserves("u", 30))
	require.NoError(t, err)
	require.True(t, c.Unflushed)
	require.Equal(t, int64(1), turns.Load()-before, "round trips of a batch of fresh holds committed unflushed")
	res, moves = count()
	require.Equal(t, 120, res)
	require.Equal(t, 120, moves)
	require.Equal(t, conns, pool.Stat().NewConnsCount(), "the connection stayed in the pool")
}
