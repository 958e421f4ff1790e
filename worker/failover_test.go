package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// TestPromotedReplicaMissingWrites runs the workers on a primary with a
// replica under three sentinels. The replica is stalled (SIGSTOP) and cut
// off while a
// sale is committed and another hold is made, so it never gets those
// writes; the primary is then killed and the sentinels promote the replica.
// The promoted Redis has the SKU, with the committed hold still HELD and
// its unit not sold: left alone, the sweeper would release a unit Postgres
// has sold. The rebuilder sees the primary's replication id change and
// reloads the SKU from the ledger: the sale is there, sold in Redis too,
// and Redis and the ledger agree.
func TestPromotedReplicaMissingWrites(t *testing.T) {
	set := testenv.StartReplicated(t, time.Second)
	rdb := set.Client(t)
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	const sku, total = "PROMOTE-1", 10
	b.product(t, sku, total)
	g, reg := b.startGroup(t, fastConfig("promoted"))
	k := newKeys(b.engine.Keys())
	g.Rebuilder.checked.Wait(t, 5*time.Second)
	n, err := rdb.Exists(b.ctx, k.primary(0)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the rebuilder's first check recorded the primary")

	// Two holds that reach the replica (and the ledger, through the outbox).
	early := b.reserveMany(t, sku, 2, time.Minute)
	b.waitDrained(t, 10*time.Second, "the outbox is in the ledger", g.Flusher)
	require.NoError(t, rdb.Do(b.ctx, "WAIT", 1, 2000).Err())

	// Stall the replica and cut its link: what the primary writes from now
	// on never reaches it (bytes already in its socket buffer would).
	set.Replica.Pause()
	direct := redis.NewClient(&redis.Options{Addr: set.Primary.Addr})
	require.NoError(t, direct.ClientKillByFilter(b.ctx, "TYPE", "replica").Err())
	require.NoError(t, direct.Close())
	buyer := inventory.Principal{ID: "u0"}
	sale, err := b.engine.Commit(b.ctx, buyer, early[0])
	require.NoError(t, err)
	require.Equal(t, inventory.StatusCommitted, sale.Status)
	lost, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "late"}, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err)
	set.Primary.Stop()
	set.Replica.Resume()
	t.Logf("primary killed; the sale of %s and the hold %s exist only on it", early[0], lost.Token)

	// The sentinels promote the replica; the rebuilder notices and reloads.
	start := time.Now()
	g.Rebuilder.reloaded.Wait(t, 45*time.Second)
	t.Logf("recovered %s after the primary died", time.Since(start).Round(time.Millisecond))
	require.Equal(t, 1.0, metric(t, reg, "dropline_redis_failovers_total"), "the rebuilder saw the promotion")
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, 1, s.Sold, "the promoted Redis has the sale")

	r, err := b.engine.Reservation(b.ctx, buyer, early[0])
	require.NoError(t, err)
	require.Equal(t, inventory.StatusCommitted, r.Status, "the sale is a sale in Redis too")
	// The hold made on the dead primary alone survives only if the
	// write-behind took its event to the ledger before the primary died
	// (then it is adopted back); either way Redis and the ledger agree.
	b.waitDrained(t, 10*time.Second, "the outbox is in the ledger", g.Flusher)
	var sold, held int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold, (SELECT count(*) FROM reservations WHERE sku = $1 AND status = 'HELD') FROM products WHERE sku = $1`, sku).Scan(&sold, &held))
	require.Equal(t, 1, sold)
	require.Contains(t, []int{1, 2}, held)
	require.Equal(t, inventory.Stock{SKU: sku, Total: total, Sold: 1, Held: held, Available: total - 1 - held}, withoutTimes(b.stock(t, sku)))
	t.Logf("holds in the ledger and in Redis after the failover: %d (the hold made on the dead primary alone was %s)", held, map[bool]string{true: "adopted back", false: "lost"}[held == 2])
}

func withoutTimes(s inventory.Stock) inventory.Stock {
	return inventory.Stock{SKU: s.SKU, Total: s.Total, Sold: s.Sold, Held: s.Held, Available: s.Available}
}

// TestPromotionReloadSurvivesItsClaimerDying is the promotion of a replica
// that missed a sale, where the instance that noticed the new primary and
// claimed the reload dies before reloading anything (in the production
// topology the instance killed after the primary is sometimes the one that
// noticed). Another instance started afterwards must still reload every SKU
// from the ledger: the new primary's id is recorded only once the reload is
// done, and the dead instance's claim expires.
func TestPromotionReloadSurvivesItsClaimerDying(t *testing.T) {
	set := testenv.StartReplicated(t, time.Second)
	rdb := set.Client(t)
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	const sku, total = "PROMOTE-2", 10
	b.product(t, sku, total)
	claimed, release := make(chan struct{}), make(chan struct{})
	cfgX := fastConfig("x")
	cfgX.LeaseTTL = time.Second // its reload claim lasts 3 TTLs: y waits 3 s for it, not 6
	x, _ := b.startGroupWith(t, cfgX, func(g *Group) {
		g.Rebuilder.hooks.claimedReload = func() {
			close(claimed)
			<-release // the test kills x meanwhile
		}
	})
	k := newKeys(b.engine.Keys())
	x.Rebuilder.checked.Wait(t, 5*time.Second)
	oldID, err := rdb.Get(b.ctx, k.primary(0)).Result()
	require.NoError(t, err, "the rebuilder's first check recorded the primary")

	early := b.reserveMany(t, sku, 2, time.Minute)
	b.waitDrained(t, 10*time.Second, "the outbox is in the ledger", x.Flusher)
	require.NoError(t, rdb.Do(b.ctx, "WAIT", 1, 2000).Err())
	set.Replica.Pause()
	direct := redis.NewClient(&redis.Options{Addr: set.Primary.Addr})
	require.NoError(t, direct.ClientKillByFilter(b.ctx, "TYPE", "replica").Err())
	require.NoError(t, direct.Close())
	buyer := inventory.Principal{ID: "u0"}
	sale, err := b.engine.Commit(b.ctx, buyer, early[0])
	require.NoError(t, err)
	require.Equal(t, inventory.StatusCommitted, sale.Status)
	set.Primary.Stop()
	set.Replica.Resume()

	select {
	case <-claimed:
	case <-time.After(30 * time.Second):
		t.Fatal("x never saw the promotion")
	}
	recorded, err := rdb.Get(b.ctx, k.primary(0)).Result()
	require.NoError(t, err)
	require.Equal(t, oldID, recorded, "the new primary is not recorded before its reload is done")
	x.crash(errCrashed)
	close(release)
	stop(t, x.Group)
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	require.Zero(t, s.Sold, "the promoted Redis missed the sale, and x reloaded nothing")

	start := time.Now()
	y, reg := b.startGroup(t, fastConfig("y"))
	newID := y.Rebuilder.reloaded.Wait(t, 30*time.Second)
	t.Logf("y reloaded %s after x died holding the claim", time.Since(start).Round(time.Millisecond))
	s, err = b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	require.Equal(t, 1, s.Sold, "y reloaded the SKU that x claimed and left")
	require.Equal(t, 1.0, metric(t, reg, "dropline_redis_failovers_total"))
	r, err := b.engine.Reservation(b.ctx, buyer, early[0])
	require.NoError(t, err)
	require.Equal(t, inventory.StatusCommitted, r.Status, "the sale is a sale in Redis too")
	recorded, err = rdb.Get(b.ctx, k.primary(0)).Result()
	require.NoError(t, err)
	require.NotEqual(t, oldID, recorded, "the reload is recorded as done")
	require.Equal(t, newID, recorded, "for the new primary")
}

// TestReloadKeepsHoldsTheWriteBehindHadNotApplied reloads a SKU as after a
// promotion (inventory.Engine.RebuildStale) while every hold of it is still
// only in Redis and its outbox: the write-behind has not run. The holds are
// acknowledged and the promoted Redis kept them, so the reload must keep
// them too: the SKU stays sold out to an outsider, and each holder can
// commit once the write-behind runs. A reload from the ledger alone would
// hand their units to the next buyers and close the holds when their
// events arrived.
func TestReloadKeepsHoldsTheWriteBehindHadNotApplied(t *testing.T) {
	b := setup(t)
	const sku, total = "RELOAD-1", 4
	b.product(t, sku, total)
	reloadKeepsUnappliedHolds(t, b, sku, total)
}

// A SKU of a drop lives in the drop's partition, and so do its outbox
// events: the reload applies that outbox, not the one of the SKU's own name.
func TestReloadKeepsHoldsTheWriteBehindHadNotAppliedInADrop(t *testing.T) {
	b := setup(t)
	const drop, sku, total = "RELOAD-DROP", "RELOAD-DROP-1", 4
	require.NotEqual(t, inventory.PartitionOf(sku), inventory.DropPartition(drop), "the SKU's own partition is not its drop's")
	_, err := b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: drop, Name: "Drop", MaxPerUser: 1})
	require.NoError(t, err)
	_, err = b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: sku, Price: inventory.Money{Amount: 1000, Currency: "EUR"}, Stock: total, Drop: drop,
	})
	require.NoError(t, err)
	reloadKeepsUnappliedHolds(t, b, sku, total)
}

// reloadKeepsUnappliedHolds makes total holds of sku whose events are still
// in the outbox (no flusher runs), reloads the SKU as after a promotion, and
// checks the reload kept them and they commit.
func reloadKeepsUnappliedHolds(t *testing.T, b *bundle, sku string, total int) {
	t.Helper()
	holds := b.reserveMany(t, sku, total, time.Minute)

	require.NoError(t, b.engine.Maintenance().RebuildStale(b.ctx, sku))
	require.Equal(t, inventory.Stock{SKU: sku, Total: total, Held: total}, withoutTimes(b.stock(t, sku)), "the reload kept every hold")
	_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "outsider"}, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
	var out *inventory.OutOfStockError
	require.ErrorAs(t, err, &out, "the held units are not for sale")

	g, _ := b.startGroup(t, fastConfig("reload"))
	b.waitDrained(t, 10*time.Second, "the outbox is in the ledger", g.Flusher)
	for i, tok := range holds {
		r, err := b.engine.Commit(b.ctx, inventory.Principal{ID: fmt.Sprintf("u%d", i)}, tok)
		require.NoError(t, err, "hold %d", i)
		require.Equal(t, inventory.StatusCommitted, r.Status)
	}
	b.waitDrained(t, 10*time.Second, "the outbox is in the ledger", g.Flusher)
	var sold, open int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold, (SELECT count(*) FROM reservations WHERE sku = $1 AND status <> 'COMMITTED') FROM products WHERE sku = $1`, sku).Scan(&sold, &open))
	require.Equal(t, total, sold)
	require.Zero(t, open)
	require.Equal(t, inventory.Stock{SKU: sku, Total: total, Sold: total}, withoutTimes(b.stock(t, sku)))
}
