package bench_test

import (
	"context"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/bench/flashsale"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Concurrency is how many goroutines every contender gets (b.SetParallelism
// is per GOMAXPROCS, so it is set from this).
const Concurrency = 32

// benchStock never runs out during a benchmark: every operation is a
// successful reservation, the expensive case.
const benchStock = 1_000_000_000

const benchSecret = "bench-secret-0123456789abcdef-0123456789"

// fixture is one running Dropline (HTTP server, engine, worker group) on a
// database and key prefix of its own.
type fixture struct {
	ctx     context.Context
	app     *app.App
	engine  *inventory.Engine
	rdb     redis.UniversalClient
	dbURL   string
	client  *flashsale.Client
	bearers []string
	admin   inventory.Principal
}

// setup starts Dropline in-process, wired as `dropline serve` wires it, with
// its mutation rate limit switched off (DROPLINE_MUTATION_RATE=-1): the
// benchmark is one client hammering as few principals as it likes, which the
// production limit (10/s per principal) would refuse.
func setup(b *testing.B) *fixture {
	b.Helper()
	f := &fixture{ctx: context.Background(), admin: inventory.Principal{ID: "bench-admin", Admin: true}}
	f.dbURL = testenv.NewDatabase(b)
	prefix := testenv.Redis(b).Prefix

	cfg := config.Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL = f.dbURL
	if v := os.Getenv("REDIS_URL"); v != "" {
		cfg.RedisURL = v
	}
	cfg.JWTSecret = benchSecret
	cfg.KeyPrefix = prefix
	cfg.MutationRate = -1
	require.NoError(b, cfg.Validate())
	a := app.New(cfg, zerolog.Nop())
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b, a.Start(ctx))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	f.app, f.rdb = a, a.Redis()
	// The engine-level benchmarks call the same Redis and Postgres directly.
	eng, err := inventory.NewEngine(f.ctx, inventory.Config{KeyPrefix: prefix}, a.Redis(), a.Postgres(), zerolog.Nop())
	require.NoError(b, err)
	f.engine = eng
	f.client = flashsale.NewClient("http://"+a.Addr()+"/graphql", Concurrency, 10*time.Second)
	b.Cleanup(f.client.Close)

	// Distinct principals, as in a drop; a thousand is enough for the
	// per-user keys to be spread.
	iss, err := auth.NewIssuer([]byte(benchSecret))
	require.NoError(b, err)
	for i := range 1000 {
		tok, err := iss.Mint(fmt.Sprintf("buyer-%d", i), false, time.Hour)
		require.NoError(b, err)
		f.bearers = append(f.bearers, tok)
	}
	return f
}

// product creates SKUs with benchStock units each.
func (f *fixture) product(b *testing.B, skus ...string) {
	b.Helper()
	for _, sku := range skus {
		_, err := f.engine.Catalog().CreateProduct(f.ctx, f.admin, inventory.ProductInput{
			SKU: sku, Name: sku, Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: benchStock,
		})
		require.NoError(b, err)
	}
}

// graphqlReserve is one reserve through GraphQL over HTTP.
func (f *fixture) graphqlReserve(i int64, sku string) error {
	_, ue, err := f.client.Reserve(f.ctx, f.bearers[i%int64(len(f.bearers))], flashsale.ReserveInput{SKU: sku, Quantity: 1})
	if err == nil && ue != nil {
		err = fmt.Errorf("%s: %s", ue.Code, ue.Message)
	}
	return err
}

// engineReserve is one reserve through the engine, in-process.
func (f *fixture) engineReserve(i int64, sku string) error {
	_, err := f.engine.Reserve(f.ctx, inventory.Principal{ID: fmt.Sprintf("buyer-%d", i%1000)},
		inventory.ReserveRequest{SKU: sku, Quantity: 1})
	return err
}

