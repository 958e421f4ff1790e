package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
)

// HoldSweeperConfig tunes the hold sweeper. Zero values take the defaults
// named on each field.
type HoldSweeperConfig struct {
	Options
	// Interval is the time between sweeps of the partitions this process
	// holds the lease of; default 100 milliseconds. It is most of the delay
	// between a hold's expiresAt and its units coming back (the contract asks
	// for under one second).
	Interval time.Duration
	// BatchSize is how many due holds one ExpireDue call releases (one
	// pipelined round trip); default 500. A sweep repeats full batches until
	// none is due.
	BatchSize int
	// LateAfter is how far past due the oldest hold of a partition this
	// process does not hold may be before the process sweeps that partition
	// anyway, without the lease (its owner died, or is stalled); default 250
	// milliseconds. A negative value turns the late sweep off, and expiry in
	// a dead process's partitions then waits for its lease to expire
	// (LeaseTTL).
	LateAfter time.Duration
	// LateInterval is how often the partitions this process does not hold
	// are checked for overdue holds; default 250 milliseconds. With
	// LateAfter, it bounds the release delay while any process lives:
	// about LateAfter + LateInterval (+ the sweep itself).
	LateInterval time.Duration
}

func (c *HoldSweeperConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.LateAfter == 0 {
		c.LateAfter = 250 * time.Millisecond
	}
	if c.LateInterval <= 0 {
		c.LateInterval = 250 * time.Millisecond
	}
}

// HoldSweeper releases holds whose expiry has passed. It walks the
// partitions' expiry indexes (never keyspace notifications, which Redis may
// drop) and releases each due hold through the engine's idempotent release
// script, so a hold raced by a cancel, a commit or a second sweeper is
// released at most once.
//
// Partitions are owned through leases, so several processes split the
// sweeping. The lease only saves work, and it must not make expiry wait for
// a dead owner's lease to run out (LeaseTTL, 10 s by default): every
// LateInterval each process reads the oldest entry of the expiry index of
// every partition it does not hold (one ZRANGE ... LIMIT 0 1 per partition,
// pipelined), and sweeps without the lease any partition whose oldest hold
// is more than LateAfter past due. While the owner lives and keeps up, that
// never happens; when it dies, its partitions' holds are still released
// within LateAfter + LateInterval of their expiresAt by any live process. A
// duplicate sweep only wastes a round trip: the release script checks that
// a hold is due and HELD, and releases it once.
type HoldSweeper struct {
	*service
	cfg       HoldSweeperConfig
	engine    *inventory.Maintenance
	leases    *leaseSet
	delay     prometheus.Histogram
	expired   prometheus.Counter
	late      prometheus.Counter
	abandoned prometheus.Counter
	// walkOffers counts the offers the walk sweep made.
	walkOffers prometheus.Counter
	// swept signals, to a test, the holds this sweeper has released so far
	// (a running total), once they are counted.
	swept testsignal.Signal[int64]
	total atomic.Int64
}

// NewHoldSweeper builds a sweeper; Start runs it.
func NewHoldSweeper(cfg HoldSweeperConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *HoldSweeper {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &HoldSweeper{
		cfg: cfg, engine: engine,
		leases: newLeaseSet("sweeper", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		delay: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_hold_release_delay_seconds",
			Help:    "Time from a hold's expiresAt to its units being available again, per hold released by the sweeper.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10},
		})),
		expired: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_holds_expired_total",
			Help: "Holds released by the expiry sweeper.",
		})),
		late: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_hold_late_sweeps_total",
			Help: "Sweeps of a partition this process does not hold the lease of, because its oldest hold was more than LateAfter past due (its owner died or stalled).",
		})),
		abandoned: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_carts_abandoned_total",
			Help: "Carts left unfinished past their deadline (their caller died or stalled mid-way) whose lines the cart sweep let go.",
		})),
		walkOffers: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_waitlist_walk_offers_total",
			Help: "Waitlist offers made by the walk sweep, continuing walks a release's bounded run left unfinished.",
		})),
	}
	w.service = newService("hold_sweeper", cfg.Options, log, reg, w.leases, w.run)
	return w
}

func (w *HoldSweeper) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.leases.everyTick(gctx, w.cfg.Interval, w.sweep) })
	if w.cfg.LateAfter > 0 {
		g.Go(func() error { w.lateLoop(gctx); return nil })
	}
	g.Go(func() error { w.cartLoop(gctx); return nil })
	g.Go(func() error { w.walkLoop(gctx); return nil })
	return g.Wait()
}

