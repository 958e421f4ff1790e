package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/inventory"
)

// HoldSweeperConfig tunes the hold sweeper. Zero values take the defaults
// named on each field.
type HoldSweeperConfig struct {
	Options
	// Interval is the time between sweeps; default 100 milliseconds. It is
	// most of the delay between a hold's expiresAt and its units coming back
	// (G5 asks for under one second).
	Interval time.Duration
	// BatchSize is how many due holds one ExpireDue call releases (one
	// pipelined round trip); default 500. A sweep repeats full batches until
	// none is due.
	BatchSize int
}

func (c *HoldSweeperConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
}

// HoldSweeper releases holds whose expiry has passed. It walks the
// partitions' expiry indexes (never keyspace notifications, which Redis may
// drop) and releases each due hold through the engine's idempotent release
// script, so a hold raced by a cancel, a commit or a second sweeper is
// released at most once. Partitions are owned through leases, so several
// processes split the sweeping; a duplicate sweep only wastes a round trip.
type HoldSweeper struct {
	*service
	cfg     HoldSweeperConfig
	engine  *inventory.Engine
	leases  *leaseSet
	delay   prometheus.Histogram
	expired prometheus.Counter
}

// NewHoldSweeper builds a sweeper; Start runs it.
func NewHoldSweeper(cfg HoldSweeperConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *HoldSweeper {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &HoldSweeper{
		cfg: cfg, engine: engine,
		leases: newLeaseSet("sweeper", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		delay: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_hold_release_delay_seconds",
			Help:    "Time from a hold's expiresAt to its units being available again, per hold released by the sweeper.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10},
		})),
		expired: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_holds_expired_total",
			Help: "Holds released by the expiry sweeper.",
		})),
	}
	w.service = newService("hold_sweeper", cfg.Options, log, reg, w.run)
	return w
}

// Stop stops the sweeper, waits for it, and releases its partition leases so
// another process takes over at once.
func (w *HoldSweeper) Stop() {
	w.service.Stop()
	w.leases.releaseAll(context.Background())
}

func (w *HoldSweeper) run(ctx context.Context) error {
	return w.leases.everyTick(ctx, w.cfg.Interval, w.sweep)
}

// sweep releases partition p's due holds, batch after batch, until a batch
// comes back short.
func (w *HoldSweeper) sweep(ctx context.Context, p int) error {
	for ctx.Err() == nil && w.leases.Held(p) {
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		out, err := w.engine.ExpireDue(sctx, p, w.cfg.BatchSize)
		cancel()
		for _, e := range out {
			w.delay.Observe(max(e.Delay, 0).Seconds())
		}
		w.expired.Add(float64(len(out)))
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
