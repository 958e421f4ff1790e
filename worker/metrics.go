package worker

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// register adds c to reg, or returns the collector already registered under
// the same description. Several workers share some series (restarts, lease
// changes), and two groups may share one registry; neither is an error.
// A nil registerer keeps the collector unexported.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		panic(err) // a programming error: two different series with one name
	}
	return c
}

// restartsVec counts supervised restarts per worker.
func restartsVec(reg prometheus.Registerer) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dropline_worker_restarts_total",
		Help: "Times a worker loop failed (error or panic) and was restarted after a backoff.",
	}, []string{"worker"}))
}

// partitionFailuresVec counts, per worker, steps on one partition (or, for
// the rebuilder, one SKU) that failed and were skipped while the others went on.
func partitionFailuresVec(reg prometheus.Registerer) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dropline_worker_partition_failures_total",
		Help: "Steps of a worker on one partition (rebuilder: one SKU) that failed; it is logged and retried after a backoff, the other partitions go on.",
	}, []string{"worker"}))
}

// leaseMetrics are the lease series shared by every worker kind.
type leaseMetrics struct {
	changes *prometheus.CounterVec
	held    *prometheus.GaugeVec
}

func newLeaseMetrics(reg prometheus.Registerer) leaseMetrics {
	return leaseMetrics{
		changes: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_lease_changes_total",
			Help: "Lease ownership changes of this process by worker kind and change (acquired, lost, released).",
		}, []string{"kind", "change"})),
		held: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_leases_held",
			Help: "Partition leases this process holds, by worker kind.",
		}, []string{"kind"})),
	}
}
