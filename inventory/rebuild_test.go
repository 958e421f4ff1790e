package inventory_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// wipe deletes every key of this test's prefix at once: what a FLUSHALL
// does to the test's slice of a shared Redis.
func (b *bundle) wipe(t *testing.T) {
	t.Helper()
	require.NoError(t, b.wipeKeys())
}

// wipeScript deletes the keys of a prefix in one script, so that, like a
// FLUSHALL, the wipe is one step between two others: every key written
// before it is gone, none written after it is touched. A SCAN and a DEL per
// key is not that: while it runs, a SKU it already deleted is rebuilt and
// sold, and the scan goes on to delete holds of the rebuilt SKU while their
// stock hash stays, a loss no FLUSHALL, restart or failover makes (see
// TestWipeInTheMiddleOfASale). On a cluster it runs on each master, over
// that master's keys: a partition's keys are all on one.
var wipeScript = redis.NewScript(`#!lua flags=allow-cross-slot-keys
local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  redis.call('DEL', k)
  n = n + 1
end
return n`)

// wipeKeys is wipe for any goroutine: it returns what went wrong.
func (b *bundle) wipeKeys() error {
	del := func(ctx context.Context, c *redis.Client) error {
		return wipeScript.Eval(ctx, c, nil, b.prefix+"*").Err()
	}
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(b.ctx, del)
	case *redis.Client:
		return del(b.ctx, c)
	}
	return nil
}

func TestReadRepairAfterRedisLoss(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "REPAIR-1", 10, 4)
		alice, bob := buyer(1), buyer(2)
		sold, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 2, IdempotencyKey: "k1"})
		require.NoError(t, err)
		_, err = b.engine.Commit(b.ctx, alice, sold.Token)
		require.NoError(t, err)
		held, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 3})
		require.NoError(t, err)
		kinds := b.drainOutbox(t)
		require.Equal(t, 2, kinds["reserve"])
		// The write-behind has recorded bob's first hold, not this one.
		lost, err := b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 1})
		require.NoError(t, err)
		b.wipe(t)

		// Any read rebuilds: sold from the sales, bob's recorded hold, not the lost one.
		s := b.requireBalanced(t, "REPAIR-1")
		require.Equal(t, 2, s.Sold)
		require.Equal(t, 3, s.Held)
		require.Equal(t, 5, s.Available)

		// The committed sale replays, through Redis again.
		again, err := b.engine.Commit(b.ctx, alice, sold.Token)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		replay, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 2, IdempotencyKey: "k1"})
		require.NoError(t, err)
		require.Equal(t, sold.Token, replay.Token, "idempotency survives the loss")
		// Quotas were rebuilt: alice bought 2 of 4, bob holds 3 of 4.
		_, err = b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 3})
		require.ErrorIs(t, err, inventory.ErrQuotaExceeded)
		_, err = b.engine.Reserve(b.ctx, bob, inventory.ReserveRequest{SKU: "REPAIR-1", Quantity: 2})
		require.ErrorIs(t, err, inventory.ErrQuotaExceeded)

		// bob's recorded hold is still his to commit; the lost one is gone.
		c, err := b.engine.Commit(b.ctx, bob, held.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, c.Status)
		_, err = b.engine.Commit(b.ctx, bob, lost.Token)
		require.ErrorIs(t, err, inventory.ErrNotFound)
		s = b.requireBalanced(t, "REPAIR-1")
		require.Equal(t, 5, s.Sold)
	})
}

// TestWipeInTheMiddleOfASale wipes Redis once 20 of the 50 units are held,
// while the first 250 buyers are still reserving and committing; the other
// 250 come after the wipe. Counted on the goroutine's index alone, the wipe
// could land after the sale was over (it did, whenever the buyers' calls
// kept every pooled connection busy).
func TestWipeInTheMiddleOfASale(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "FLUSH-1", 50, 0)
		var commits, holds atomic.Int64
		var wiped atomic.Bool
		twenty, done := make(chan struct{}), make(chan struct{})
		raceCheck(t, 501, func(i int) error {
			if i == 500 {
				defer close(done)
				select {
				case <-twenty:
				case <-time.After(time.Minute):
					return errors.New("20 units were never held")
				}
				if err := b.wipeKeys(); err != nil {
					return err
				}
				wiped.Store(true)
				return nil
			}
			if i >= 250 {
				<-done
			}
			h, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "FLUSH-1", Quantity: 1})
			if errors.Is(err, inventory.ErrOutOfStock) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("buyer %d reserving: %w", i, err)
			}
			if holds.Add(1) == 20 {
				close(twenty)
			}
			_, err = b.engine.Commit(b.ctx, buyer(i), h.Token)
			if errors.Is(err, inventory.ErrNotFound) || errors.Is(err, inventory.ErrExpired) || errors.Is(err, inventory.ErrOutOfStock) {
				return nil // the hold was lost with Redis
			}
			if err != nil {
				return fmt.Errorf("buyer %d committing: %w", i, err)
			}
			commits.Add(1)
			return nil
		})
		require.True(t, wiped.Load())
		b.drainOutbox(t)
		s := b.requireBalanced(t, "FLUSH-1")
		require.EqualValues(t, commits.Load(), s.Sold, "every acknowledged commit is sold, once")
		require.LessOrEqual(t, s.Sold, 50)
	})
}

