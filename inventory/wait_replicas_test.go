package inventory_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// TestWaitForReplicas runs the engine on a primary with one replica and
// WaitReplicas 1: a reserve and a commit are on the replica when they
// answer. With the replica stalled, the wait runs out after WaitTimeout,
// the hold is made and answered all the same, and the short wait is
// counted. A cluster client is refused, since WAIT there would go to a
// node the script did not run on.
func TestWaitForReplicas(t *testing.T) {
	t.Parallel()
	primary := testenv.StartServer(t)
	replica := testenv.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	rdb := redis.NewClient(&redis.Options{Addr: primary.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	onReplica := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = onReplica.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool {
		n, err := rdb.Do(ctx, "WAIT", 1, 100).Int()
		return err == nil && n == 1
	}, 10*time.Second, 50*time.Millisecond, "the replica syncs")

	pool := testenv.Postgres(t)
	engine := func(timeout time.Duration) (*inventory.Engine, func() float64) {
		reg := prometheus.NewRegistry()
		e, err := inventory.NewEngine(ctx, inventory.Config{WaitReplicas: 1, WaitTimeout: timeout, Registerer: reg}, rdb, pool, zerolog.Nop())
		require.NoError(t, err)
		return e, func() float64 { return testutil.ToFloat64(collectorOf(t, reg, "dropline_redis_wait_short_total")) }
	}
	// With the replica answering, the wait ends as soon as it has the
	// writes; its bound here only keeps a slow machine from running it out.
	e, short := engine(5 * time.Second)
	_, err := e.Catalog().CreateProduct(ctx, admin, inventory.ProductInput{SKU: "WAIT-1", Name: "w", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 5})
	require.NoError(t, err)

	// WAIT counts only the writes of its own connection: the pipeline keeps
	// the script and WAIT on one, so the hold is on the replica at once.
	for i := range 3 {
		r, err := e.Reserve(ctx, buyer(i), inventory.ReserveRequest{SKU: "WAIT-1", Quantity: 1})
		require.NoError(t, err)
		n, err := onReplica.Exists(ctx, e.Keys().Hold(inventory.PartitionOf("WAIT-1"), r.Token)).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the hold is on the replica when the reserve answers")
		if i == 0 {
			sale, err := e.Commit(ctx, buyer(i), r.Token)
			require.NoError(t, err)
			st, err := onReplica.HGet(ctx, e.Keys().Hold(inventory.PartitionOf("WAIT-1"), r.Token), "st").Result()
			require.NoError(t, err)
			require.Equal(t, string(sale.Status), st, "the sale is on the replica when the commit answers")
		}
	}
	require.Zero(t, short())

	// The replica has reserve.lua's function from its primary: promoted, it
	// runs reserves without loading anything.
	libs, err := onReplica.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "dropline_reserve_*"}).Result()
	require.NoError(t, err)
	require.Len(t, libs, 1, "the replica has the primary's functions")

	// After a failover the new primary may not have the scripts: NOSCRIPT
	// is answered by EVAL in the same pipeline shape, and a function not
	// found by loading the functions and calling again.
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	_, err = e.Reserve(ctx, buyer(8), inventory.ReserveRequest{SKU: "WAIT-1", Quantity: 1})
	require.NoError(t, err)

	const timeout = 150 * time.Millisecond
	stalled, stalledShort := engine(timeout)
	replica.Pause()
	t.Cleanup(replica.Resume)
	start := time.Now()
	r, err := stalled.Reserve(ctx, buyer(9), inventory.ReserveRequest{SKU: "WAIT-1", Quantity: 1})
	took := time.Since(start)
	require.NoError(t, err, "a slow replica never turns a made hold into an error")
	require.Equal(t, inventory.StatusHeld, r.Status)
	require.GreaterOrEqual(t, took, timeout)
	require.Less(t, took, 3*time.Second)
	require.EqualValues(t, 1, stalledShort())
	require.Zero(t, short(), "only the stalled engine ran out its wait")
	t.Logf("reserve with the replica stalled answered after %s (timeout %s)", took.Round(time.Millisecond), timeout)

	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{primary.Addr}})
	t.Cleanup(func() { _ = cluster.Close() })
	_, err = inventory.NewEngine(ctx, inventory.Config{WaitReplicas: 1}, cluster, pool, zerolog.Nop())
	require.ErrorContains(t, err, "single primary")
	_, err = inventory.NewEngine(ctx, inventory.Config{WaitReplicas: -1}, rdb, pool, zerolog.Nop())
	require.Error(t, err)
}

// collectorOf finds a registered counter by name.
func collectorOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return counterByName{reg: reg, name: name}
}

type counterByName struct {
	reg  *prometheus.Registry
	name string
}

func (c counterByName) Describe(chan<- *prometheus.Desc) {}
func (c counterByName) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := c.reg.Gather()
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == c.name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "", nil, nil), prometheus.CounterValue, v)
}

// BenchmarkReserveWaitReplicas compares reserves on a primary with one
// replica, without waiting and with WaitReplicas 1: the cost of WAIT is one
// replication round trip per reserve, paid on the connection that ran the
// script. Run: go test -run '^$' -bench ReserveWaitReplicas ./inventory/
func BenchmarkReserveWaitReplicas(b *testing.B) {
	primary := testenv.StartServer(b)
	testenv.StartServer(b, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	rdb := redis.NewClient(&redis.Options{Addr: primary.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for {
		if n, err := rdb.Do(ctx, "WAIT", 1, 100).Int(); err == nil && n == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	pool := testenv.Postgres(b)
	var n atomic.Int64
	for _, wait := range []int{0, 1} {
		e, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: fmt.Sprintf("w%d:", wait), MaxQuantity: 1, WaitReplicas: wait}, rdb, pool, zerolog.Nop())
		require.NoError(b, err)
		sku := fmt.Sprintf("WAITBENCH-%d", wait)
		_, err = e.Catalog().CreateProduct(ctx, admin, inventory.ProductInput{SKU: sku, Name: "w", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: 1_000_000_000})
		require.NoError(b, err)
		b.Run(fmt.Sprintf("wait=%d", wait), func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := e.Reserve(ctx, buyer(int(n.Add(1))), inventory.ReserveRequest{SKU: sku, Quantity: 1}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
