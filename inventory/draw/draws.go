package draw

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Draws takes a draw's entries, runs it and reads its result; package
// inventory's Engine.Draws hands them out, and its Maintenance lists the
// draws due.
type Draws struct{ e *engine }

// Settings are the engine's settings a draw is held to (package
// inventory's Config) besides the core's limits.
type Settings struct {
	Pause Pause
}

// Holds is what a draw asks of the holds, which live in package inventory
// above the aggregates: besides the core's (a rebuild, reading a winner's
// hold), reading a hold from its Redis hash, to write the winners' holds
// to the ledger.
type Holds interface {
	core.Holds
	HoldFromHash(token string, h map[string]string) core.Reservation
}

// Metrics are the draws' own series; the outcomes go to the core's.
type Metrics struct {
	// entryBatch is the number of draw entries each transaction recorded.
	entryBatch prometheus.Histogram
	// unheld counts draws' winners whose hold could not be made.
	unheld prometheus.Counter
}

// NewMetrics registers the draws' series with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{
		entryBatch: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_draw_entry_batch_size",
			Help:    "Draw entries recorded by one Postgres transaction (concurrent entries go together).",
			Buckets: []float64{1, 4, 16, 64, 128, 256},
		})),
		unheld: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_draw_winners_unheld_total",
			Help: "Draws' winners whose hold could not be made (the units the draw counted were not there); each waits first in the waitlist and is recorded in the ledger's result.",
		})),
	}
}

// New is the draws of the engine whose shared parts c are. The engine
// builds them once: they gather concurrent entries (entryBatcher).
func New(c *core.Core, h Holds, s Settings, m *Metrics) Draws {
	e := &engine{core: c, holds: h, cfg: s, metrics: m, rdb: c.Redis, ledger: c.Ledger, keys: c.Keys, log: c.Log}
	e.entries = e.newEntryBatcher(nil, entryGatherWait)
	return Draws{e: e}
}

// engine is what the draws' code reaches through e: the core, the holds,
// the settings and the entries on their way to the ledger.
type engine struct {
	core    *core.Core
	holds   Holds
	cfg     Settings
	metrics *Metrics
	rdb     redis.UniversalClient
	ledger  *db.Ledger
	keys    script.Keys
	log     zerolog.Logger
	// entries gathers concurrent draw entries into one transaction.
	entries *entryBatcher
}
