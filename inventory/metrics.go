package inventory

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/draw"
	"github.com/dropline/dropline/inventory/outcome"
)

// metrics are the engine's Prometheus series. With a nil registerer they are
// still counted, just not exported.
type metrics struct {
	// shared counts every operation by its outcome, the aggregates' too.
	shared   *core.Metrics
	rebuilds prometheus.Counter
	wait     prometheus.Histogram
	short    prometheus.Counter
	// reserveBatch is the number of reserves each run of reserve.lua decided.
	reserveBatch prometheus.Histogram
	// reserveDur is how long each Reserve took, whatever its outcome.
	reserveDur prometheus.Histogram
	// draws are the draws' own series (draw.Metrics).
	draws *draw.Metrics
	// soldOutFromMemory counts reserves answered OUT_OF_STOCK without a
	// script, from what the process knew (SoldOutMemory).
	soldOutFromMemory prometheus.Counter
	// outOfStock is shared's series of reserves refused OUT_OF_STOCK, the
	// storm's every answer: looked up at its first use (so it appears as
	// Outcome would make it), then kept.
	outOfStock func() prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	shared := core.NewMetrics(reg)
	return &metrics{
		shared: shared,
		outOfStock: sync.OnceValue(func() prometheus.Counter {
			return shared.Counter("reserve", outcome.CodeOf(&OutOfStockError{}))
		}),
		rebuilds: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_inventory_rebuilds_total",
			Help: "SKUs rebuilt in Redis from Postgres (new products and state Redis lost).",
		})),
		wait: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_redis_wait_seconds",
			Help:    "Time of a reserve's or commit's script plus its WAIT for replicas (only with DROPLINE_REDIS_WAIT_REPLICAS).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		})),
		short: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_redis_wait_short_total",
			Help: "WAITs that timed out before enough replicas had the write; the answer was given anyway.",
		})),
		reserveBatch: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_reserve_batch_size",
			Help:    "Reserves decided by one run of reserve.lua (concurrent reserves of a partition go together).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		})),
		reserveDur: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_reserve_duration_seconds",
			Help:    "Time of one reserve in the engine, whatever its outcome: the idempotency claim, the wait for its batch, its run of reserve.lua and any rebuild (deploy/alerts.yml watches its 99th percentile).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		})),
		draws: draw.NewMetrics(reg),
		soldOutFromMemory: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_reserve_sold_out_from_memory_total",
			Help: "Reserves answered OUT_OF_STOCK from the process's memory of sold-out SKUs, without a script run.",
		})),
	}
}

func (m *metrics) waited(d time.Duration, enough bool) {
	m.wait.Observe(d.Seconds())
	if !enough {
		m.short.Inc()
	}
}

func (m *metrics) outcome(op string, err error) { m.shared.Outcome(op, err) }

// reserveOutcome is outcome("reserve", err), without the lookups for an
// *OutOfStockError.
func (m *metrics) reserveOutcome(err error) {
	if oos, ok := err.(*OutOfStockError); ok && oos != nil { //nolint:errorlint // the engine's own error, unwrapped; Outcome unwraps any other
		m.outOfStock().Inc()
		return
	}
	m.shared.Outcome("reserve", err)
}
