package core

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/inventory/outcome"
)

// Metrics are the series every part of the engine counts its operations
// in. With a nil registerer they are still counted, just not exported.
type Metrics struct {
	outcomes *prometheus.CounterVec
}

// NewMetrics registers the series with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{
		outcomes: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_inventory_operations_total",
			Help: "Inventory operations by operation and outcome code (OK, OUT_OF_STOCK, ..., INTERNAL).",
		}, []string{"op", "code"})),
	}
}

// Outcome counts one operation op by the outcome of err.
func (m *Metrics) Outcome(op string, err error) {
	code := "OK"
	if err != nil {
		code = string(outcome.CodeOf(err))
		if code == "" {
			code = "INTERNAL"
		}
	}
	m.outcomes.WithLabelValues(op, code).Inc()
}

// Counter is the series of op's outcomes of code, for a caller that counts
// one outcome often and keeps it (Outcome looks it up at each call).
func (m *Metrics) Counter(op string, code outcome.Code) prometheus.Counter {
	return m.outcomes.WithLabelValues(op, string(code))
}
