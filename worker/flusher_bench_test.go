package worker

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/machine"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// BenchmarkFlusherApply measures what the write-behind costs per event: the
// flusher's apply of one batch (the fenced transaction, telling Redis of
// rebuilt SKUs, the acknowledgement: what dropline_writebehind_batch_duration_seconds
// times) of reserve events of one hot SKU, read from the outbox the real
// reserve path wrote. The outbox is filled before the timer starts; each
// iteration reads one batch (untimed, as the busy time leaves it out) and
// applies it. It reports events per second of apply time, and the CPU
// time per event of this process and of its Postgres backends (from /proc):
// the rest of the wall time is waiting (round trips, the commit's WAL flush).
//
//	go test -run '^$' -bench BenchmarkFlusherApply -benchtime 40x -count 3 ./worker/
//
// A batch of fresh holds is committed unflushed and acknowledged by a later
// one, once durable (flusher_unflushed.go); the checks that acknowledge
// what is left after the last batch are timed too. The -synchronous
// variants commit every batch durably and acknowledge it at once
// (FlusherConfig.SynchronousCommit), as before.
func BenchmarkFlusherApply(b *testing.B) {
	for _, size := range []int{500, 100, 25} {
		for _, synchronous := range []bool{false, true} {
			name := fmt.Sprintf("reserve-batch-%d", size)
			if synchronous {
				name += "-synchronous"
			}
			b.Run(name, func(b *testing.B) {
				benchApply(b, size, 0, synchronous)
			})
		}
	}
}

// BenchmarkFlusherApplyLarge is BenchmarkFlusherApply's batch of 500 on a
// ledger that already has ledgerRows reservations and movements of earlier
// holds (random tokens, 3,000 buyers), as it has during bench-http's peak:
// the indexes are then larger than PostgreSQL's buffers, not a few pages.
//
//	go test -run '^$' -bench BenchmarkFlusherApplyLarge -benchtime 100x ./worker/
func BenchmarkFlusherApplyLarge(b *testing.B) {
	benchApply(b, 500, 600_000, false)
}

