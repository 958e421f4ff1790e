package worker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
)

// TestMain checks once, after every test, that no goroutine outlived them,
// so the tests without a latency bound may run in parallel (t.Parallel);
// those with one run alone, before them.
func TestMain(m *testing.M) { testenv.MainCheckingLeaks(m) }

var admin = inventory.Principal{ID: "admin", Admin: true}

// bundle is what a worker test needs: real Redis and Postgres, an engine on
// them, and a logger that writes to the test.
type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	prefix string
	engine *inventory.Engine
	log    zerolog.Logger
}

// setup gives the test its own database and key prefix on the shared Redis.
func setup(t *testing.T) *bundle {
	env := testenv.Redis(t)
	pool := testenv.Postgres(t)
	return newBundle(t, env.Client, env.Prefix, pool, inventory.Config{})
}

func newBundle(t *testing.T, rdb redis.UniversalClient, prefix string, pool *pgxpool.Pool, cfg inventory.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	cfg.KeyPrefix = prefix
	engine, err := inventory.NewEngine(ctx, cfg, rdb, pool, log)
	require.NoError(t, err)
	return &bundle{ctx: ctx, pool: pool, rdb: rdb, prefix: prefix, engine: engine, log: log}
}

// fastConfig shortens every interval so tests finish in seconds.
func fastConfig(owner string) GroupConfig {
	return GroupConfig{
		Options: Options{
			Owner: owner, LeaseTTL: 2 * time.Second, LeaseCheck: 100 * time.Millisecond,
			MinRestartBackoff: 50 * time.Millisecond, MaxRestartBackoff: 500 * time.Millisecond,
		},
		Flusher:    FlusherConfig{ClaimIdle: time.Second, ClaimInterval: 200 * time.Millisecond, TrimInterval: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond},
		Reconciler: CommitReconcilerConfig{Interval: 200 * time.Millisecond},
		Rebuilder:  RebuilderConfig{Interval: 100 * time.Millisecond},
	}
}

// errCrashed ends the context of a process a test kills.
var errCrashed = errors.New("the process crashed")

// testGroup is a started group that the test can also kill.
type testGroup struct {
	*Group
	crash context.CancelCauseFunc
}

// kill stops the group's loops the way a SIGKILL would: its context ends
// without a stop, so nothing is released; its leases stay in Redis until
// they expire, its pending events stay pending.
func (g *testGroup) kill(t *testing.T) {
	t.Helper()
	g.crash(errCrashed)
	stop(t, g.Group)
}

// initSignals makes the group's workers signal the test (swept, applied,
// caught up, settled, closed, checked, rebuilt, reloaded, leases held);
// call it before Start.
func (g *Group) initSignals() {
	g.Sweeper.swept.Init()
	g.Flusher.initSignals()
	for _, s := range []*service{g.Sweeper.service, g.Reconciler.service, g.Rebuilder.service} {
		s.restarted.Init()
	}
	g.Reconciler.commitsSettled.Init()
	g.Reconciler.holdsClosed.Init()
	g.Rebuilder.checked.Init()
	g.Rebuilder.rebuilt.Init()
	g.Rebuilder.reloaded.Init()
	for _, s := range []*leaseSet{g.Sweeper.leases, g.Reconciler.leases} {
		s.heldNow.Init()
	}
}

// initSignals makes a flusher signal the test (applied, caught up, leases
// held); call it before Start.
func (f *Flusher) initSignals() {
	f.applied.Init()
	f.restarted.Init()
	f.caughtUp.Init()
	f.measured.Init()
	f.leases.heldNow.Init()
}

// waitHeld waits until the keeper of s holds n leases.
func waitHeld(t *testing.T, s *leaseSet, n int, what string) {
	t.Helper()
	s.heldNow.WaitFor(t, 10*time.Second, what, func(held int) bool { return held == n })
}

