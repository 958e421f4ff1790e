package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// clusterDrop is what the buyers of TestClusterFailoverMidDrop were told.
type clusterDrop struct {
	mu        sync.Mutex
	reserved  map[string]time.Time // token -> when its reserve was acknowledged
	skuOf     map[string]string
	committed map[string]time.Time // token -> when its commit was acknowledged
	cancelled map[string]bool
	// Calls sent again after the store failed: answered UNAVAILABLE, or
	// with an error that is no business outcome (the API's INTERNAL).
	unavailable, internal atomic.Int64
	firstInternal         string
	// Commits the ledger refused for want of stock.
	refusedSales atomic.Int64
	started      atomic.Int64
}

func (d *clusterDrop) ack(kind, token, sku string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch kind {
	case "reserve":
		d.reserved[token], d.skuOf[token] = time.Now(), sku
	case "commit":
		d.committed[token] = time.Now()
	case "cancel":
		d.cancelled[token] = true
	}
}

// TestClusterFailoverMidDrop: a drop over one SKU per partition on a
// three-master Redis Cluster with a replica per master. A third of the way
// in, the replica of the master that owns the first SKU's partition is
// stalled and cut off its master for 300 ms, so that it misses what its
// master writes then (holds, sales, cancels: the asynchronous replication's
// window, made wide on purpose), the master is SIGKILLed and the cluster
// promotes the replica.
//
// Checked: Redis never holds and sells more than a SKU's total (sampled
// every 20 ms throughout, and at the end); every commit a buyer saw
// acknowledged is a sale in the ledger; the promoted master answers within
// seconds, and the rebuilder reloads its partitions' SKUs for its new
// replication id; holds made there afterwards expire within a second of
// expiresAt; the write-behind drains and the ledger ends with sold <= total,
// nothing held and no event twice; and, once every hold has ended, Redis and
// the ledger agree SKU by SKU and hold by hold. A wall-clock bound, so it
// runs in the quiet pass.
func TestClusterFailoverMidDrop(t *testing.T) {
	testenv.Quiet(t)
	const (
		perSKU  = 20
		buyers  = 50 // per SKU
		hold    = 3 * time.Second
		overdue = 3 * time.Second
	)
	cluster := testenv.StartReplicatedCluster(t)
	rdb := cluster.Client(t)
	b := newBundle(t, rdb, "dl:", testenv.Postgres(t), inventory.Config{})
	keys := b.engine.Keys()
	skus := skusCoveringAllPartitions("CFAIL")
	for _, s := range skus {
		b.product(t, s, perSKU)
	}
	// For the expiry check after the failover, which the drop leaves alone.
	later := skusCoveringAllPartitions("CLATE")
	for _, s := range later {
		b.product(t, s, perSKU)
	}
	cfg := fastConfig("cluster-failover")
	cfg.Reconciler.OverdueGrace = overdue
	g, _ := b.startGroup(t, cfg)

	// The shard to fail: the master of the first SKU's partition, and the
	// SKUs it owns.
	victim, err := rdb.MasterForKey(b.ctx, keys.Outbox(inventory.PartitionOf(skus[0])))
	require.NoError(t, err)
	master := cluster.Server(victim.Options().Addr)
	require.NotNil(t, master)
	replica, err := cluster.ReplicaOf(b.ctx, master)
	require.NoError(t, err)
	var failed, failedLater []string
	for i, s := range skus {
		m, err := rdb.MasterForKey(b.ctx, keys.Outbox(inventory.PartitionOf(s)))
		require.NoError(t, err)
		if m.Options().Addr == master.Addr {
			failed = append(failed, s)
			failedLater = append(failedLater, later[i])
		}
	}
	t.Logf("failing master %s (replica %s), owner of %d of %d SKUs", master.Addr, replica.Addr, len(failed), len(skus))

	// G1 in Redis, sampled throughout.
	all := append(slices.Clone(skus), later...)
	sampleCtx, stopSampling := context.WithCancel(b.ctx)
	var oversold []string
	var samples atomic.Int64
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			for _, s := range all {
				st, err := b.engine.Catalog().Stock(sampleCtx, s)
				if err != nil {
					continue // the shard is down: nothing to sample
				}
				samples.Add(1)
				if st.Held < 0 || st.Sold < 0 || st.Held+st.Sold > st.Total {
					oversold = append(oversold, fmt.Sprintf("%s: %+v", s, st))
				}
			}
		}
	}()

	d := &clusterDrop{reserved: map[string]time.Time{}, skuOf: map[string]string{}, committed: map[string]time.Time{}, cancelled: map[string]bool{}}
	total := buyers * len(skus)
	errs := make(chan error, total)
	queue := make(chan int, total)
	for i := range total {
		queue <- i
	}
	close(queue)
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			for i := range queue {
				d.started.Add(1)
				if err := buyClusterDrop(b, d, skus[i%len(skus)], i, hold); err != nil {
					errs <- err
				}
			}
		})
	}

	// A third of the way in: the replica stalls, the master dies, the
	// replica resumes and the cluster promotes it.
	waitUntil(t, time.Minute, "a third of the buyers have started", func() bool { return d.started.Load() >= int64(total/3) }, g.Flusher.applied.C())
	replica.Pause()
	victimDirect := redis.NewClient(&redis.Options{Addr: master.Addr})
	require.NoError(t, victimDirect.ClientKillByFilter(b.ctx, "TYPE", "replica").Err())
	require.NoError(t, victimDirect.Close())
	time.Sleep(300 * time.Millisecond) // the window the replica misses
	killedAt := time.Now()
	master.Stop()
	replica.Resume()
	direct := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer direct.Close()
	eventually(t, 30*time.Second, func() bool {
		info, err := direct.Info(b.ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	}, "the cluster promotes the replica")
	promotedAt := time.Now()
	promoted := promotedAt.Sub(killedAt)

	// What the promoted master missed, of what was acknowledged before the kill.
	d.mu.Lock()
	var lostHolds, missedSales int
	for tok, at := range d.reserved {
		if at.After(killedAt) || !slices.Contains(failed, d.skuOf[tok]) {
			continue
		}
		st, err := direct.HGet(b.ctx, keys.Hold(inventory.PartitionOf(d.skuOf[tok]), tok), "st").Result()
		if errors.Is(err, redis.Nil) {
			lostHolds++
		} else if at, ok := d.committed[tok]; ok && at.Before(killedAt) && st != "COMMITTED" {
			missedSales++
		}
	}
	d.mu.Unlock()

	// The promoted master answers within seconds (the client reads the slot
	// map again every second).
	freshSKU := map[string]string{}
	probe, err := reserveRetrying(b, d, inventory.Principal{ID: "probe"}, inventory.ReserveRequest{SKU: failedLater[0], Quantity: 1, HoldFor: time.Second})
	reachable := time.Since(promotedAt)
	require.NoError(t, err, "a reserve on the promoted master, %s after the promotion", reachable.Round(time.Millisecond))
	freshSKU[probe.Token] = failedLater[0]
	require.Less(t, reachable, 5*time.Second, "the promoted master's slots answer within seconds of the promotion")

	// The rebuilder sees the new replication id of the failed partitions'
	// master and reloads their SKUs from the ledger: a sale the promoted
	// master missed is a sale in Redis again.
	reloads := 0
	g.Rebuilder.reloaded.WaitFor(t, 30*time.Second, "the failed partitions are reloaded for the promoted master", func(string) bool {
		reloads++
		return reloads == len(failed)
	})
	reloaded := time.Since(promotedAt)

	// Expiry goes on on the promoted master: short holds made there now are
	// released within a second of expiresAt.
	var fresh []string
	for i := range 20 {
		s := failedLater[i%len(failedLater)]
		r, err := reserveRetrying(b, d, inventory.Principal{ID: fmt.Sprintf("late%d", i)}, inventory.ReserveRequest{SKU: s, Quantity: 1, HoldFor: time.Second})
		require.NoError(t, err)
		fresh = append(fresh, r.Token)
		freshSKU[r.Token] = s
	}
	ended := func(tok string) (late time.Duration, ok bool) {
		h, err := rdb.HMGet(b.ctx, keys.Hold(inventory.PartitionOf(freshSKU[tok]), tok), "st", "exp", "end").Result()
		require.NoError(t, err)
		if h[0] == "HELD" || h[2] == nil {
			return 0, false
		}
		exp, _ := strconv.ParseInt(h[1].(string), 10, 64)
		end, _ := strconv.ParseInt(h[2].(string), 10, 64)
		return time.Duration(end-exp) * time.Millisecond, true
	}
	var latest time.Duration
	waitUntil(t, 20*time.Second, "the holds made on the promoted master end", func() bool {
		latest = 0
		for _, tok := range fresh {
			late, ok := ended(tok)
			if !ok {
				return false
			}
			latest = max(latest, late)
		}
		return true
	}, g.Sweeper.swept.C())

	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	waitUntil(t, 30*time.Second, "every hold of the drop has ended in Redis", func() bool {
		for _, s := range all {
			if b.stock(t, s).Held > 0 {
				return false
			}
		}
		return true
	}, g.Sweeper.swept.C(), g.Flusher.caughtUp.C())
	stopSampling()
	<-samplerDone
	b.waitDrained(t, 30*time.Second, "the write-behind catches up", g.Flusher)
	ledgerHeld := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservations WHERE status = 'HELD'`).Scan(&n))
		return n
	}
	waitUntil(t, 30*time.Second, "the ledger holds nothing", func() bool { return ledgerHeld() == 0 },
		g.Flusher.caughtUp.C(), g.Reconciler.holdsClosed.C())

	t.Logf("FIGURES cluster failover: promoted %s after the kill, reserves there answered %s and its %d partitions were reloaded %s after the promotion; calls sent again: %d after UNAVAILABLE, %d after another error (first: %s); commits refused OUT_OF_STOCK: %d; of what was acknowledged before the kill on the failed shard, %d holds and %d sales were missing on the promoted master; holds made there after: %d, the last released %s after expiresAt; %d samples",
		promoted.Round(time.Millisecond), reachable.Round(time.Millisecond), len(failed), reloaded.Round(time.Millisecond), d.unavailable.Load(), d.internal.Load(), d.firstInternal, d.refusedSales.Load(), lostHolds, missedSales, len(fresh), latest.Round(time.Millisecond), samples.Load())

	require.Empty(t, oversold, "Redis held and sold more than a SKU's total")
	require.Less(t, latest, time.Second, "holds on the promoted master expire within a second of expiresAt")

	// Every acknowledged commit is a sale.
	for tok := range d.committed {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sales WHERE token = $1`, tok).Scan(&n))
		require.Equal(t, 1, n, "the acknowledged commit of %s is a sale", tok)
	}
	totalEvents, distinct, _ := b.movements(t)
	require.Equal(t, totalEvents, distinct, "no ledger event applied twice")

	// G1 in the ledger, and Redis and the ledger agree, hold by hold.
	tokens := map[string][]string{}
	for tok, s := range d.skuOf {
		tokens[s] = append(tokens[s], tok)
	}
	for tok, s := range freshSKU {
		tokens[s] = append(tokens[s], tok)
	}
	lostForGood := 0
	for _, s := range all {
		var sold, total int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold, total FROM products WHERE sku = $1`, s).Scan(&sold, &total))
		require.LessOrEqual(t, sold, total, "%s: the ledger sold more than the total", s)
		st := b.stock(t, s)
		require.LessOrEqual(t, st.Held+st.Sold, st.Total, "%s: Redis", s)
		require.Equal(t, sold, st.Sold, "%s: sold in Redis and the ledger", s)
		require.Zero(t, st.Held, "%s: held in Redis", s)
		require.Equal(t, st.Total, st.Available+st.Sold, "%s: Redis", s)
		// Hold by hold, as the fault suite compares them: a HELD or
		// COMMITTED row has its hold in the SKU's current generation with
		// that status; a CANCELLED or EXPIRED one has none there, or one
		// with the same status; a hold there has its row.
		gen, err := rdb.HGet(b.ctx, keys.SKU(s), "gen").Result()
		require.NoError(t, err)
		for _, tok := range tokens[s] {
			h, err := rdb.HGetAll(b.ctx, keys.Hold(inventory.PartitionOf(s), tok)).Result()
			require.NoError(t, err)
			live, inRedis := len(h) > 0 && h["gen"] == gen, h["st"]
			var inLedger string
			if err := b.pool.QueryRow(b.ctx, `SELECT status FROM reservations WHERE token = $1`, tok).Scan(&inLedger); err != nil {
				require.ErrorIs(t, err, pgx.ErrNoRows)
			}
			switch inLedger {
			case "HELD", "COMMITTED":
				require.True(t, live && inRedis == inLedger, "%s: hold %s is %s in the ledger, %q in Redis (live %v)", s, tok, inLedger, inRedis, live)
			case "CANCELLED", "EXPIRED":
				require.True(t, !live || inRedis == inLedger, "%s: hold %s is %s in the ledger, %s in Redis", s, tok, inLedger, inRedis)
			default:
				require.False(t, live, "%s: hold %s is %s in Redis and not in the ledger", s, tok, inRedis)
			}
			if len(h) == 0 {
				lostForGood++ // lost with the dead master before it was replicated
			}
		}
	}
	t.Logf("FIGURES cluster failover: %d acknowledged holds are in no Redis at the end (lost with the dead master); the ledger and Redis agree on every other", lostForGood)
}

// buyClusterDrop is one buyer: a reserve with an idempotency key, then a
// commit (60 %), a cancel (20 %) or nothing, each resent while the store
// is unavailable. It returns only an error the drop cannot explain.
func buyClusterDrop(b *bundle, d *clusterDrop, sku string, i int, hold time.Duration) error {
	who := inventory.Principal{ID: fmt.Sprintf("buyer%d", i)}
	r, err := reserveRetrying(b, d, who, inventory.ReserveRequest{SKU: sku, Quantity: 1, IdempotencyKey: "k" + strconv.Itoa(i), HoldFor: hold})
	switch {
	case errors.Is(err, inventory.ErrOutOfStock):
		return nil
	case err != nil:
		return fmt.Errorf("reserve of %s: %w", who.ID, err)
	}
	d.ack("reserve", r.Token, sku)
	time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond) // the buyer thinks
	dice := rand.IntN(10)
	if dice >= 8 {
		return nil // abandoned: it expires
	}
	kind, call := "commit", b.engine.Commit
	if dice >= 6 {
		kind, call = "cancel", b.engine.Cancel
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := call(b.ctx, who, r.Token)
		switch {
		case err == nil:
			d.ack(kind, r.Token, sku)
			return nil
		case errors.Is(err, inventory.ErrExpired), errors.Is(err, inventory.ErrNotFound),
			errors.Is(err, inventory.ErrAlreadyCancelled):
			return nil // the hold ended first, or was lost with the dead master
		case kind == "commit" && errors.Is(err, inventory.ErrOutOfStock):
			// A unit the promoted master offered again before the reload,
			// which the ledger had sold: the ledger refuses the sale.
			d.refusedSales.Add(1)
			return nil
		case !d.retry(err) || time.Now().After(deadline):
			return fmt.Errorf("%s of %s: %w", kind, r.Token, err)
		}
	}
}

// reserveRetrying sends a reserve again while the store fails (the shard
// is down, or the cluster has not promoted its replica yet).
func reserveRetrying(b *bundle, d *clusterDrop, who inventory.Principal, req inventory.ReserveRequest) (inventory.Reservation, error) {
	for deadline := time.Now().Add(30 * time.Second); ; {
		r, err := b.engine.Reserve(b.ctx, who, req)
		if err == nil || !d.retry(err) || time.Now().After(deadline) {
			return r, err
		}
	}
}

// retry reports whether err is the store failing rather than an outcome,
// counts it and waits a little before the call is sent again.
func (d *clusterDrop) retry(err error) bool {
	switch inventory.ErrorCode(err) {
	case inventory.ErrUnavailable.Code():
		d.unavailable.Add(1)
	case "":
		if d.internal.Add(1) == 1 {
			d.mu.Lock()
			d.firstInternal = err.Error()
			d.mu.Unlock()
		}
	default:
		return false
	}
	time.Sleep(50 * time.Millisecond)
	return true
}
