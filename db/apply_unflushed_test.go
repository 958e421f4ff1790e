package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

// A copied batch applied by ApplyEventsUnflushed is committed with
// synchronous_commit off and reports where: the WAL's insert position right
// after its commit, the flush position then, and its session. Flushed
// finds the session alive and, once the WAL writer has flushed, past the
// commit; a session that ended is not found. Applied again (its rows exist,
// the batch goes as upserts), or with upserts besides, a batch is committed
// durably and reports the zero Commit.
func TestAnUnflushedBatchReportsItsCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	l := db.NewLedger(pool)
	db.SetCopyMinRows(l, 1)
	_, err := l.CreateProduct(ctx, db.Product{SKU: "UF-1", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 1000})
	require.NoError(t, err)
	at := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	var evs []db.Event
	for i := range 20 {
		tok := fmt.Sprintf("uf%03d", i)
		evs = append(evs, db.Event{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "UF-1",
			Principal: "p-" + tok, Quantity: 1, ExpiresAt: at.Add(time.Hour), CreatedAt: at, At: at})
	}
	var before int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&before))
	c, err := l.ApplyEventsUnflushed(ctx, &db.Fence{Name: "uf", Token: 1}, evs)
	require.NoError(t, err)
	require.True(t, c.Unflushed, "a batch of fresh holds is committed unflushed")
	require.Greater(t, c.LSN, uint64(before), "the commit's position is past what came before it")
	require.Positive(t, c.Session.PID)
	require.Positive(t, c.Session.Start)
	// The session is the backend of the connection the batch ran on, as
	// pg_stat_activity shows it. (The pool's health check may hold an idle
	// connection for a moment: look again until then.)
	own := map[db.Session]bool{}
	for i := 0; !own[c.Session] && i < 50; i++ {
		for _, conn := range pool.AcquireAllIdle(ctx) {
			var s db.Session
			require.NoError(t, conn.QueryRow(ctx, `SELECT pid, (extract(epoch FROM backend_start) * 1000000)::bigint
				FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&s.PID, &s.Start))
			own[s] = true
			conn.Release()
		}
		if !own[c.Session] {
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.True(t, own[c.Session], "the commit's session %v is its connection's backend, not one of %v", c.Session, own)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE sku = 'UF-1'`).Scan(&n))
	require.Equal(t, 20, n)

	gone := db.Session{PID: c.Session.PID, Start: c.Session.Start - 1}
	deadline := time.Now().Add(10 * time.Second)
	for {
		flushed, alive, err := l.Flushed(ctx, []db.Session{c.Session, gone})
		require.NoError(t, err)
		require.True(t, alive[c.Session], "the commit's session is alive")
		require.False(t, alive[gone], "a session of another start is not")
		if c.Durable(c.Session, flushed) {
			require.False(t, c.Durable(gone, flushed), "durable only by a position read while its session lives")
			break
		}
		require.True(t, time.Now().Before(deadline), "the WAL writer flushes the commit within seconds")
		time.Sleep(20 * time.Millisecond)
	}

	again, err := l.ApplyEventsUnflushed(ctx, &db.Fence{Name: "uf", Token: 1}, evs)
	require.NoError(t, err)
	require.Equal(t, db.Commit{}, again, "a batch sent again as upserts is committed durably")
	require.True(t, again.Durable(db.Session{}, 0))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE sku = 'UF-1'`).Scan(&n))
	require.Equal(t, 20, n, "applied again, nothing changes")
}
