package inventory

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
)

// metrics are the engine's Prometheus series. With a nil registerer they are
// still counted, just not exported.
type metrics struct {
	outcomes *prometheus.CounterVec
	rebuilds prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	return &metrics{
		outcomes: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_inventory_operations_total",
			Help: "Inventory operations by operation and outcome code (OK, OUT_OF_STOCK, ..., INTERNAL).",
		}, []string{"op", "code"})),
		rebuilds: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_inventory_rebuilds_total",
			Help: "SKUs rebuilt in Redis from Postgres (new products and state Redis lost).",
		})),
	}
}

func (m *metrics) outcome(op string, err error) {
	code := "OK"
	if err != nil {
		code = string(ErrorCode(err))
		if code == "" {
			code = "INTERNAL"
		}
	}
	m.outcomes.WithLabelValues(op, code).Inc()
}
