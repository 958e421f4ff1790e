package db_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
)

// TestOverdueHeldPagesEverySKUInExpiryOrder lists the overdue holds of one
// token prefix page by page over several SKUs: every overdue HELD row of
// the prefix once, by expiry and token, whatever SKU it is of, and none of
// another prefix, not yet overdue or no longer HELD.
func TestOverdueHeldPagesEverySKUInExpiryOrder(t *testing.T) {
	t.Parallel()
	_, l := ledgerWithProduct(t, "OD-0", 1000)
	ctx := context.Background()
	for _, sku := range []string{"OD-1", "OD-2", "OD-3"} {
		_, err := l.CreateProduct(ctx, db.Product{SKU: sku, Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 1000})
		require.NoError(t, err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	before := now.Add(-time.Minute)
	var want []string
	var events []db.Event
	for i := range 60 {
		sku := fmt.Sprintf("OD-%d", i%4)
		prefix := "r05."
		if i%5 == 0 {
			prefix = "r06." // another partition's
		}
		tok := fmt.Sprintf("%s%03d", prefix, 59-i)
		// Some share an expiry, so the token decides their order.
		exp := before.Add(-time.Duration(i/3+1) * time.Second)
		if i%7 == 0 {
			exp = before.Add(time.Second) // not yet overdue
		}
		kind := "reserve"
		if i%11 == 0 {
			kind = "expire" // no longer HELD
		}
		events = append(events, db.Event{ID: kind + ":" + tok, Kind: kind, Token: tok, SKU: sku, Principal: "p", Quantity: 1,
			ExpiresAt: exp, CreatedAt: now.Add(-time.Hour), At: now})
		if prefix == "r05." && i%7 != 0 && i%11 != 0 {
			want = append(want, tok)
		}
	}
	require.NoError(t, l.ApplyEvents(ctx, nil, events))
	expOf := map[string]time.Time{}
	for _, e := range events {
		expOf[e.Token] = e.ExpiresAt
	}
	sort.Slice(want, func(i, j int) bool {
		a, b := expOf[want[i]], expOf[want[j]]
		if !a.Equal(b) {
			return a.Before(b)
		}
		return want[i] < want[j]
	})
	require.Greater(t, len(want), 20)

	var got []string
	var afterExp time.Time
	afterToken := ""
	for range 20 {
		page, err := l.Reservations().OverdueHeld(ctx, "r05.", before, afterExp, afterToken, 7)
		require.NoError(t, err)
		for _, r := range page {
			require.Equal(t, db.StatusHeld, r.Status)
			got = append(got, r.Token)
		}
		if len(page) < 7 {
			break
		}
		afterExp, afterToken = page[len(page)-1].ExpiresAt, page[len(page)-1].Token
	}
	require.Equal(t, want, got)
}