// walkLoop is the walk sweep: every Interval it takes each SKU's unfinished
// waitlist walk (a queue too long to walk in one bounded script run) on to
// its end (inventory.Engine.ContinueWalks), so the waiters beyond where a
// release's run stopped get their offers about one Interval later. Like the
// cart sweep it takes no lease (one pipelined read of every partition's
// walks per tick; every run atomic), so it does not wait for a dead owner's
// lease. Its failures are logged; it runs until ctx ends.
func (w *HoldSweeper) walkLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		n, err := w.engine.ContinueWalks(sctx, w.cfg.BatchSize)
		cancel()
		w.walkOffers.Add(float64(n))
		if err != nil && ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("continuing unfinished waitlist walks failed; trying again")
		}
	}
}

// cartLoop is the cart sweep: every Interval it lets go of carts whose
// caller died or stalled between holding their lines and recording the
// outcome (inventory.Maintenance.AbandonStaleCarts). It takes no lease: one
// pipelined read of every partition's pending carts per tick, and every
// step idempotent, so it does not wait for a dead owner's lease, and the
// units of an unfinished cart are back within its deadline plus about one
// Interval while any process lives. Its failures are logged; it runs until
// ctx ends.
func (w *HoldSweeper) cartLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Each call takes about BatchSize lines (carts of up to 50 lines,
		// one pipelined round trip for their lines), so a step never
		// outgrows its timeout however many carts fall due together; the
		// loop goes on at once while carts are left.
		for more := true; more && ctx.Err() == nil; {
			sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
			var n int
			var err error
			n, more, err = w.engine.SweepCarts(sctx, w.cfg.BatchSize, max(1, w.cfg.BatchSize/inventory.MaxCartLines))
			cancel()
			w.abandoned.Add(float64(n))
			if err != nil {
				if ctx.Err() == nil {
					w.log.Warn().Err(err).Msg("letting go of unfinished carts failed; trying again")
				}
				break
			}
		}
	}
}

// sweep releases partition p's due holds while this process holds its lease.
func (w *HoldSweeper) sweep(ctx context.Context, p int) error {
	return w.release(ctx, p, func() bool { return w.leases.Held(p) })
}

// release releases partition p's due holds, batch after batch, until a
// batch comes back short or keep says stop.
func (w *HoldSweeper) release(ctx context.Context, p int, keep func() bool) error {
	for ctx.Err() == nil && keep() {
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		out, err := w.engine.ExpireDue(sctx, p, w.cfg.BatchSize)
		cancel()
		for _, e := range out {
			w.delay.Observe(max(e.Delay, 0).Seconds())
		}
		w.expired.Add(float64(len(out)))
		if len(out) > 0 {
			w.swept.Signal(w.total.Add(int64(len(out))))
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sweeping partition %d: %w", p, err)
		}
		if len(out) < w.cfg.BatchSize {
			return nil
		}
	}
	return nil
}

// lateLoop checks, every LateInterval, the partitions this process does not
// hold, and sweeps those whose holds are overdue. Its failures are logged;
// it runs until ctx ends.
func (w *HoldSweeper) lateLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.LateInterval)
	defer t.Stop()
	var late [inventory.Partitions]bool // partitions being swept late now, for the log
	var failing [inventory.Partitions]partitionBackoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		overdue, err := w.overdue(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("checking other partitions for overdue holds failed; trying again")
			}
			continue
		}
		for p := range inventory.Partitions {
			by, ok := overdue[p]
			if !ok || w.leases.Held(p) {
				if late[p] {
					late[p] = false
					w.log.Info().Int("partition", p).Msg("partition's holds are released on time again")
				}
				continue
			}
			if !failing[p].due() {
				continue
			}
			if !late[p] {
				late[p] = true
				w.log.Warn().Int("partition", p).Dur("overdue", by).
					Msg("partition's due holds are overdue and its sweeper lease is elsewhere (owner dead or stalled); sweeping it without the lease")
			}
			w.late.Inc()
			err := w.release(ctx, p, func() bool { return !w.leases.Held(p) })
			if ctx.Err() != nil {
				return
			}
			w.leases.settle(p, &failing[p], err)
		}
	}
}

// overdue returns, for each partition this process does not hold whose
// oldest hold is more than LateAfter past due, how far past due it is. The
// expiry index is read through the engine (OldestHolds), on Redis' clock.
func (w *HoldSweeper) overdue(ctx context.Context) (map[int]time.Duration, error) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	defer cancel()
	var others []int
	for p := range inventory.Partitions {
		if !w.leases.Held(p) {
			others = append(others, p)
		}
	}
	now, oldest, err := w.engine.OldestHolds(sctx, others)
	if err != nil {
		return nil, err
	}
	out := map[int]time.Duration{}
	for p, due := range oldest {
		if by := now.Sub(due); by > w.cfg.LateAfter {
			out[p] = by
		}
	}
	return out, nil
}
