package live_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var admin = inventory.Principal{ID: "admin", Admin: true}

func buyer(i int) inventory.Principal { return inventory.Principal{ID: fmt.Sprintf("buyer-%d", i)} }

// bundle is what a hub test needs: an engine on this test's own Redis prefix
// and Postgres database, and a running hub with its own metrics registry.
type bundle struct {
	ctx    context.Context
	engine *inventory.Engine
	rdb    redis.UniversalClient
	pool   *pgxpool.Pool
	hub    *live.Hub
	reg    *prometheus.Registry
	cfg    live.HubConfig
	// leaks ignores the goroutines that existed before the hub started
	// (client pools), for goleak.VerifyNone after Stop.
	leaks goleak.Option
}

func setup(t testing.TB, rdb redis.UniversalClient, prefix string, cfg live.HubConfig) *bundle {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: prefix}, rdb, pool, zerolog.Nop())
	require.NoError(t, err)
	b := &bundle{ctx: ctx, engine: e, rdb: rdb, pool: pool, reg: prometheus.NewRegistry(), cfg: cfg,
		leaks: goleak.IgnoreCurrent()}
	b.hub = live.NewHub(cfg, e, rdb, zerolog.Nop(), b.reg)
	b.hub.InitTestSignals()
	b.cfg = b.hub.Config()
	require.NoError(t, b.hub.Start(ctx))
	t.Cleanup(func() { require.NoError(t, b.hub.Stop(context.Background())) })
	return b
}

func setupBackend(t testing.TB, backend string, cfg live.HubConfig) *bundle {
	t.Helper()
	r := testenv.RedisBackend(t, backend)
	return setup(t, r.Client, r.Prefix, cfg)
}

func (b *bundle) product(t testing.TB, sku string, stock int) {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: "Product " + sku, Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: stock,
	})
	require.NoError(t, err)
}

func (b *bundle) truth(t testing.TB, sku string) inventory.Stock {
	t.Helper()
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	return s
}

// metric returns the sum of a metric's series (0 when it has none yet).
func (b *bundle) metric(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

// shardSubscribers counts Redis' sharded subscribers of channels, on every
// master of a cluster.
func shardSubscribers(t testing.TB, rdb redis.UniversalClient, channels ...string) int64 {
	t.Helper()
	ctx := context.Background()
	count := func(c *redis.Client) (int64, error) {
		m, err := c.PubSubShardNumSub(ctx, channels...).Result()
		var n int64
		for _, v := range m {
			n += v
		}
		return n, err
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		var total int64
		require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			n, err := count(node)
			mu.Lock()
			total += n
			mu.Unlock()
			return err
		}))
		return total
	case *redis.Client:
		n, err := count(c)
		require.NoError(t, err)
		return n
	}
	t.Fatalf("unexpected client %T", rdb)
	return 0
}

// received is one value as a subscriber saw it.
type received struct {
	v  inventory.Stock
	at time.Time
}

// collector reads a subscription until it closes.
type collector struct {
	mu     sync.Mutex
	got    []received
	last   map[string]inventory.Stock
	closed chan struct{}
	// delivered holds a token after each value the hub delivered, so a
	// test waits for deliveries instead of polling for them.
	delivered chan struct{}
}

func collect(ch <-chan inventory.Stock) *collector {
	c := &collector{last: map[string]inventory.Stock{}, closed: make(chan struct{}), delivered: make(chan struct{}, 1)}
	go func() {
		defer close(c.closed)
		for v := range ch {
			c.mu.Lock()
			c.got = append(c.got, received{v: v, at: time.Now()})
			c.last[v.SKU] = v
			c.mu.Unlock()
			select {
			case c.delivered <- struct{}{}:
			default: // a token is waiting already: the waiter looks at everything then
			}
		}
	}()
	return c
}