func TestRealFlushAllAndScriptFlush(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	pool := testenv.Postgres(t)
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, inventory.Config{}, client, pool, zerolog.Nop())
	require.NoError(t, err)
	b := &bundle{ctx: ctx, engine: e, rdb: client, pool: pool, prefix: "dl:"}
	b.product(t, "OWN-1", 300, 0)

	// SCRIPT FLUSH every few milliseconds while 1,000 buyers reserve: no request fails.
	type flushes struct {
		n   int
		err error
	}
	stop := make(chan struct{})
	flushed := make(chan flushes)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flushed <- flushes{n: n}
				return
			case <-time.After(3 * time.Millisecond):
				if err := client.ScriptFlush(ctx).Err(); err != nil {
					<-stop
					flushed <- flushes{n, err}
					return
				}
				n++
			}
		}
	}()
	var won atomic.Int64
	raceCheck(t, 1000, func(i int) error {
		_, err := e.Reserve(ctx, buyer(i), inventory.ReserveRequest{SKU: "OWN-1", Quantity: 1})
		if err == nil {
			won.Add(1)
			return nil
		}
		if !errors.Is(err, inventory.ErrOutOfStock) {
			return fmt.Errorf("buyer %d: %w", i, err)
		}
		return nil
	})
	close(stop)
	f := <-flushed
	require.NoError(t, f.err)
	require.Positive(t, f.n)
	require.EqualValues(t, 300, won.Load())

	// FLUSHALL, then a commit of a hold Redis no longer has but Postgres does.
	h, err := e.Reserve(ctx, buyer(5000), inventory.ReserveRequest{SKU: "OWN-1", Quantity: 1})
	require.ErrorIs(t, err, inventory.ErrOutOfStock, "sold out: %v", h)
	b.drainOutbox(t)
	require.NoError(t, client.FlushAll(ctx).Err())
	tokens := mustHoldsFromLedger(t, pool, "OWN-1")
	require.Len(t, tokens, 300)
	var committed int
	for _, tok := range tokens[:100] {
		var who string
		require.NoError(t, pool.QueryRow(ctx, `SELECT principal FROM reservations WHERE token = $1`, tok).Scan(&who))
		_, err := e.Commit(ctx, inventory.Principal{ID: who}, tok)
		require.NoError(t, err)
		committed++
	}
	require.NoError(t, client.FlushAll(ctx).Err())
	s := b.requireBalanced(t, "OWN-1")
	require.Equal(t, 100, s.Sold)
	require.Equal(t, 200, s.Held)
	require.Equal(t, 0, s.Available)
}

