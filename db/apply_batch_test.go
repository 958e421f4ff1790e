package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

// One batch folds each hold's events into its latest state: a hold reserved,
// extended and ended inside one batch, a hold ended twice, an event
// delivered twice. The ledger after the batch is the ledger after applying
// the same events one by one, in the same order (the rows, every movement),
// and applying the batch again changes neither.
func TestABatchAppliesLikeItsEventsOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ev := func(kind, tok string, qty, n int) db.Event {
		id := kind + ":" + tok
		if kind == "extend" {
			id = fmt.Sprintf("extend:%s:%d", tok, n)
		}
		e := db.Event{ID: id, Kind: kind, Token: tok, SKU: "FOLD-" + tok[len(tok)-1:], Principal: "p-" + tok, Quantity: qty,
			ExpiresAt: at.Add(time.Duration(10+n) * time.Minute), CreatedAt: at, At: at.Add(time.Duration(n) * time.Second), Extensions: 0}
		if kind == "extend" {
			e.Extensions = n
		}
		return e
	}
	// Each hold's story, in order; the batch interleaves them.
	stories := [][]string{
		{"reserve"},
		{"reserve", "commit"},
		{"reserve", "cancel"},
		{"reserve", "expire"},
		{"reserve", "extend", "extend", "commit"},
		{"reserve", "extend", "cancel"},
		{"reserve", "cancel", "expire"},  // ended twice (two lives of a SKU in Redis)
		{"reserve", "expire", "cancel"},  // the other way round
		{"reserve", "commit", "cancel"},  // a release after the sale
		{"reserve", "reserve", "cancel"}, // the reserve delivered twice
		{"extend", "reserve", "expire"},  // an extension read before its reserve
		{"cancel"},                       // an ending whose reserve was lost
	}
	var batch []db.Event
	for step := 0; ; step++ {
		more := false
		for i, story := range stories {
			if step >= len(story) {
				continue
			}
			more = true
			kind := story[step]
			n := step
			if kind == "reserve" {
				n = 0 // a redelivery is the same event
			}
			batch = append(batch, ev(kind, fmt.Sprintf("t%02d-%d", i, i%2), 1+i%3, n))
		}
		if !more {
			break
		}
	}

	ledger := func() (*db.Ledger, *pgxpool.Pool) {
		pool := testenv.Postgres(t)
		l := db.NewLedger(pool)
		for _, sku := range []string{"FOLD-0", "FOLD-1"} {
			_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 100})
			require.NoError(t, err)
		}
		return l, pool
	}
	whole, wholePool := ledger()
	single, singlePool := ledger()
	require.NoError(t, whole.ApplyEvents(ctx, nil, batch))
	for _, e := range batch {
		require.NoError(t, single.ApplyEvents(ctx, nil, []db.Event{e}), "event %s alone", e.ID)
	}
	state := wholeLedger(t, wholePool)
	require.Equal(t, wholeLedger(t, singlePool), state, "the ledger after the batch and after its events one by one")
	require.NoError(t, whole.ApplyEvents(ctx, nil, batch))
	require.Equal(t, state, wholeLedger(t, wholePool), "the ledger after the batch was applied again")

	// What the stories must have left, so that the comparison compares something.
	var held, committed, cancelled, expired, movements int
	require.NoError(t, wholePool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE status = 'HELD'), count(*) FILTER (WHERE status = 'COMMITTED'),
		count(*) FILTER (WHERE status = 'CANCELLED'), count(*) FILTER (WHERE status = 'EXPIRED'),
		(SELECT count(*) FROM stock_movements WHERE kind <> 'create')
		FROM reservations`).Scan(&held, &committed, &cancelled, &expired, &movements))
	require.Equal(t, []int{1, 3, 5, 3}, []int{held, committed, cancelled, expired}, "held, committed, cancelled, expired")
	// 12 stories: 11 reserves, 4 extensions, 3 commits and 8 releases, each ended hold released once.
	require.Equal(t, 11+4+3+8, movements)
}

// wholeLedger is every reservation and movement the write-behind writes, as
// text, in a stable order (without the time each was written at).
func wholeLedger(t *testing.T, pool *pgxpool.Pool) [2]string {
	t.Helper()
	var out [2]string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
		(SELECT string_agg(row(token, sku, principal, quantity, status, idempotency_hash, request_hash,
			expires_at, created_at, committed_at, ended_at, extensions)::text, E'\n' ORDER BY token) FROM reservations),
		(SELECT string_agg(row(event_id, sku, kind, token, principal, quantity, occurred_at)::text, E'\n' ORDER BY event_id)
			FROM stock_movements WHERE kind <> 'create')`).Scan(&out[0], &out[1]))
	return out
}

// A batch writes a hold whose only event in it is its reserve as a plain
// insert. When the ledger has the row already (a sale or a synchronous
// cancel wrote it before the reserve event arrived, or the batch was
// applied before), the batch is written again as upserts: the sold and the
// cancelled holds stay as they are and get the reserve's data they lacked,
// the new holds of the same batch are written, and each event is one
// movement.
func TestAReserveWhoseRowExistsIsWrittenAsAnUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, l := ledgerWithProduct(t, "FRESH-1", 10)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reserve := func(tok string) db.Event {
		return db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "FRESH-1", Principal: "p-" + tok, Quantity: 1,
			ExpiresAt: at.Add(time.Minute), CreatedAt: at, At: at, IdempotencyHash: "h-" + tok, RequestHash: "q-" + tok}
	}
	_, err := l.Sales().RecordSale(ctx, db.Reservation{Token: "sold", SKU: "FRESH-1", Principal: "p-sold", Quantity: 1,
		ExpiresAt: at.Add(time.Minute), CreatedAt: at})
	require.NoError(t, err)
	cancel := reserve("gone")
	cancel.ID, cancel.Kind = "cancel:gone", "cancel"
	require.NoError(t, l.ApplyEvents(ctx, nil, []db.Event{cancel}))

	batch := []db.Event{reserve("new-1"), reserve("sold"), reserve("gone"), reserve("new-2")}
	require.NoError(t, l.ApplyEvents(ctx, nil, batch))
	require.NoError(t, l.ApplyEvents(ctx, nil, batch), "the batch applied again")

	want := map[string][3]string{
		"new-1": {db.StatusHeld, "h-new-1", "q-new-1"},
		"new-2": {db.StatusHeld, "h-new-2", "q-new-2"},
		"sold":  {db.StatusCommitted, "h-sold", "q-sold"},
		"gone":  {db.StatusCancelled, "h-gone", "q-gone"},
	}
	for tok, w := range want {
		r, err := l.Reservations().Reservation(ctx, tok)
		require.NoError(t, err)
		require.Equal(t, w, [3]string{r.Status, r.IdempotencyHash, r.RequestHash}, "status and hashes of %s", tok)
	}
	rows, err := pool.Query(ctx, `SELECT event_id, count(*)::int FROM stock_movements WHERE kind <> 'create' GROUP BY event_id`)
	require.NoError(t, err)
	moves := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		moves[id] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"reserve:new-1": 1, "reserve:new-2": 1, "reserve:sold": 1, "reserve:gone": 1,
		"commit:sold": 1, "cancel:gone": 1}, moves)
}
