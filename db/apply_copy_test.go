package db_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

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
