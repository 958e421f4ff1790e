// Package prom is how every Dropline package registers its Prometheus
// series: one function, so registration behaves the same everywhere.
package prom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register adds c to reg and returns it, or returns the collector already
// registered under the same description: several services share some series
// (worker restarts, lease changes), and two instances may share one registry
// (tests do); neither is an error. A nil registerer keeps c counted but
// unexported. Two different series under one name are a programming error
// and panic.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
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
		panic(fmt.Sprintf("registering metrics: %v", err))
	}
	return c
}
