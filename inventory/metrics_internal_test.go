package inventory

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory/outcome"
)

// TestReserveOutcomeCountsAsOutcome: a reserve's outcome lands in the
// series Outcome counts it in, whether it is the unwrapped
// *OutOfStockError reserveOutcome keeps a series for or anything else.
func TestReserveOutcomeCountsAsOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.reserveOutcome(&OutOfStockError{})
	m.reserveOutcome(&OutOfStockError{Available: 2})
	m.reserveOutcome(fmt.Errorf("wrapped: %w", &OutOfStockError{}))
	m.reserveOutcome(nil)
	m.reserveOutcome(&RateLimitedError{})
	count := func(code outcome.Code) float64 {
		return testutil.ToFloat64(m.shared.Counter("reserve", code))
	}
	require.Equal(t, 3.0, count("OUT_OF_STOCK"))
	require.Equal(t, 1.0, count("OK"))
	require.Equal(t, 1.0, count("RATE_LIMITED"))
	require.Equal(t, 3, testutil.CollectAndCount(reg, "dropline_inventory_operations_total"),
		"OUT_OF_STOCK, OK, RATE_LIMITED, and no other series")
}