// waitFor waits until cond, which reads what the subscription received,
// holds: it looks at cond first and again after each delivery, and fails the
// test after timeout or when the subscription ends without it. It returns
// how long it took.
func (c *collector) waitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-c.delivered:
		case <-c.closed:
			if !cond() {
				t.Fatalf("the subscription ended: "+msg, args...)
			}
		case <-deadline.C:
			t.Fatalf("after %s: "+msg, append([]any{timeout}, args...)...)
		}
	}
	return time.Since(start)
}

func (c *collector) lastOf(sku string) (inventory.Stock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.last[sku]
	return v, ok
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func (c *collector) requireClosed(t testing.TB) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("subscription channel did not close")
	}
}

// same compares the counters and sequence of two values.
func same(a, b inventory.Stock) bool {
	return a.SKU == b.SKU && a.Seq == b.Seq && a.Available == b.Available && a.Held == b.Held &&
		a.Sold == b.Sold && a.Total == b.Total
}

// waitFor polls cond until it holds or timeout passes; it returns how long
// it took.
func waitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("after %s: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// waitConverged waits until the collector's last value of sku equals the
// truth, which must happen within 250 ms (G8).
func (b *bundle) waitConverged(t testing.TB, c *collector, sku string) inventory.Stock {
	t.Helper()
	return b.waitConvergedWithin(t, c, sku, 250*time.Millisecond)
}

// waitConvergedWithin is waitConverged with a bound of d, for tests whose
// point is that the value comes, not how soon.
func (b *bundle) waitConvergedWithin(t testing.TB, c *collector, sku string, d time.Duration) inventory.Stock {
	t.Helper()
	changed := time.Now()
	truth := b.truth(t, sku)
	c.waitFor(t, d-time.Since(changed), func() bool {
		v, ok := c.lastOf(sku)
		return ok && same(v, truth)
	}, "subscriber did not converge to %+v", truth)
	return truth
}

// TestSubscribeValidates: refused subscriptions, duplicates, a stopped hub.
// Not parallel: it ends by checking that no goroutine is left beyond those
// before it started, which other tests' goroutines would fail.
func TestSubscribeValidates(t *testing.T) {
	b := setupBackend(t, "single", live.HubConfig{MaxSKUs: 3})
	b.product(t, "A", 1)
	_, err := b.hub.Subscribe(b.ctx, nil)
	require.ErrorIs(t, err, inventory.ErrInvalidInput)
	_, err = b.hub.Subscribe(b.ctx, []string{"bad sku"})
	require.ErrorIs(t, err, inventory.ErrInvalidInput)
	_, err = b.hub.Subscribe(b.ctx, []string{"A", "B", "C", "D"})
	require.ErrorIs(t, err, inventory.ErrInvalidInput)
	_, err = b.hub.Subscribe(b.ctx, []string{"A", "NOPE"})
	require.ErrorIs(t, err, inventory.ErrNotFound)
	require.Zero(t, b.metric(t, "dropline_live_skus"), "a refused subscription must not subscribe in Redis")

	// Duplicates count once, and the first values are the current ones.
	ctx, cancel := context.WithCancel(b.ctx)
	ch, err := b.hub.Subscribe(ctx, []string{"A", "A", "A", "A"})
	require.NoError(t, err)
	require.True(t, same(<-ch, b.truth(t, "A")))
	cancel()
	for range ch {
	}

	require.NoError(t, b.hub.Stop(b.ctx))
	require.NoError(t, b.hub.Stop(b.ctx), "stopping twice does nothing")
	_, err = b.hub.Subscribe(b.ctx, []string{"A"})
	require.ErrorIs(t, err, live.ErrNotRunning)
	goleak.VerifyNone(t, b.leaks)
}

// TestConvergesToTruth: reserves, cancels and commits from other goroutines;
// the subscriber's last value equals the engine's and the ledger's at rest,
// within 250 ms of the last change.
func TestConvergesToTruth(t *testing.T) {
	testenv.Quiet(t)
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			b := setupBackend(t, backend, live.HubConfig{})
			b.product(t, "DROP-1", 200)
			b.product(t, "DROP-2", 50)
			ctx, cancel := context.WithCancel(b.ctx)
			ch, err := b.hub.Subscribe(ctx, []string{"DROP-1", "DROP-2"})
			require.NoError(t, err)
			c := collect(ch)
			b.waitConverged(t, c, "DROP-1")
			b.waitConverged(t, c, "DROP-2")

			var wg sync.WaitGroup
			errs := make([]error, 8)
			for g := range errs {
				wg.Go(func() {
					for i := 0; i < 20; i++ {
						who := buyer(g*100 + i)
						sku := "DROP-1"
						if i%4 == 0 {
							sku = "DROP-2"
						}
						h, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: sku, Quantity: 1 + i%3})
						if err != nil {
							continue // out of stock is a fine outcome here
						}
						switch i % 3 {
						case 0:
							_, err = b.engine.Cancel(b.ctx, who, h.Token)
						case 1:
							_, err = b.engine.Commit(b.ctx, who, h.Token)
						}
						if err != nil {
							errs[g] = fmt.Errorf("buyer %d: %w", g*100+i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			s1 := b.waitConverged(t, c, "DROP-1")
			b.waitConverged(t, c, "DROP-2")

			// At rest it stays equal to the truth and to the ledger.
			time.Sleep(3 * b.cfg.Interval) // nothing to wait for: checking that nothing happens
			v, _ := c.lastOf("DROP-1")
			require.True(t, same(v, b.truth(t, "DROP-1")))
			var sold, total int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold, total FROM products WHERE sku = 'DROP-1'`).Scan(&sold, &total))
			require.Equal(t, sold, v.Sold)
			require.Equal(t, total, v.Total)
			require.Equal(t, s1.Total, v.Available+v.Held+v.Sold)
			require.Greater(t, v.Sold, 0)

			cancel()
			c.requireClosed(t)
			require.Positive(t, b.metric(t, "dropline_live_delivery_latency_seconds"))
		})
	}
}

// TestBurstIsCoalesced: 1,000 reserves produce far fewer deliveries than
// changes, and the last delivery is the truth.
func TestBurstIsCoalesced(t *testing.T) {
	testenv.Quiet(t)
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			b := setupBackend(t, backend, live.HubConfig{})
			b.product(t, "HOT", 5000)
			ctx, cancel := context.WithCancel(b.ctx)
			ch, err := b.hub.Subscribe(ctx, []string{"HOT"})
			require.NoError(t, err)
			c := collect(ch)
			b.waitConverged(t, c, "HOT")
			before := c.count()

			const reserves = 1000
			start := time.Now()
			var wg sync.WaitGroup
			errs := make([]error, 16)
			for g := range errs {
				wg.Go(func() {
					for i := g; i < reserves; i += 16 {
						_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "HOT", Quantity: 1})
						if err != nil {
							errs[g] = fmt.Errorf("reserve %d: %w", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			burst := time.Since(start)
			truth := b.waitConverged(t, c, "HOT")
			require.Equal(t, 5000-reserves, truth.Available)
			deliveries := c.count() - before
			t.Logf("%s: %d reserves in %s -> %d deliveries, %.0f messages received, %.0f coalesced",
				backend, reserves, burst.Round(time.Millisecond), deliveries,
				b.metric(t, "dropline_live_messages_received_total"), b.metric(t, "dropline_live_coalesced_total"))
			// One delivery per MinInterval at most, plus the leading edge.
			require.LessOrEqual(t, deliveries, int(burst/b.cfg.MinInterval)+3)
			require.Less(t, deliveries, reserves/10)
			require.Positive(t, b.metric(t, "dropline_live_coalesced_total"))

			cancel()
			c.requireClosed(t)
		})
	}
}

// TestSubscribeCyclesLeaveNothing: 1,000 subscribe/unsubscribe cycles leave
// no goroutine, no feed and no Redis subscription behind. Not parallel: it
// counts the process's goroutines, which other tests' would blur.
func TestSubscribeCyclesLeaveNothing(t *testing.T) {
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			b := setupBackend(t, backend, live.HubConfig{Linger: 20 * time.Millisecond})
			skus := []string{"CYC-1", "CYC-2", "CYC-3", "CYC-4"}
			channels := make([]string, len(skus))
			for i, sku := range skus {
				b.product(t, sku, 10)
				channels[i] = b.engine.Keys().Channel(sku)
			}
			baseline := runtime.NumGoroutine()

			const cycles, workers = 1000, 20
			var wg sync.WaitGroup
			errs := make([]error, workers)
			for w := range workers {
				wg.Go(func() {
					for i := w; i < cycles; i += workers {
						ctx, cancel := context.WithCancel(b.ctx)
						ch, err := b.hub.Subscribe(ctx, []string{skus[i%len(skus)], skus[(i+1)%len(skus)]})
						if err != nil {
							cancel()
							errs[w] = fmt.Errorf("subscription %d: %w", i, err)
							return
						}
						<-ch
						if i%3 == 0 {
							<-ch // both first values
						}
						cancel()
						for range ch {
						}
					}
				})
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			require.Zero(t, b.metric(t, "dropline_live_subscriptions"))
			waitFor(t, 5*time.Second, func() bool {
				return b.metric(t, "dropline_live_skus") == 0 && shardSubscribers(t, b.rdb, channels...) == 0
			}, "feeds or Redis subscriptions left: %v feeds", b.metric(t, "dropline_live_skus"))
			// The hub keeps only its three loops; shard receivers went with
			// their last channel.
			waitFor(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= baseline },
				"goroutines: %d, baseline %d", runtime.NumGoroutine(), baseline)

			require.NoError(t, b.hub.Stop(b.ctx))
			goleak.VerifyNone(t, b.leaks)
		})
	}
}

// TestStalledSubscriberIsDropped: a subscriber that never reads neither
// delays another on the same SKU (which converges within 250 ms, G8) nor
// survives StallTimeout. It holds a wall-clock bound, so it runs in make
// test's quiet pass and not in parallel with other tests, whose bursts of
// reserves would be measured with it.
func TestStalledSubscriberIsDropped(t *testing.T) {
	testenv.Quiet(t)
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			const stall = 400 * time.Millisecond
			b := setupBackend(t, backend, live.HubConfig{StallTimeout: stall})
			b.product(t, "SLOW", 100)
			stalled, err := b.hub.Subscribe(b.ctx, []string{"SLOW"})
			require.NoError(t, err)
			subscribed := time.Now()
			ctx, cancel := context.WithCancel(b.ctx)
			ch, err := b.hub.Subscribe(ctx, []string{"SLOW"})
			require.NoError(t, err)
			c := collect(ch)
			b.waitConverged(t, c, "SLOW")

			for i := 0; i < 5; i++ {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "SLOW", Quantity: 1})
				require.NoError(t, err)
				b.waitConverged(t, c, "SLOW") // within 250 ms although the other one reads nothing
			}

			select {
			case <-b.hub.Dropped():
			case <-time.After(stall + 2*time.Second):
				t.Fatal("the stalled subscriber was not dropped")
			}
			require.Equal(t, 1.0, b.metric(t, "dropline_live_slow_subscribers_dropped_total"), "one subscriber dropped, once")
			require.GreaterOrEqual(t, time.Since(subscribed), stall)
			select {
			case _, ok := <-stalled:
				require.False(t, ok, "a dropped subscriber's channel is closed, with nothing left in it")
			case <-time.After(time.Second):
				t.Fatal("the dropped subscriber's channel is not closed")
			}

			// The reader is still served.
			_, err = b.engine.Reserve(b.ctx, buyer(99), inventory.ReserveRequest{SKU: "SLOW", Quantity: 1})
			require.NoError(t, err)
			b.waitConverged(t, c, "SLOW")
			require.Equal(t, float64(1), b.metric(t, "dropline_live_subscriptions"))
			cancel()
			c.requireClosed(t)
		})
	}
}

// TestRedisRestart: after the pub/sub connection drops (a killed connection,
// then a restarted server that lost everything) subscribers get the current
// value again, and changes flow again.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 5})
	t.Cleanup(func() { _ = rdb.Close() })
	b := setup(t, rdb, "dl:", live.HubConfig{PingInterval: 200 * time.Millisecond})
	b.product(t, "PHOENIX", 30)
	ctx, cancel := context.WithCancel(b.ctx)
	ch, err := b.hub.Subscribe(ctx, []string{"PHOENIX"})
	require.NoError(t, err)
	c := collect(ch)
	for i := 0; i < 3; i++ {
		_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "PHOENIX", Quantity: 2})
		require.NoError(t, err)
	}
	before := b.waitConvergedWithin(t, c, "PHOENIX", 5*time.Second)
	select {
	case <-b.hub.Confirmed():
	case <-time.After(2 * time.Second):
		t.Fatal("the subscription was never confirmed")
	}
	require.GreaterOrEqual(t, b.metric(t, "dropline_live_resyncs_total"), 1.0)

	// 1. The pub/sub connection is killed; Redis keeps its data. The same
	// value is delivered again once the subscription is back.
	n := c.count()
	require.NoError(t, rdb.ClientKillByFilter(b.ctx, "TYPE", "pubsub").Err())
	c.waitFor(t, 5*time.Second, func() bool { return c.count() > n }, "no delivery after the connection came back")
	v, _ := c.lastOf("PHOENIX")
	require.True(t, same(v, before), "got %+v, want %+v", v, before)
	require.Positive(t, b.metric(t, "dropline_live_reconnects_total"))

	// 2. The server is restarted empty. The hub re-reads, which rebuilds the
	// SKU from Postgres (the holds, never flushed to the ledger here, are
	// gone), and delivers it.
	n = c.count()
	srv.Stop()
	require.NoError(t, srv.Start())
	c.waitFor(t, 10*time.Second, func() bool { return c.count() > n }, "no delivery after the restart")
	truth := b.truth(t, "PHOENIX")
	require.Equal(t, 30, truth.Available)
	c.waitFor(t, 2*time.Second, func() bool {
		v, _ := c.lastOf("PHOENIX")
		return same(v, truth)
	}, "subscriber did not get the rebuilt value %+v", truth)

	// 3. Changes are announced and delivered again.
	_, err = b.engine.Reserve(b.ctx, buyer(7), inventory.ReserveRequest{SKU: "PHOENIX", Quantity: 1})
	require.NoError(t, err)
	b.waitConvergedWithin(t, c, "PHOENIX", 5*time.Second)
	cancel()
	c.requireClosed(t)
}

// TestQuietSKUIsDeliveredAtOnce: the first change of a SKU that was quiet
// reaches the subscriber at once; a change right after it waits only for
// the first to reach every subscriber and for MinInterval, not for the
// Interval's end (self-clocked pacing), and the last value always arrives.
// The Interval is long, so that "at once" and "at the end" cannot be
// mistaken for each other.
func TestQuietSKUIsDeliveredAtOnce(t *testing.T) {
	testenv.Quiet(t)
	const interval, minInterval = 2 * time.Second, 100 * time.Millisecond
	b := setupBackend(t, testenv.Backends[0], live.HubConfig{Interval: interval, MinInterval: minInterval})
	b.product(t, "QUIET", 10)
	ch, err := b.hub.Subscribe(b.ctx, []string{"QUIET"})
	require.NoError(t, err)
	c := collect(ch)
	b.waitConverged(t, c, "QUIET")
	time.Sleep(2 * minInterval)

	before := time.Now()
	_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "QUIET", Quantity: 1})
	require.NoError(t, err)
	first := b.truth(t, "QUIET")
	took := c.waitFor(t, interval/2, func() bool {
		v, ok := c.lastOf("QUIET")
		return ok && same(v, first)
	}, "the first change of a quiet SKU was not delivered within half an Interval")
	t.Logf("first change of a quiet SKU delivered %s after its reserve returned", took.Round(time.Millisecond))

	_, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "QUIET", Quantity: 1})
	require.NoError(t, err)
	second := b.truth(t, "QUIET")
	took = c.waitFor(t, interval/2, func() bool {
		v, ok := c.lastOf("QUIET")
		return ok && same(v, second)
	}, "the change after it waited for the Interval although its subscriber had taken the first")
	t.Logf("the change right after it delivered %s after its reserve returned", took.Round(time.Millisecond))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.got {
		if same(r.v, second) {
			require.GreaterOrEqual(t, r.at.Sub(before), minInterval, "two deliveries within MinInterval")
		}
	}
	require.Equal(t, 8, second.Available)
}

// TestSlowReaderHoldsASKUBackAtMostAnInterval: a subscriber that does not
// take its SKU's value keeps the SKU's fan-out from finishing, so the next
// change waits, but for the Interval at most: the other subscribers then
// get it, and the slow one holds only the newest value.
func TestSlowReaderHoldsASKUBackAtMostAnInterval(t *testing.T) {
	testenv.Quiet(t)
	const interval, minInterval = time.Second, 50 * time.Millisecond
	b := setupBackend(t, testenv.Backends[0], live.HubConfig{Interval: interval, MinInterval: minInterval})
	b.product(t, "SLOWREADER", 10)
	ch, err := b.hub.Subscribe(b.ctx, []string{"SLOWREADER"})
	require.NoError(t, err)
	c := collect(ch)
	b.waitConverged(t, c, "SLOWREADER")
	slow, err := b.hub.Subscribe(b.ctx, []string{"SLOWREADER"}) // never read until the end
	require.NoError(t, err)
	time.Sleep(interval + 100*time.Millisecond) // past the Interval since the last flush

	// The flush of the first change comes after this moment, and the
	// second waits for the Interval after that flush: it reaches the
	// subscriber an Interval after this moment at the earliest, however
	// late this goroutine or the collector's run.
	reserved := time.Now()
	_, err = b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "SLOWREADER", Quantity: 1})
	require.NoError(t, err)
	first := b.truth(t, "SLOWREADER")
	c.waitFor(t, interval/2, func() bool {
		v, ok := c.lastOf("SLOWREADER")
		return ok && same(v, first)
	}, "a change more than an Interval after the last flush was held back")

	_, err = b.engine.Reserve(b.ctx, buyer(2), inventory.ReserveRequest{SKU: "SLOWREADER", Quantity: 1})
	require.NoError(t, err)
	second := b.truth(t, "SLOWREADER")
	c.waitFor(t, 2*interval, func() bool {
		v, ok := c.lastOf("SLOWREADER")
		return ok && same(v, second)
	}, "the change was never delivered")
	c.mu.Lock()
	for _, r := range c.got {
		if same(r.v, second) {
			require.GreaterOrEqual(t, r.at.Sub(reserved), interval,
				"a change went out before the slow subscriber took the previous one and before the Interval")
		}
	}
	c.mu.Unlock()

	// The value in the slow subscriber's hand was kept fresh: it never reads
	// the value it was first handed, which two changes replaced. Its
	// goroutine may not have swapped in the newest yet when the reader
	// comes (the flush offers subscribers in no fixed order, and a send and
	// a wake-up ready together are picked at random), so it may read the
	// change before the newest, then the newest at once.
	readSlow := func() inventory.Stock {
		t.Helper()
		select {
		case v := <-slow:
			return v
		case <-time.After(5 * time.Second):
			t.Fatal("the slow subscriber never got a value")
			return inventory.Stock{}
		}
	}
	v := readSlow()
	if !same(v, second) {
		require.True(t, same(v, first), "the slow subscriber read %+v, neither of the last two values", v)
		require.True(t, same(readSlow(), second), "the slow subscriber's next value is not the newest")
	}
}
