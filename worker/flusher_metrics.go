package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
)

// flusherMetrics are the write-behind's series.
type flusherMetrics struct {
	lag          prometheus.Gauge
	backlog      prometheus.Gauge
	batchSize    prometheus.Histogram
	batchDur     prometheus.Histogram
	applied      prometheus.Counter
	deadLettered *prometheus.CounterVec
	deadLetters  prometheus.Gauge
	refused      prometheus.Counter
	claimed      prometheus.Counter
	// reconciled counts holds of rebuilt SKUs Redis was told about.
	reconciled prometheus.Counter
	failures   prometheus.Counter
	// durable counts unflushed batches acknowledged once durable, by what
	// showed it: a later batch's commit report or a pass's check; ackCheck
	// times such a check with its acknowledgement.
	durable  *prometheus.CounterVec
	ackCheck prometheus.Histogram
}

func newFlusherMetrics(reg prometheus.Registerer) flusherMetrics {
	m := flusherMetrics{

		lag: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_writebehind_lag_seconds",
			Help: "Age of the oldest outbox event not yet applied to Postgres, over the partitions this process flushes.",
		})),
		backlog: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_writebehind_backlog",
			Help: "Outbox events not yet applied to Postgres (pending plus undelivered), over the partitions this process flushes.",
		})),
		batchSize: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_writebehind_batch_size",
			Help:    "Events per write-behind batch.",
			Buckets: []float64{1, 5, 10, 25, 50, 100, 250, 500, 1000},
		})),
		batchDur: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_writebehind_batch_duration_seconds",
			Help:    "Time to apply one write-behind batch and acknowledge what is durable then (the batch itself, or earlier batches committed unflushed, acknowledged while it is written).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		})),
		applied: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_writebehind_events_applied_total",
			Help: "Outbox events applied to Postgres and acknowledged (repeats of an event count again).",
		})),
		deadLettered: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_writebehind_dead_lettered_total",
			Help: "Outbox entries moved to their partition's dead-letter stream instead of the ledger, by reason: malformed (undecodable), unknown_kind (written by a newer version), newer_version (an entry of a newer format), refused (Postgres refused the event alone RefuseLimit times).",
		}, []string{"reason"})),
		deadLetters: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_writebehind_dead_letters",
			Help: "Entries in the dead-letter streams of the partitions this process flushes (they wait for an operator, see docs/operations.md).",
		})),
		refused: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_writebehind_events_refused_total",
			Help: "Times Postgres refused one event on its own, after its batch was split; it stays pending and is retried every ClaimIdle.",
		})),
		failures: partitionFailuresVec(reg).WithLabelValues("flusher"),
		claimed: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_writebehind_events_claimed_total",
			Help: "Pending events claimed from an idle consumer with XAUTOCLAIM.",
		})),
		reconciled: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_writebehind_holds_reconciled_total",
			Help: "Holds of SKUs rebuilt while their events were in flight that Redis was told the ledger's state of (released, adopted or closed).",
		})),
		durable: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_writebehind_unflushed_batches_acked_total",
			Help: "Write-behind batches committed without waiting for the WAL flush, acknowledged once durable, by what showed them durable: batch (a later batch's commit) or check (a pass that applied no batch asked PostgreSQL).",
		}, []string{"by"})),
		ackCheck: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_writebehind_flush_check_duration_seconds",
			Help:    "Time of a pass's check that earlier write-behind batches are durable, with their acknowledgement, when it acknowledged any: busy time besides the batches'.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		})),
	}
	for _, by := range []string{"batch", "check"} {
		m.durable.WithLabelValues(by)
	}
	// Every reason's series exists from the start, at 0, so that a
	// dashboard's rate() and an alert see the first dead letter.
	for _, reason := range []string{deadMalformed, deadUnknownKind, deadRefused} {
		m.deadLettered.WithLabelValues(reason)
	}
	return m
}