func benchApply(b *testing.B, size, ledgerRows int, synchronous bool) {
	env := testenv.Redis(b)
	pool := testenv.Postgres(b)
	ctx := context.Background()
	engine, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: env.Prefix}, env.Client, pool, zerolog.Nop())
	require.NoError(b, err)
	const sku = "BENCH-WB"
	_, err = engine.Catalog().CreateProduct(ctx, admin, inventory.ProductInput{
		SKU: sku, Name: sku, Price: inventory.Money{Amount: 1000, Currency: "EUR"}, Stock: 1_000_000_000,
	})
	require.NoError(b, err)
	p := inventory.PartitionOf(sku)
	if ledgerRows > 0 {
		prefillLedger(ctx, b, pool, sku, ledgerRows)
	}

	// The outbox, filled by the reserve path before the timer starts.
	total := size * b.N
	next := make(chan int, total)
	for i := range total {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				_, err := engine.Reserve(ctx, inventory.Principal{ID: "buyer-" + strconv.Itoa(i%3000)},
					inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Hour})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}

	opts := Options{Owner: "bench", LeaseTTL: time.Minute}
	reg := prometheus.NewRegistry()
	f := NewFlusher(FlusherConfig{Options: opts, BatchSize: size, SynchronousCommit: synchronous}, engine.Maintenance(), env.Client, zerolog.Nop(), reg)
	lease := f.leases.leases[p]
	ok, err := lease.Acquire(ctx)
	require.NoError(b, err)
	require.True(b, ok, "the flusher lease of partition %d", p)

	backends := postgresBackends(ctx, b, pool)
	var busy time.Duration
	applied := 0
	var cpu, pg time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		_, err := lease.Renew(ctx)
		require.NoError(b, err)
		entries, err := f.outbox.Read(ctx, p, size)
		require.NoError(b, err)
		require.Len(b, entries, size)
		runtime.GC() // the reserves' garbage is not the apply's
		pids := backends()
		cpu0, pg0 := machine.SelfCPU(), machine.CPUByPid(pids)
		b.StartTimer()
		t0 := time.Now()
		n, err := f.apply(ctx, p, entries)
		busy += time.Since(t0)
		b.StopTimer()
		cpu, pg = cpu+machine.SelfCPU()-cpu0, pg+machine.CPUSince(pg0, machine.CPUByPid(pids))
		b.StartTimer()
		require.NoError(b, err)
		require.Equal(b, size, n)
		applied += n
	}
	// What the last batches left unacknowledged: the checks are timed,
	// the waits for the WAL writer between them are not.
	var st partitionState
	for f.hasUnflushed() {
		b.StopTimer()
		time.Sleep(5 * time.Millisecond)
		cpu0, pg0 := machine.SelfCPU(), machine.CPUByPid(backends())
		b.StartTimer()
		t0 := time.Now()
		_, err := f.ackFlushed(ctx, p, &st)
		busy += time.Since(t0)
		b.StopTimer()
		cpu, pg = cpu+machine.SelfCPU()-cpu0, pg+machine.CPUSince(pg0, machine.CPUByPid(backends()))
		b.StartTimer()
		require.NoError(b, err)
		require.False(b, st.ownPending, "a batch's session ended")
	}
	b.StopTimer()
	pending, err := env.Client.XPending(ctx, engine.Keys().Outbox(p), "dropline").Result()
	require.NoError(b, err)
	require.Zero(b, pending.Count, "every batch acknowledged")
	byBatch := testutil.ToFloat64(f.m.durable.WithLabelValues("batch"))
	byCheck := testutil.ToFloat64(f.m.durable.WithLabelValues("check"))
	var held int
	require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku).Scan(&held))
	require.Equal(b, total+ledgerRows, held, "every hold in the ledger once")
	b.ReportMetric(float64(applied)/busy.Seconds(), "events/s")
	b.ReportMetric(float64(busy.Microseconds())/float64(applied), "µs/event")
	b.ReportMetric(float64(cpu.Microseconds())/float64(applied), "go-cpu-µs/event")
	b.ReportMetric(float64(pg.Microseconds())/float64(applied), "pg-cpu-µs/event")
	b.ReportMetric(float64(busy.Microseconds())/float64(b.N)/1000, "ms/batch")
	b.ReportMetric(byBatch, "acked-by-batch")
	b.ReportMetric(byCheck, "acked-by-check")
}

// prefillLedger writes n reservations and their reserve movements of sku,
// as the write-behind writes them, with random tokens of the engine's shape
// and 3,000 buyers, then checkpoints so that the timed batches start as a
// running server's do.
func prefillLedger(ctx context.Context, b *testing.B, pool *pgxpool.Pool, sku string, n int) {
	b.Helper()
	_, err := pool.Exec(ctx, `
		INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
		SELECT 'r' || lpad((i % 16)::text, 2, '0') || '.' || substr(md5(random()::text) || md5(random()::text), 1, 26),
			$1, 'buyer-' || (i % 3000), 1, 'HELD', now() + interval '1 hour', now() - interval '1 hour' + i * interval '1 microsecond'
		FROM generate_series(1, $2) AS i`, sku, n)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at)
		SELECT 'reserve:' || token, sku, 'reserve', token, principal, quantity, created_at FROM reservations WHERE sku = $1`, sku)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE reservations`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE stock_movements`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(b, err)
}

// postgresBackends returns a function listing the process ids of the
// Postgres backends connected to pool's database, looked up when called (the
// pool may open connections as it goes).
func postgresBackends(ctx context.Context, b *testing.B, pool *pgxpool.Pool) func() []int {
	return func() []int {
		rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
		require.NoError(b, err)
		var pids []int
		for rows.Next() {
			var pid int
			require.NoError(b, rows.Scan(&pid))
			pids = append(pids, pid)
		}
		require.NoError(b, rows.Err())
		return pids
	}
}
