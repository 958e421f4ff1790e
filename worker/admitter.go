package worker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// AdmitterConfig tunes the admission ticker. Zero values take the defaults
// named on each field.
type AdmitterConfig struct {
	Options
	// Interval is the time between admission steps of each queue; default
	// 250 milliseconds, so a queue's waiters learn of a change (SOLD_OUT
	// among them) well within a second.
	Interval time.Duration
	// ListEvery is how often the list of queues is read from the ledger;
	// default 2 seconds (a new queue starts being stepped within it).
	ListEvery time.Duration
}

func (c *AdmitterConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.ListEvery <= 0 {
		c.ListEvery = 2 * time.Second
	}
}

// Admitter is the admission ticker: every Interval it runs one admission
// step (queue.Service.Step) of every queue in the partitions whose
// "admitter" lease this process holds, so each queue is stepped by one
// instance at a time. The lease only saves work: a step admits nothing the
// rate and the stock do not allow, so two steppers during a handover admit
// no more than one would over the same time. When the holder dies another
// process takes its partitions after LeaseTTL.
type Admitter struct {
	*service
	cfg      AdmitterConfig
	queues   *queue.Service
	leases   *leaseSet
	admitted prometheus.Counter

	list   []queue.Ref
	listed time.Time
	// stepped signals, to a test, each step this admitter ran.
	stepped testsignal.Signal[queue.StepResult]
}

// NewAdmitter builds the admission ticker; Start runs it.
func NewAdmitter(cfg AdmitterConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Admitter {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &Admitter{
		cfg: cfg, queues: queue.New(queue.Config{}, rdb, engine),
		leases: newLeaseSet("admitter", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		admitted: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_queue_admissions_total",
			Help: "Queue tickets this process admitted (passes handed out).",
		})),
	}
	w.service = newService("admitter", cfg.Options, log, reg, w.leases, w.run)
	return w
}

func (w *Admitter) run(ctx context.Context) error {
	return w.leases.everyTick(ctx, w.cfg.Interval, w.step)
}

// step runs one admission step of each queue of partition p. A queue that
// fails is logged and skipped; the others go on.
func (w *Admitter) step(ctx context.Context, p int) error {
	if time.Since(w.listed) > w.cfg.ListEvery || w.list == nil {
		lctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		var all []queue.Ref
		after := ""
		for {
			page, err := w.queues.Queues(lctx, after, 1000)
			if err != nil {
				cancel()
				return err
			}
			all = append(all, page...)
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1].String()
		}
		cancel()
		w.list, w.listed = all, time.Now()
	}
	for _, r := range w.list {
		if r.Partition() != p || !w.leases.Held(p) {
			continue
		}
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		res, err := w.queues.Step(sctx, r)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Str("queue", r.String()).Msg("admission step (retried next tick)")
			}
			continue
		}
		w.admitted.Add(float64(res.Admitted))
		w.stepped.Signal(res)
	}
	return nil
}
