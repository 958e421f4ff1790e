package graphql_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// An extension moves no stock, yet a reservationChanged subscriber hears of
// it at once: the script announces the SKU, which wakes the watcher. The
// periodic re-read is set far beyond the test, so only that wake-up can
// deliver the new expiry in time.
func TestReservationChangedHearsAnExtension(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ReservationRecheck = time.Hour
	})
	e.CreateProduct(t, map[string]any{"sku": "RC-EXT", "stock": 2})
	owner := e.Token(t, "owner", false)
	r := e.Reserve(t, owner, map[string]any{"sku": "RC-EXT", "quantity": 1, "holdSeconds": 60})
	require.Empty(t, r.UserErrors)
	const doc = `subscription($t: ID!) { reservationChanged(token: $t) { token status expiresAt extensions } }`
	type rc struct {
		ReservationChanged struct {
			Token, Status string
			ExpiresAt     time.Time
			Extensions    int
		}
	}
	decode := func(m wsclient.Message) rc {
		require.Empty(t, m.Errors)
		var out rc
		require.NoError(t, json.Unmarshal(m.Data, &out))
		return out
	}
	c := e.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": owner}})
	s := subscribe(t, c, doc, map[string]any{"t": r.Reservation.Token})
	m, ok := next(t, s, 5*time.Second)
	require.True(t, ok)
	require.Zero(t, decode(m).ReservationChanged.Extensions)

	x := e.Extend(t, owner, r.Reservation.Token, 900)
	require.Empty(t, x.UserErrors)
	start := time.Now()
	m, ok = next(t, s, 3*time.Second)
	require.True(t, ok)
	got := decode(m).ReservationChanged
	t.Logf("the extension reached the subscriber %s after its answer", time.Since(start))
	require.Equal(t, "HELD", got.Status)
	require.Equal(t, 1, got.Extensions)
	require.Equal(t, x.Reservation.ExpiresAt, got.ExpiresAt)
}
