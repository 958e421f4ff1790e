package inventory_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/lua"
)

// gatedAt is another instance's engine whose acquires of a Postgres
// connection number gates (1 the first) each wait until their gate opens,
// after signalling that they were reached. Every gate opens by itself when
// the test ends.
func (b *bundle) gatedAt(t *testing.T, gates ...int) (e *inventory.Engine, reached map[int]chan struct{}, open func(int)) {
	reached, gate := map[int]chan struct{}{}, map[int]chan struct{}{}
	for _, n := range gates {
		reached[n], gate[n] = make(chan struct{}, 1), make(chan struct{})
	}
	var mu sync.Mutex
	opened := map[int]bool{}
	open = func(n int) {
		mu.Lock()
		defer mu.Unlock()
		if !opened[n] {
			opened[n] = true
			close(gate[n])
		}
	}
	var acquires atomic.Int64
	pc := b.pool.Config().Copy()
	pc.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		n := int(acquires.Add(1))
		if g, ok := gate[n]; ok {
			reached[n] <- struct{}{}
			<-g
		}
		return true, nil
	}
	e = b.engineWithPool(t, pc, inventory.Config{})
	t.Cleanup(func() {
		for _, n := range gates {
			open(n)
		}
	})
	return e, reached, open
}

// beforePublish runs fn once, right before the next publish_sku.lua is sent
// to Redis: between a rebuild's last read of its snapshot and its publish.
type beforePublish struct {
	sha  string
	once *sync.Once
	fn   func()
}

func (beforePublish) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforePublish) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			h.once.Do(h.fn)
		}
		return next(ctx, cmd)
	}
}

func (beforePublish) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// onceBeforePublish makes b's client run fn before the next publish.
func (b *bundle) onceBeforePublish(fn func()) {
	sha := redis.NewScript(lua.MustSource(lua.PublishSKU)).Hash()
	b.rdb.AddHook(beforePublish{sha: sha, once: new(sync.Once), fn: fn})
}

// endSnapshot ends the backend of the one transaction open in the test's
// database, a rebuild's snapshot, as a lost connection would: its product
// lock is gone. The wait makes sure it is.
func (b *bundle) endSnapshot(t *testing.T) {
	var pid int32
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&pid))
	_, err := b.pool.Exec(b.ctx, `SELECT pg_terminate_backend($1, 5000)`, pid)
	require.NoError(t, err)
}

// A rebuild whose snapshot loses its connection, and so the product's lock,
// after its last read and before its publish publishes all the same (only
// its commit fails after). A sale of a hold it restores as HELD can land in
// the ledger in between, and the sale's finish_commit.lua, finding the SKU
// missing, waits for a rebuild: another instance's finds the SKU published
// and has nothing to do. The sale is then recorded in Redis all the same,
// the hold COMMITTED. Before, the commit answered COMMITTED and left the
// hold HELD in Redis: Redis counted the unit as held (and as available once
// the hold expired) while the ledger had it sold.
func TestSaleLandingBeforeThePublishOfASnapshotThatLostItsLock(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LOST-LOCK-SALE-1"
		b.product(t, sku, 1, 0)
		h, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
		require.NoError(t, err)
		b.drainOutbox(t)

		// Acquire 1 is the sale's write, 2 the rebuild its finish waits for.
		other, reached, open := b.gatedAt(t, 1, 2)
		done := make(chan error, 1)
		var sold inventory.Reservation
		go func() {
			var err error
			sold, err = other.Commit(b.ctx, buyer(1), h.Token)
			done <- err
		}()
		<-reached[1]
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())
		b.onceBeforePublish(func() {
			b.endSnapshot(t)
			open(1)      // the sale is written, its lock gone
			<-reached[2] // its finish found the SKU missing
		})
		require.Error(t, b.engine.Rebuild(b.ctx, sku), "the snapshot's commit fails after the publish")
		open(2)
		require.NoError(t, <-done)
		require.Equal(t, inventory.StatusCommitted, sold.Status)

		require.Equal(t, "COMMITTED", b.rawStatus(t, sku, h.Token))
		s := b.requireBalanced(t, sku)
		require.Equal(t, 1, s.Sold)
		require.Zero(t, s.Held)
	})
}

// The same for a restock: written while the snapshot has lost its lock, its
// apply finds the SKU missing, and the rebuild it then waits for (another
// instance's) finds the SKU published from the older version. The restock
// is applied to what was published. Before, it was taken as included and
// marked as in Redis, which kept the old total until the product's next
// write.
func TestRestockLandingBeforeThePublishOfASnapshotThatLostItsLock(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		const sku = "LOST-LOCK-RESTOCK-1"
		b.product(t, sku, 1, 0)
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().SKU(sku)).Err())

		// Acquire 1 is the restock's write, 2 the rebuild its apply waits for.
		other, reached, open := b.gatedAt(t, 2)
		done := make(chan error, 1)
		b.onceBeforePublish(func() {
			b.endSnapshot(t)
			go func() {
				_, err := other.Catalog().Restock(b.ctx, admin, sku, 1, "restock-1")
				done <- err
			}()
			<-reached[2] // written; its apply found the SKU missing
		})
		require.Error(t, b.engine.Rebuild(b.ctx, sku), "the snapshot's commit fails after the publish")
		open(2)
		require.NoError(t, <-done)

		s := b.requireBalanced(t, sku)
		require.Equal(t, 2, s.Total)
		require.Equal(t, 2, s.Available)
	})
}