// counter is a worker's running total and the signal that carries it.
type counter struct {
	sig   *testsignal.Signal[int64]
	total *atomic.Int64
}

func swept(g *testGroup) counter   { return counter{&g.Sweeper.swept, &g.Sweeper.total} }
func applied(g *testGroup) counter { return counter{&g.Flusher.applied, &g.Flusher.total} }
func settled(g *testGroup) counter {
	return counter{&g.Reconciler.commitsSettled, &g.Reconciler.settledTotal}
}
func closedOverdue(g *testGroup) counter {
	return counter{&g.Reconciler.holdsClosed, &g.Reconciler.closedTotal}
}

// waitTotal waits until the running totals of the counters (holds swept or
// events applied, one per worker) add up to want, then requires that they
// did not go past it.
func waitTotal(t *testing.T, what string, want int64, counters ...counter) {
	t.Helper()
	last := make([]int64, len(counters))
	cases := make([]reflect.SelectCase, len(counters)+1)
	for i, c := range counters {
		last[i] = c.total.Load()
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.sig.C())}
	}
	sigs := counters
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	cases[len(sigs)] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timeout.C)}
	for {
		sum := int64(0)
		for _, v := range last {
			sum += v
		}
		if sum >= want {
			require.Equal(t, want, sum, "%s: counted more than once", what)
			return
		}
		i, v, _ := reflect.Select(cases)
		if i == len(sigs) {
			t.Fatalf("timed out waiting until %s: %d of %d", what, sum, want)
		}
		last[i] = max(last[i], v.Int())
	}
}

// startGroup starts a group and stops it when the test ends.
func (b *bundle) startGroup(t *testing.T, cfg GroupConfig) (*testGroup, *prometheus.Registry) {
	t.Helper()
	return b.startGroupWith(t, cfg, nil)
}

// startGroupWith is startGroup with prep run on the group before it starts
// (to set test hooks).
func (b *bundle) startGroupWith(t *testing.T, cfg GroupConfig, prep func(*Group)) (*testGroup, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g := NewGroup(cfg, b.engine.Maintenance(), b.rdb, b.log.With().Str("group", cfg.Owner).Logger(), reg)
	g.initSignals()
	if prep != nil {
		prep(g)
	}
	ctx, crash := context.WithCancelCause(b.ctx)
	t.Cleanup(func() { crash(nil) })
	require.NoError(t, g.Start(ctx))
	t.Cleanup(func() { stop(t, g) })
	return &testGroup{Group: g, crash: crash}, reg
}

// stop stops a service and waits for it (for a minute at most).
func stop(t *testing.T, s startstop.Service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.Stop(ctx))
}

func (b *bundle) product(t *testing.T, sku string, stock int) {
	t.Helper()
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: sku, Name: sku, Price: inventory.Money{Amount: 1000, Currency: "EUR"}, Stock: stock,
	})
	require.NoError(t, err)
}

// eventually polls cond until it holds; a condition, never a bare sleep.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until "+format, append([]any{timeout}, args...)...)
		}
		<-tick.C
	}
}

// waitDrained waits until the outbox is drained (b.drained), looking again
// each time one of the flushers signals that it caught up: only a
// flusher's pass can drain the outbox, and each pass that handled entries
// is followed by that signal once the flusher runs out of them.
func (b *bundle) waitDrained(t *testing.T, timeout time.Duration, what string, flushers ...*Flusher) {
	t.Helper()
	require.NotEmpty(t, flushers, "waitDrained needs the flushers that drain")
	signals := make([]any, len(flushers))
	for i, f := range flushers {
		signals[i] = f.caughtUp.C()
	}
	waitUntil(t, timeout, what, func() bool { return b.drained(t) }, signals...)
}

