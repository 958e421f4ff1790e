package inventory_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// engineWithPool is a second engine on the test's Redis prefix whose Postgres
// pool is built from cfg: another server instance, as a client's retry or
// double click would reach.
func (b *bundle) engineWithPool(t *testing.T, pc *pgxpool.Config, cfg inventory.Config) *inventory.Engine {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(b.ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg.KeyPrefix = b.prefix
	e, err := inventory.NewEngine(b.ctx, cfg, b.rdb, pool, zerolog.Nop())
	require.NoError(t, err)
	return e
}

// gatedEngine's first Postgres connection waits until open is called: its
// commit is a sale write in flight. It signals entered when the write is
// under way. The gate opens by itself when the test ends.
func (b *bundle) gatedEngine(t *testing.T) (e *inventory.Engine, entered <-chan struct{}, open func()) {
	in, g := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(g) }) }
	pc := b.pool.Config().Copy()
	first := true
	pc.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if first {
			first = false
			in <- struct{}{}
			<-g
		}
		return true, nil
	}
	e = b.engineWithPool(t, pc, inventory.Config{})
	t.Cleanup(open) // runs before the pool closes: cleanups run last-in first-out
	return e, in, open
}

// deadEngine cannot reach Postgres at all.
func (b *bundle) deadEngine(t *testing.T) *inventory.Engine {
	pc, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	return b.engineWithPool(t, pc, inventory.Config{})
}

func (b *bundle) rawStatus(t *testing.T, sku, token string) string {
	t.Helper()
	st, err := b.rdb.HGet(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf(sku), token), "st").Result()
	require.NoError(t, err)
	return st
}

// A second commit attempt that fails (here: its instance cannot reach
// Postgres) must not put the hold back to HELD while the first attempt's sale
// write is in flight: else a cancel or the sweeper would release units that
// are being sold.
func TestFailedCommitAttemptCannotUndoAnother(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ATTEMPT-1", 1, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ATTEMPT-1", Quantity: 1})
		require.NoError(t, err)

		first, entered, open := b.gatedEngine(t)
		done := make(chan error, 1)
		go func() { _, err := first.Commit(b.ctx, alice, h.Token); done <- err }()
		<-entered

		_, err = b.deadEngine(t).Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrUnavailable)
		require.Equal(t, "COMMITTING", b.rawStatus(t, "ATTEMPT-1", h.Token), "the failed joiner restored nothing")
		_, err = b.engine.Cancel(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrUnavailable, "a cancel waits for the commit in flight")
		_, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "ATTEMPT-1", Quantity: 1})
		require.ErrorIs(t, err, inventory.ErrOutOfStock)

		open()
		require.NoError(t, <-done)
		s := b.requireBalanced(t, "ATTEMPT-1")
		require.Equal(t, 1, s.Sold)
		kinds := b.drainOutbox(t)
		require.Equal(t, 1, kinds["commit"])
		require.Zero(t, kinds["cancel"]+kinds["expire"], "never both sold and released")
	})
}

// A commit left COMMITTING (its outcome unknown) and retried later: the
// retry refreshes the attempt, so the reconciler leaves it alone while the
// retry's write is in flight, and the sweeper cannot release it.
func TestReconcilerLeavesARetriedCommitAlone(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ATTEMPT-2", 1, 0)
		alice := buyer(1)
		p := inventory.PartitionOf("ATTEMPT-2")
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ATTEMPT-2", Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		// A crash mid-commit long ago: COMMITTING, out of the expiry index.
		require.NoError(t, b.rdb.HSet(b.ctx, b.engine.Keys().Hold(p, h.Token), "st", "COMMITTING", "cst", "1").Err())
		require.NoError(t, b.rdb.ZRem(b.ctx, b.engine.Keys().Expiry(p), h.Token).Err())
		require.NoError(t, b.rdb.ZAdd(b.ctx, b.engine.Keys().Committing(p), redis.Z{Score: 1, Member: h.Token}).Err())
		require.Eventually(t, func() bool { return time.Now().After(h.ExpiresAt.Add(10 * time.Millisecond)) }, 3*time.Second, 10*time.Millisecond)

		retry, entered, open := b.gatedEngine(t)
		done := make(chan error, 1)
		go func() { _, err := retry.Commit(b.ctx, alice, h.Token); done <- err }()
		<-entered

		n, err := b.engine.Maintenance().ReconcileCommits(b.ctx, p, time.Second, 100)
		require.NoError(t, err)
		require.Zero(t, n, "the retry is recent: nothing to reconcile")
		expired, err := b.engine.Maintenance().ExpireDue(b.ctx, p, 100)
		require.NoError(t, err)
		require.Empty(t, expired)

		open()
		require.NoError(t, <-done)
		s := b.requireBalanced(t, "ATTEMPT-2")
		require.Equal(t, 1, s.Sold)
		kinds := b.drainOutbox(t)
		require.Zero(t, kinds["expire"]+kinds["cancel"])
	})
}

