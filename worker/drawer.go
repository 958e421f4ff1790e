package worker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
)

// DrawerConfig tunes the drawer. Zero values take the defaults named on
// each field.
type DrawerConfig struct {
	Options
	// Interval is the time between looks for due draws; default 250
	// milliseconds, most of the delay between a draw's closesAt and its
	// result.
	Interval time.Duration
	// DrawTimeout bounds one draw, decided and carried to Redis; default 60
	// seconds (100,000 entries take a few seconds).
	DrawTimeout time.Duration
}

func (c *DrawerConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.DrawTimeout <= 0 {
		c.DrawTimeout = 60 * time.Second
	}
}

// Drawer runs the draws whose entries have closed (inventory.Engine.RunDraw)
// and finishes the ones a crash left half carried over to Redis. Each draw
// is run by the holder of its SKU's partition lease ("drawer"), which only
// saves work: the draw itself is one Postgres transaction under the
// product's row lock that finds the draw OPEN, so it happens once even if
// two processes run it, and each batch carried to Redis checks the progress
// it moves, so none is applied twice. When the lease holder dies, another
// process takes the partition after LeaseTTL and resumes.
type Drawer struct {
	*service
	cfg    DrawerConfig
	engine *inventory.Maintenance
	leases *leaseSet
	drawn  prometheus.Counter
	// done signals, to a test, each SKU whose draw this drawer finished.
	done testsignal.Signal[string]
}

// NewDrawer builds a drawer; Start runs it.
func NewDrawer(cfg DrawerConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Drawer {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &Drawer{
		cfg: cfg, engine: engine,
		leases: newLeaseSet("drawer", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		drawn: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_draws_total",
			Help: "Draws this process drew and carried to Redis.",
		})),
	}
	w.service = newService("drawer", cfg.Options, log, reg, w.leases, w.run)
	return w
}

func (w *Drawer) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.leases.run(gctx) })
	g.Go(func() error {
		t := time.NewTicker(w.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
			}
			w.pass(gctx)
		}
	})
	return g.Wait()
}

// pass runs every due draw of the partitions this process holds.
func (w *Drawer) pass(ctx context.Context) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	due, err := w.engine.DueDraws(sctx, 100)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("listing due draws (retried next pass)")
		}
		return
	}
	for _, sku := range due {
		if !w.leases.Held(w.engine.Keys().PartitionOf(sku)) {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, w.cfg.DrawTimeout)
		began := time.Now()
		rep, err := w.engine.Engine().Draws().RunDraw(dctx, sku)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Str("sku", sku).Msg("running a draw (resumed next pass)")
			}
			continue
		}
		w.drawn.Inc()
		w.log.Info().Str("sku", sku).Int("entries", rep.Draw.Entries).Int("winners", rep.Draw.Winners).
			Bool("drew", rep.Drew).Dur("took", time.Since(began)).Msg("draw done")
		w.done.Signal(sku)
	}
}