// tokenEncoding matches the engine's token alphabet.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// tokenFor returns a well-formed reservation token in partition p, unique
// per (run, n).
func tokenFor(p int, run int64, n int64) string {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(run))
	binary.BigEndian.PutUint64(raw[8:], uint64(n))
	return fmt.Sprintf("r%02d.%s", p, tokenEncoding.EncodeToString(raw[:]))
}

// Measurement is one contender's figures from its final (largest) run.
type Measurement struct {
	Ops       int
	PerSecond float64
	P50, P99  time.Duration
}

// results collects Measurements by name across the sub-benchmarks of one
// top-level benchmark; each sub-benchmark's last run overwrites its entry.
type results struct {
	mu sync.Mutex
	m  map[string]Measurement
}

func newResults() *results { return &results{m: map[string]Measurement{}} }

// measure runs op b.N times on Concurrency goroutines, timing each call,
// reports ops/s, p50 and p99 as benchmark metrics and records them as name.
func (r *results) measure(b *testing.B, name string, op func(i int64) error) {
	b.Helper()
	b.SetParallelism(max(1, Concurrency/runtime.GOMAXPROCS(0)))
	var mu sync.Mutex
	var all []time.Duration
	var seq atomic.Int64
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			i := seq.Add(1)
			t0 := time.Now()
			if err := op(i); err != nil {
				b.Error(err)
				return
			}
			local = append(local, time.Since(t0))
		}
		mu.Lock()
		all = append(all, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(all)
	m := Measurement{Ops: len(all), PerSecond: float64(len(all)) / elapsed.Seconds(),
		P50: flashsale.Percentile(all, 0.5), P99: flashsale.Percentile(all, 0.99)}
	b.ReportMetric(m.PerSecond, "ops/s")
	b.ReportMetric(float64(m.P50)/1e6, "p50-ms")
	b.ReportMetric(float64(m.P99)/1e6, "p99-ms")
	r.mu.Lock()
	r.m[name] = m
	r.mu.Unlock()
}

// record stores a measurement taken some other way.
func (r *results) record(name string, m Measurement) {
	r.mu.Lock()
	r.m[name] = m
	r.mu.Unlock()
}

// table prints the contenders and the ratios of each against base.
func (r *results) table(title, base string, names ...string) {
	r.tableOf(title, base, true, names...)
}

// tableOf is table; latencyRatio false omits the p99 ratio where the
// latencies measure different things (a batch against one request).
func (r *results) tableOf(title, base string, latencyRatio bool, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n== %s (concurrency %d) ==\n", title, Concurrency)
	fmt.Fprintf(&b, "%-28s %12s %10s %10s %14s %12s\n", "contender", "ops/s", "p50 ms", "p99 ms", "throughput ×", "p99 ×")
	bm, ok := r.m[base]
	for _, n := range names {
		m, have := r.m[n]
		if !have {
			continue
		}
		tr, pr := "-", "-"
		if ok && bm.PerSecond > 0 && bm.P99 > 0 {
			tr = fmt.Sprintf("%.2f", m.PerSecond/bm.PerSecond)
			if latencyRatio {
				pr = fmt.Sprintf("%.2f", float64(m.P99)/float64(bm.P99))
			}
		}
		fmt.Fprintf(&b, "%-28s %12.0f %10.2f %10.2f %14s %12s\n", n, m.PerSecond, float64(m.P50)/1e6, float64(m.P99)/1e6, tr, pr)
	}
	fmt.Fprintf(&b, "(ratios against %s)\n", base)
	fmt.Print(b.String())
}

// dbPool opens a pool on the fixture's database.
func dbPool(b *testing.B, url string, conns int32) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// summarise turns per-operation latencies into a Measurement of ops
// operations over elapsed.
func summarise(lat []time.Duration, ops int, elapsed time.Duration) Measurement {
	slices.Sort(lat)
	return Measurement{Ops: ops, PerSecond: float64(ops) / elapsed.Seconds(),
		P50: flashsale.Percentile(lat, 0.5), P99: flashsale.Percentile(lat, 0.99)}
}