// A commit whose instance cannot reach Postgres wrote nothing: the hold is
// back to HELD at once (not left for the reconciler), so the buyer can cancel
// it or retry, and it expires on time.
func TestUnreachablePostgresRestoresTheHold(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ATTEMPT-3", 2, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ATTEMPT-3", Quantity: 1})
		require.NoError(t, err)
		_, err = b.deadEngine(t).Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrUnavailable)
		require.Equal(t, "HELD", b.rawStatus(t, "ATTEMPT-3", h.Token))
		c, err := b.engine.Cancel(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCancelled, c.Status)
		require.Equal(t, 2, b.requireBalanced(t, "ATTEMPT-3").Available)
	})
}

// After Redis loses everything, an idempotency key still replays the
// reservation it made, even a cancelled one: Postgres remembers it.
func TestIdempotencyReplaysFinishedHoldsAfterRedisLoss(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ATTEMPT-4", 5, 0)
		alice := buyer(1)
		req := inventory.ReserveRequest{SKU: "ATTEMPT-4", Quantity: 1, IdempotencyKey: "k1"}
		first, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		_, err = b.engine.Cancel(b.ctx, alice, first.Token)
		require.NoError(t, err)
		b.drainOutbox(t)
		b.wipe(t)

		again, err := b.engine.Reserve(b.ctx, alice, req)
		require.NoError(t, err)
		require.Equal(t, first.Token, again.Token)
		require.Equal(t, inventory.StatusCancelled, again.Status)
		require.True(t, again.Replayed)
		require.Equal(t, 5, b.requireBalanced(t, "ATTEMPT-4").Available)
	})
}

// The first claim of a key marks every partition's claims, not only its
// own: a partition whose first claim comes after the ledger has taken keyed
// reserves must not be marked for checks then, since none of its claims
// was lost. Its marker was worked out at its own first claim before, from
// the ledger's latest use of any key, and every new key there cost a lookup
// in the ledger and a second claim for a day. After a loss, the first
// claim marks every partition for checks, and keys of other partitions
// still replay what they made.
func TestFirstClaimMarksEveryPartition(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		keys := inventory.NewKeys(b.prefix)
		b.product(t, "MARKS-1", 100, 0)
		alice := buyer(1)
		// Keys whose claims fall in at least four partitions.
		var idemKeys []string
		parts := map[string]bool{}
		for i := 0; len(parts) < 4; i++ {
			k := "mark-" + strconv.Itoa(i)
			idemKeys = append(idemKeys, k)
			parts[keys.IdempotencyClaim(core.IdempotencyHash(alice.ID, k))] = true
		}
		marks := func() []string {
			t.Helper()
			out := make([]string, script.Partitions)
			for p := range out {
				v, err := b.rdb.Get(b.ctx, keys.IdempotencyClaimsIn(p)).Result()
				if errors.Is(err, redis.Nil) {
					v = "missing"
				} else {
					require.NoError(t, err)
				}
				out[p] = v
			}
			return out
		}
		none := make([]string, script.Partitions)
		for p := range none {
			none[p] = "0"
		}

		first, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MARKS-1", Quantity: 1, IdempotencyKey: idemKeys[0]})
		require.NoError(t, err)
		require.Equal(t, none, marks(), "an empty ledger: no partition's claims are checked")
		b.drainOutbox(t)
		tokens := map[string]string{idemKeys[0]: first.Token}
		for _, k := range idemKeys[1:] {
			r, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MARKS-1", Quantity: 1, IdempotencyKey: k})
			require.NoError(t, err)
			require.False(t, r.Replayed)
			tokens[k] = r.Token
		}
		require.Equal(t, none, marks(), "claims after the ledger took a keyed reserve are still not checked")

		// After a loss, every partition is marked until a TTL after the
		// ledger's latest use, and every key replays its hold.
		b.drainOutbox(t)
		b.wipe(t)
		for _, k := range idemKeys {
			r, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "MARKS-1", Quantity: 1, IdempotencyKey: k})
			require.NoError(t, err)
			require.True(t, r.Replayed, k)
			require.Equal(t, tokens[k], r.Token, k)
		}
		now := time.Now().UnixMilli()
		for p, v := range marks() {
			ms, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, "partition %d: %s", p, v)
			require.Greater(t, ms, now, "partition %d", p)
		}
	})
}