func mustHoldsFromLedger(t *testing.T, pool *pgxpool.Pool, sku string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT token FROM reservations WHERE sku = $1 AND status = 'HELD' ORDER BY token`, sku)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var tok string
		require.NoError(t, rows.Scan(&tok))
		out = append(out, tok)
	}
	return out
}

func TestCommitWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "PGDOWN-1", 5, 0)
		alice := buyer(1)
		h, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "PGDOWN-1", Quantity: 2})
		require.NoError(t, err)

		// A second engine on the same Redis whose Postgres cannot be reached.
		cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
		require.NoError(t, err)
		dead, err := pgxpool.NewWithConfig(b.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(dead.Close)
		down, err := inventory.NewEngine(b.ctx, inventory.Config{KeyPrefix: b.prefix}, b.rdb, dead, zerolog.Nop())
		require.NoError(t, err)

		_, err = down.Commit(b.ctx, alice, h.Token)
		require.ErrorIs(t, err, inventory.ErrUnavailable)
		got, err := b.engine.Reservation(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, got.Status, "the hold is back to HELD")
		require.Equal(t, h.ExpiresAt, got.ExpiresAt, "with its original expiry")
		require.Equal(t, 2, b.requireBalanced(t, "PGDOWN-1").Held)

		// Reserves go on without Postgres.
		_, err = down.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "PGDOWN-1", Quantity: 1})
		require.NoError(t, err)

		// Postgres back: the retry commits.
		c, err := b.engine.Commit(b.ctx, alice, h.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, c.Status)
		s := b.requireBalanced(t, "PGDOWN-1")
		require.Equal(t, 2, s.Sold)
		require.Equal(t, 1, s.Held)
	})
}

func TestReconcilerFinishesHalfDoneCommits(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "HALF-1", 5, 0)
		alice := buyer(1)
		sold, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "HALF-1", Quantity: 1})
		require.NoError(t, err)
		unsold, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "HALF-1", Quantity: 1})
		require.NoError(t, err)
		p := inventory.PartitionOf("HALF-1")
		// A crash after begin_commit: both holds COMMITTING; only one sale reached Postgres.
		for _, tok := range []string{sold.Token, unsold.Token} {
			require.NoError(t, b.rdb.HSet(b.ctx, b.engine.Keys().Hold(p, tok), "st", "COMMITTING", "cst", "1").Err())
			require.NoError(t, b.rdb.ZRem(b.ctx, b.engine.Keys().Expiry(p), tok).Err())
			require.NoError(t, b.rdb.ZAdd(b.ctx, b.engine.Keys().Committing(p), redis.Z{Score: 1, Member: tok}).Err())
		}
		_, err = b.pool.Exec(b.ctx, `WITH s AS (INSERT INTO sales (token, sku, principal, quantity) VALUES ($1, 'HALF-1', $2, 1))
			UPDATE products SET sold = sold + 1 WHERE sku = 'HALF-1'`, sold.Token, alice.ID)
		require.NoError(t, err)

		n, err := b.engine.Maintenance().ReconcileCommits(b.ctx, p, time.Second, 100)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		s := b.requireBalanced(t, "HALF-1")
		require.Equal(t, 1, s.Sold)
		require.Equal(t, 1, s.Held)
		r, err := b.engine.Reservation(b.ctx, alice, unsold.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, r.Status)
		require.Equal(t, unsold.ExpiresAt, r.ExpiresAt)
	})
}

// Keys lost one by one (as eviction would lose them) must not let a hold
// from the SKU's earlier life move units it is not counted in.
func TestHoldFromAnEarlierLifeMovesNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "ORPHAN-1", 3, 0)
		alice := buyer(1)
		orphan, err := b.engine.Reserve(b.ctx, alice, inventory.ReserveRequest{SKU: "ORPHAN-1", Quantity: 2, HoldFor: time.Second})
		require.NoError(t, err)
		// The stock hash is lost and the outbox with the hold's event; the hold
		// survives but Postgres never heard of it. (With its event still in the
		// outbox, the rebuild would apply it first and the hold would count.)
		b.loseOutbox(t)
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU("ORPHAN-1")).Err())
		s := b.requireBalanced(t, "ORPHAN-1")
		require.Equal(t, 3, s.Available, "rebuilt from Postgres, which has no hold")

		_, err = b.engine.Cancel(b.ctx, alice, orphan.Token)
		require.ErrorIs(t, err, inventory.ErrNotFound)
		_, err = b.engine.Commit(b.ctx, alice, orphan.Token)
		require.ErrorIs(t, err, inventory.ErrNotFound)
		_, err = b.engine.Reservation(b.ctx, alice, orphan.Token)
		require.ErrorIs(t, err, inventory.ErrNotFound)
		require.Eventually(t, func() bool { return time.Now().After(orphan.ExpiresAt) }, 3*time.Second, 10*time.Millisecond)
		expired, err := b.engine.Maintenance().ExpireDue(b.ctx, inventory.PartitionOf("ORPHAN-1"), 10)
		require.NoError(t, err)
		require.Empty(t, expired)
		n, err := b.rdb.ZCard(b.ctx, b.engine.Keys().Expiry(inventory.PartitionOf("ORPHAN-1"))).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the lost hold's token left the expiry index")
		s = b.requireBalanced(t, "ORPHAN-1")
		require.Equal(t, 3, s.Available, "the orphan released nothing")
	})
}
