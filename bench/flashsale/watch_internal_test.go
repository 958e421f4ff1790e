package flashsale

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeliveryLatencies: a delivery is timed from sending the change to the
// watcher's first value at or below the change's target; a coalesced
// value that skips a target delivers it too; a watcher that never gets
// there is missing, and the change has no change-to-all figure (but still
// a change-to-first one).
func TestDeliveryLatencies(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	changes := []change{
		{SKU: 0, At: ms(0), Target: 9, OK: true},
		{SKU: 0, At: ms(50), Target: 8, OK: true},
		{SKU: 0, At: ms(100), Target: 7, OK: false}, // refused: not measured
		{SKU: 1, At: ms(100), Target: 4, OK: true},
	}
	skuOf := []int{0, 0, 1}
	recv := [][]receipt{
		{{At: ms(10), Available: 9}, {At: ms(70), Available: 8}},
		{{At: ms(120), Available: 8}}, // coalesced: 9 skipped, delivered by the 8
		{{At: ms(5), Available: 5}},   // never reaches 4
	}
	lat, toAll, toFirst, missing := deliveryLatencies(changes, skuOf, recv)
	require.Equal(t, []time.Duration{ms(10), ms(120), ms(20), ms(70)}, lat)
	require.Equal(t, []time.Duration{ms(120), ms(70)}, toAll)
	require.Equal(t, []time.Duration{ms(10), ms(20)}, toFirst)
	require.Equal(t, 1, missing)

	q := quantiles(lat)
	require.Equal(t, 120.0, q.MaxMs)
	require.Equal(t, 20.0, q.P50ms)
}

func TestParseStock(t *testing.T) {
	t.Parallel()
	s, err := parseStock([]byte(`{"id":"1","type":"next","payload":{"data":{"stockChanged":{"sku":"A","available":7,"held":2,"sold":1,"total":10}}}}`))
	require.NoError(t, err)
	require.Equal(t, Stock{Available: 7, Held: 2, Sold: 1, Total: 10}, s)
	_, err = parseStock([]byte(`{"payload":{"errors":[{"message":"boom"}],"data":null}}`))
	require.ErrorContains(t, err, "boom")
	_, err = parseStock([]byte(`{"payload":{"data":{"stockChanged":{"sku":"A"}}}}`))
	require.Error(t, err)
}

func TestCompareFloorDividesPerDelivery(t *testing.T) {
	f := &FloorWatchResult{CPUPerDeliveryUs: 8}
	// 10,000 watchers of one SKU, 120 ms of server CPU per change: 12 µs
	// per delivery, 1.5 times the floor's 8.
	f.compareFloor(WatchResult{SKUs: 1, Connected: 10_000, ServerCPUPerChangeMs: 120})
	require.InDelta(t, 12, f.ServerCPUPerDeliveryUs, 1e-9)
	require.InDelta(t, 1.5, f.Ratio, 1e-9)
	// Coalesced: 40 changes read as 200,000 frames, 24 µs each, twice the
	// floor's 12 µs per frame read.
	f.CPUPerFrameUs = 12
	f.compareFloor(WatchResult{SKUs: 1, Connected: 10_000, ServerCPUPerChangeMs: 120, Changes: 40, Received: 200_000})
	require.InDelta(t, 24, f.ServerCPUPerFrameUs, 1e-9)
	require.InDelta(t, 2, f.FrameRatio, 1e-9)
	// Spread over 1,000 SKUs, a change reaches 10 watchers.
	f.compareFloor(WatchResult{SKUs: 1000, Connected: 10_000, ServerCPUPerChangeMs: 0.12})
	require.InDelta(t, 12, f.ServerCPUPerDeliveryUs, 1e-9)
	var none *FloorWatchResult
	none.compareFloor(WatchResult{SKUs: 1, Connected: 1}) // no floor measured: nothing to do
}
