package live

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
)

// metrics are the hub's Prometheus series. With a nil registerer they are
// still counted, just not exported.
type metrics struct {
	subscriptions prometheus.Gauge
	skus          prometheus.Gauge
	received      prometheus.Counter
	deliveries    prometheus.Counter
	coalesced     *prometheus.CounterVec
	dropped       *prometheus.CounterVec
	slowDropped   prometheus.Counter
	resyncs       *prometheus.CounterVec
	resyncErrors  prometheus.Counter
	reconnects    prometheus.Counter
	latency       prometheus.Histogram

	queues             prometheus.Gauge
	queueSubscriptions prometheus.Gauge
	queueReceived      prometheus.Counter
	queueDeliveries    prometheus.Counter
	queueLatency       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		subscriptions: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_live_subscriptions",
			Help: "Active stock subscriptions in this process.",
		})),
		skus: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_live_skus",
			Help: "SKUs this process holds a Redis subscription for (including ones lingering after their last subscriber).",
		})),
		received: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_messages_received_total",
			Help: "Stock announcements received from Redis pub/sub.",
		})),
		deliveries: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_deliveries_total",
			Help: "Stock values handed to subscribers.",
		})),
		coalesced: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_live_coalesced_total",
			Help: "Stock values replaced by a newer one before delivery: per SKU (stage=sku) or in a subscriber's mailbox (stage=subscriber).",
		}, []string{"stage"})),
		dropped: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_live_messages_dropped_total",
			Help: "Announcements ignored: older than what was known (reason=stale) or unreadable (reason=invalid).",
		}, []string{"reason"})),
		slowDropped: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_slow_subscribers_dropped_total",
			Help: "Subscribers dropped for leaving a value unread longer than the stall timeout.",
		})),
		resyncs: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_live_resyncs_total",
			Help: "SKU re-reads from Redis by reason (subscribed, reconnect, periodic).",
		}, []string{"reason"})),
		resyncErrors: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_resync_errors_total",
			Help: "Failed batches of SKU re-reads (retried).",
		})),
		reconnects: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_reconnects_total",
			Help: "Pub/sub connections that came back after being lost.",
		})),
		latency: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_live_delivery_latency_seconds",
			Help:    "Time from a stock change (the announcement's timestamp) to its delivery to a subscriber.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .15, .2, .25, .5, 1, 2.5, 5},
		})),
		queues: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_live_queues",
			Help: "Admission queues this process watches (subscribed or polled), each one Redis subscription.",
		})),
		queueSubscriptions: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dropline_live_queue_subscriptions",
			Help: "Active queue subscriptions in this process (a shared GraphQL subscription counts once).",
		})),
		queueReceived: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_queue_messages_received_total",
			Help: "Queue announcements (one per admission step that changed something) received from Redis pub/sub.",
		})),
		queueDeliveries: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_live_queue_deliveries_total",
			Help: "Queue states handed to subscribers.",
		})),
		queueLatency: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dropline_live_queue_delivery_latency_seconds",
			Help:    "Time from an admission step's announcement (Redis's clock) to its delivery to a queue subscriber.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .15, .2, .25, .5, 1, 2.5, 5},
		})),
	}
	return m
}