// waitUntil waits until cond holds, looking at it first and then each time
// one of the signals (testsignal channels of the loops whose work cond
// reads) delivers: never on a timer of its own. It fails the test after
// timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool, signals ...any) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)}}
	for _, c := range signals {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	for !cond() {
		if i, _, _ := reflect.Select(cases); i == 0 {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
	}
}

// drained reports whether every outbox stream's group has delivered and
// acknowledged everything the stream ever held.
func (b *bundle) drained(t *testing.T) bool {
	t.Helper()
	keys := b.engine.Keys()
	for p := range inventory.Partitions {
		info, err := b.rdb.XInfoStream(b.ctx, keys.Outbox(p)).Result()
		if err != nil {
			if isNoSuchKey(err) {
				continue
			}
			t.Fatalf("XINFO STREAM: %v", err)
		}
		groups, err := b.rdb.XInfoGroups(b.ctx, keys.Outbox(p)).Result()
		require.NoError(t, err)
		if len(groups) == 0 {
			return false
		}
		for _, g := range groups {
			if g.Pending > 0 || g.LastDeliveredID != info.LastGeneratedID {
				return false
			}
		}
	}
	return true
}

func isNoSuchKey(err error) bool {
	return err != nil && (errors.Is(err, redis.Nil) || err.Error() == "ERR no such key")
}

// stock reads a SKU's counters straight from Redis.
func (b *bundle) stock(t *testing.T, sku string) inventory.Stock {
	t.Helper()
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	require.NoError(t, err)
	return s
}

// reserveMany makes n holds of one unit each, concurrently, for the
// principals u0, u1, ..., and returns their tokens.
func (b *bundle) reserveMany(t *testing.T, sku string, n int, hold time.Duration) []string {
	t.Helper()
	return b.reserveManyAs(t, sku, "u", n, hold)
}

// reserveManyAs is reserveMany for the principals named who0, who1, ....
func (b *bundle) reserveManyAs(t *testing.T, sku, who string, n int, hold time.Duration) []string {
	t.Helper()
	tokens := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				r, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: fmt.Sprintf("%s%d", who, i)},
					inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: hold})
				if err != nil {
					errs <- err
					continue
				}
				tokens[i] = r.Token
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return tokens
}

// metric sums a family's counters and gauges (or histogram sample counts)
// in a registry.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func percentile(ds []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*q+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// ledgerCounts counts movements by kind, with and without duplicates.
func (b *bundle) movements(t *testing.T) (total, distinct int, byKind map[string]int) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT event_id) FROM stock_movements`).Scan(&total, &distinct))
	rows, err := b.pool.Query(b.ctx, `SELECT kind, count(*) FROM stock_movements GROUP BY kind`)
	require.NoError(t, err)
	defer rows.Close()
	byKind = map[string]int{}
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		byKind[k] = n
	}
	require.NoError(t, rows.Err())
	return total, distinct, byKind
}

func itoa(i int) string { return fmt.Sprint(i) }

// requireLedgerMatchesRedis checks that Postgres and Redis agree on a SKU:
// sold and held counts, and every hold's status.
func (b *bundle) requireLedgerMatchesRedis(t *testing.T, sku string, tokens []string) {
	t.Helper()
	s := b.stock(t, sku)
	var sold, held int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT sold FROM products WHERE sku = $1`, sku).Scan(&sold))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(quantity), 0) FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku).Scan(&held))
	require.Equal(t, s.Sold, sold, "sold in Redis and Postgres")
	require.Equal(t, s.Held, held, "held in Redis and Postgres")
	require.Equal(t, s.Total, s.Available+s.Held+s.Sold)
	p := inventory.PartitionOf(sku)
	for _, tok := range tokens {
		if tok == "" {
			continue
		}
		st, err := b.rdb.HGet(b.ctx, b.engine.Keys().Hold(p, tok), "st").Result()
		require.NoError(t, err, "hold %s in Redis", tok)
		var status string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM reservations WHERE token = $1`, tok).Scan(&status), "reservation %s in Postgres", tok)
		require.Equal(t, st, status, "status of %s", tok)
	}
}
