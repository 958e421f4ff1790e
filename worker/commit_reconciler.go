package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
)

// CommitReconcilerConfig tunes the commit reconciler. Zero values take the
// defaults named on each field.
type CommitReconcilerConfig struct {
	Options
	// Interval is the time between passes; default 5 seconds.
	Interval time.Duration
	// OlderThan is how long a commit must have been COMMITTING before it is
	// judged; default 30 seconds. It must exceed the engine's CommitTimeout,
	// or a commit still writing to Postgres could be rolled back under it:
	// a smaller value is raised to CommitTimeout + 1 second.
	OlderThan time.Duration
	// BatchSize is the most commits settled per ReconcileCommits call;
	// default 100. Full batches repeat within a pass.
	BatchSize int
	// ProductBatchSize is the most lagging products (of all partitions)
	// looked at per pass by ReapplyProducts; default 1000.
	ProductBatchSize int
	// OverdueGrace is how long past its expiry a hold the ledger has as HELD
	// waits before the overdue pass closes it (Redis does not have it) or
	// records its ending from Redis (Redis ended it); the sweeper and the
	// write-behind settle every other hold well within it. Default 30
	// seconds.
	OverdueGrace time.Duration
}

func (c *CommitReconcilerConfig) setDefaults(commitTimeout time.Duration) {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.OlderThan <= 0 {
		c.OlderThan = 30 * time.Second
	}
	if c.OlderThan <= commitTimeout {
		c.OlderThan = commitTimeout + time.Second
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.ProductBatchSize <= 0 {
		c.ProductBatchSize = 1000
	}
	if c.OverdueGrace <= 0 {
		c.OverdueGrace = 30 * time.Second
	}
}

// CommitReconciler finishes commits a crash or an unknown Postgres outcome
// left COMMITTING: the engine asks Postgres whether the sale exists and marks
// the hold COMMITTED, or puts it back to HELD with its original expiry. In
// the same pass it re-applies product changes (restocks, limits, sale
// windows) that committed in Postgres but never reached Redis, so Redis
// converges within one Interval of Redis answering again. Partitions are
// owned through leases. Each settlement or apply is a guarded Redis script,
// and its only Postgres writes are the mark that a product reached Redis and
// the endings of overdue holds (below), idempotent on their event ids, so a
// duplicate reconciler cannot corrupt anything; the lease only saves work.
//
// Each pass also closes the partition's overdue holds: ones the ledger has as
// HELD more than OverdueGrace past their expiry
// (inventory.Maintenance.CloseOverdueHolds). One Redis does not have in its SKU's
// current generation is closed as EXPIRED; one Redis has ended there
// (EXPIRED or CANCELLED) has its ending, whose event never reached the
// ledger, recorded as Redis has it. Either ending is written to the ledger
// by the pass itself, exactly once; a hold Redis has as HELD or being
// committed is never touched.
type CommitReconciler struct {
	*service
	cfg       CommitReconcilerConfig
	engine    *inventory.Maintenance
	leases    *leaseSet
	settled   prometheus.Counter
	reapplied prometheus.Counter
	closed    prometheus.Counter
	// commitsSettled and holdsClosed signal, to a test, the half-done
	// commits this reconciler has settled and the overdue holds it has
	// closed so far (running totals), once they are counted.
	commitsSettled testsignal.Signal[int64]
	settledTotal   atomic.Int64
	holdsClosed    testsignal.Signal[int64]
	closedTotal    atomic.Int64
}

// NewCommitReconciler builds a reconciler; Start runs it.
func NewCommitReconciler(cfg CommitReconcilerConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *CommitReconciler {
	cfg.setDefaults(engine.Config().CommitTimeout)
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &CommitReconciler{
		cfg: cfg, engine: engine,
		leases: newLeaseSet("reconciler", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		settled: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_commits_reconciled_total",
			Help: "Half-done commits the reconciler settled (committed or put back to HELD).",
		})),
		reapplied: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_products_reapplied_total",
			Help: "Product changes committed in Postgres that the reconciler re-applied to Redis because their own Redis step had failed.",
		})),
		closed: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_overdue_holds_closed_total",
			Help: "Holds the ledger had as HELD past their expiry that Redis did not have (closed as EXPIRED) or had ended without the ledger hearing of it (recorded as Redis ended them).",
		})),
	}
	w.service = newService("commit_reconciler", cfg.Options, log, reg, w.leases, w.run)
	return w
}

func (w *CommitReconciler) run(ctx context.Context) error {
	return w.leases.everyTick(ctx, w.cfg.Interval, w.reconcile)
}

func (w *CommitReconciler) reconcile(ctx context.Context, p int) error {
	// The lease is checked before each call: a reconciler that lost its
	// partition stops at once rather than racing the new owner.
	for ctx.Err() == nil && w.leases.Held(p) {
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		n, err := w.engine.ReconcileCommits(sctx, p, w.cfg.OlderThan, w.cfg.BatchSize)
		cancel()
		w.settled.Add(float64(n))
		if n > 0 {
			w.commitsSettled.Signal(w.settledTotal.Add(int64(n)))
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reconciling partition %d: %w", p, err)
		}
		if n < w.cfg.BatchSize {
			break
		}
	}
	if ctx.Err() != nil || !w.leases.Held(p) {
		return nil
	}
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	n, err := w.engine.ReapplyProducts(sctx, p, w.cfg.ProductBatchSize)
	cancel()
	w.reapplied.Add(float64(n))
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("re-applying products of partition %d: %w", p, err)
	}
	if ctx.Err() != nil || !w.leases.Held(p) {
		return nil
	}
	sctx, cancel = stepContext(ctx, w.cfg.StepTimeout)
	n, err = w.engine.CloseOverdueHolds(sctx, p, w.cfg.OverdueGrace, w.cfg.BatchSize)
	cancel()
	w.closed.Add(float64(n))
	if n > 0 {
		w.holdsClosed.Signal(w.closedTotal.Add(int64(n)))
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("closing overdue holds of partition %d: %w", p, err)
	}
	return nil
}
