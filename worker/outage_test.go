package worker

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// Postgres becomes unreachable in the middle of a sale and comes back.
// Reserves go on (Redis only), commits answer UNAVAILABLE, events wait in
// Redis, and afterwards Postgres and Redis agree on everything.
func TestPostgresOutageMidSale(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	dbURL, err := url.Parse(testenv.NewDatabase(t))
	require.NoError(t, err)
	px := testenv.NewProxy(t, dbURL.Host)
	dbURL.Host = px.Addr
	cfg, err := pgxpool.ParseConfig(dbURL.String())
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = time.Second
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := newBundle(t, env.Client, env.Prefix, pool, inventory.Config{CommitTimeout: time.Second})
	const sku = "OUTAGE-1"
	b.product(t, sku, 500)
	gcfg := fastConfig("outage")
	gcfg.Reconciler.OlderThan = 2 * time.Second
	g, reg := b.startGroup(t, gcfg)

	var tokens []string
	owner := map[string]inventory.Principal{}
	reserve := func(n int) []string {
		start := len(tokens)
		for i := range n {
			who := inventory.Principal{ID: itoa(start + i)}
			r, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
			require.NoError(t, err)
			tokens = append(tokens, r.Token)
			owner[r.Token] = who
		}
		return tokens[start:]
	}
	commit := func(toks []string) (errs []error) {
		for _, tok := range toks {
			_, err := b.engine.Commit(b.ctx, owner[tok], tok)
			errs = append(errs, err)
		}
		return errs
	}

	// Up: a normal sale.
	before := reserve(60)
	for _, err := range commit(before[:20]) {
		require.NoError(t, err)
	}

	// Down.
	px.Cut()
	during := reserve(60) // Redis only: must all succeed
	failed := 0
	for _, err := range commit(during[:15]) {
		require.Error(t, err)
		require.True(t, errors.Is(err, inventory.ErrUnavailable), "commit during the outage: %v", err)
		require.Equal(t, inventory.ErrUnavailable.Code(), inventory.ErrorCode(err))
		failed++
	}
	for _, tok := range during[40:50] {
		_, err := b.engine.Cancel(b.ctx, owner[tok], tok)
		require.NoError(t, err, "cancel is Redis only")
	}
	waitUntil(t, 10*time.Second, "the backlog and lag gauges show the events waiting in Redis", func() bool {
		return metric(t, reg, "dropline_writebehind_backlog") >= 60 && metric(t, reg, "dropline_writebehind_lag_seconds") >= 1
	}, g.Flusher.measured.C())
	t.Logf("during the outage: %d reserves ok, %d commits UNAVAILABLE, backlog %v, lag %.2fs",
		len(during), failed, metric(t, reg, "dropline_writebehind_backlog"), metric(t, reg, "dropline_writebehind_lag_seconds"))

	// Back.
	px.Restore()
	for _, err := range commit(during[:15]) {
		require.NoError(t, err, "the retried commit succeeds once Postgres is back")
	}
	after := reserve(20)
	for _, err := range commit(after[:5]) {
		require.NoError(t, err)
	}
	keys := b.engine.Keys()
	// Half-done commits end by the reconciler (or by their retry, which
	// returned before this wait); the outbox drains by the flusher.
	waitUntil(t, 20*time.Second, "the backlog drains and no commit is left half-done", func() bool {
		n, err := b.rdb.ZCard(b.ctx, keys.Committing(inventory.PartitionOf(sku))).Result()
		require.NoError(t, err)
		return n == 0 && b.drained(t)
	}, g.Flusher.caughtUp.C(), g.Reconciler.commitsSettled.C())
	b.requireLedgerMatchesRedis(t, sku, tokens)
	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, len(tokens), byKind["reserve"])
	require.Equal(t, 40, byKind["commit"])
	require.Equal(t, 10, byKind["cancel"])
	waitUntil(t, 5*time.Second, "the backlog gauge is back to zero", func() bool {
		return metric(t, reg, "dropline_writebehind_backlog") == 0
	}, g.Flusher.measured.C())
}
