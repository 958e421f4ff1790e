package inventory_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// TestDrawEntriesRace: 3,000 entrants at once over two open draws and a
// closed one, every tenth entering twice at once and every seventh first
// (who does not enter twice) asking over the per-principal limit. Entries are recorded together, many
// in one transaction, and each answer is checked against the ledger row by
// row: one row per principal and draw, the answer its row (id, quantity,
// time), a replay the same row, a refusal no row.
func TestDrawEntriesRace(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	skus := []string{"DRAW-RACE-A", "DRAW-RACE-B"}
	for _, sku := range append(skus, "DRAW-RACE-SHUT") {
		_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
			SKU: sku, Name: "Draw " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: 100, MaxPerUser: 2,
			Draw: &inventory.DrawInput{ClosesAt: time.Now().Add(time.Hour), WinnerHold: time.Minute},
		})
		require.NoError(t, err)
	}
	b.closeDraw(t, "DRAW-RACE-SHUT")

	const entrants = 3000
	type answer struct {
		sku, who string
		entry    inventory.DrawEntry
		err      error
		second   bool
	}
	answers := make(chan answer, 3*entrants)
	var wg sync.WaitGroup
	start := make(chan struct{})
	enter := func(i int, sku string, qty int, second bool) {
		e, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, qty)
		answers <- answer{sku: sku, who: buyer(i).ID, entry: e, err: err, second: second}
	}
	for i := range entrants {
		sku := skus[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			switch {
			case i%7 == 0 && i%10 != 0:
				// Over the limit first: refused, then entered.
				e, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), sku, 3)
				var q *inventory.QuotaExceededError
				if err == nil || !errors.As(err, &q) || q.Limit != 2 {
					answers <- answer{sku: sku, who: buyer(i).ID, entry: e, err: fmt.Errorf("over the limit: %w (%+v)", err, e)}
					return
				}
				enter(i, sku, 1+i%2, false)
			case i%13 == 0:
				_, err := b.engine.Draws().EnterDraw(b.ctx, buyer(i), "DRAW-RACE-SHUT", 1)
				var closed *inventory.SaleNotActiveError
				if !errors.As(err, &closed) {
					answers <- answer{sku: sku, who: buyer(i).ID, err: fmt.Errorf("a closed draw took an entry: %w", err)}
					return
				}
				enter(i, sku, 1+i%2, false)
			default:
				enter(i, sku, 1+i%2, false)
			}
		}()
		if i%10 == 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				enter(i, sku, 1+i%2, true)
			}()
		}
	}
	close(start)
	wg.Wait()
	close(answers)

	type row struct {
		id       int64
		qty      int
		entered  time.Time
		batchTxn string
	}
	rows := map[string]row{}
	r, err := b.pool.Query(b.ctx, `SELECT sku, principal, id, quantity, entered_at, xmin::text FROM draw_entries`)
	require.NoError(t, err)
	for r.Next() {
		var sku, who string
		var w row
		require.NoError(t, r.Scan(&sku, &who, &w.id, &w.qty, &w.entered, &w.batchTxn))
		_, dup := rows[sku+"/"+who]
		require.False(t, dup, "%s entered %s twice", who, sku)
		rows[sku+"/"+who] = w
	}
	require.NoError(t, r.Err())
	require.Len(t, rows, entrants, "one row per entrant, none in the closed draw")

	byWho := map[string][]answer{}
	for a := range answers {
		require.NoError(t, a.err, "%s in %s", a.who, a.sku)
		byWho[a.sku+"/"+a.who] = append(byWho[a.sku+"/"+a.who], a)
	}
	require.Len(t, byWho, entrants)
	replays := 0
	for k, list := range byWho {
		w, ok := rows[k]
		require.True(t, ok, "%s answered without a row", k)
		fresh := 0
		for _, a := range list {
			require.Equal(t, w.id, a.entry.ID, "%s: the answer is its row", k)
			require.Equal(t, w.qty, a.entry.Quantity, k)
			require.True(t, w.entered.Equal(a.entry.EnteredAt), "%s: entered at %s, answered %s", k, w.entered, a.entry.EnteredAt)
			require.Equal(t, inventory.EntryEntered, a.entry.Status, k)
			if a.entry.Replayed {
				replays++
			} else {
				fresh++
			}
		}
		require.Equal(t, 1, fresh, "%s: exactly one answer made the entry", k)
	}
	require.Equal(t, entrants/10, replays, "every second entry replays the first")

	txns := map[string]int{}
	for _, w := range rows {
		txns[w.batchTxn]++
	}
	require.Less(t, len(txns), entrants/2, "entries are recorded many to a transaction: %d transactions for %d entries", len(txns), entrants)
	t.Logf("%d entries in %d transactions", entrants, len(txns))
}
