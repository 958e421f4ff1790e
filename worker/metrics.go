package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
)

// restartsVec counts supervised restarts per worker.
func restartsVec(reg prometheus.Registerer) *prometheus.CounterVec {
	return prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dropline_worker_restarts_total",
		Help: "Times a worker loop failed (error or panic) and was restarted after a backoff.",
	}, []string{"worker"}))
}

// partitionFailuresVec counts, per worker, steps on one partition (or, for
// the rebuilder, one SKU) that failed and were skipped while the others went on.
func partitionFailuresVec(reg prometheus.Registerer) *prometheus.CounterVec {
	return prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
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
		changes: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_lease_changes_total",
			Help: "Lease ownership changes of this process by worker kind and change (acquired, lost, released).",
		}, []string{"kind", "change"})),
		held: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_leases_held",
			Help: "Partition leases this process holds, by worker kind.",
		}, []string{"kind"})),
	}
}
