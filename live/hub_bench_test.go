package live_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
)

// BenchmarkHubFanout is the hub alone (no GraphQL, no sockets): N
// subscribers of one SKU, each reading its channel on its own goroutine.
// One op is one change (a reserve of one unit) until every subscriber has
// received a value at or below it. The interval is 1 ms so that the figure
// is the fan-out, not the pacing (which adds up to Interval on top). It
// reports the change-to-all time per op and the hub's memory per
// subscriber (subscriber, mailbox, channel and goroutine):
//
//	go test -run '^$' -bench BenchmarkHubFanout -benchtime 50x ./live/
func BenchmarkHubFanout(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) { benchFanout(b, n) })
	}
}

func benchFanout(b *testing.B, n int) {
	bb := setupBackend(b, "single", live.HubConfig{Interval: time.Millisecond})
	stock := b.N + 1
	bb.product(b, "BENCH", stock)
	ctx, cancel := context.WithCancel(bb.ctx)
	defer cancel()

	var target atomic.Int64
	target.Store(int64(stock))
	var reached atomic.Int64
	allThere := make(chan struct{}, 1)
	var wg sync.WaitGroup
	before := heapInUse()
	for range n {
		ch, err := bb.hub.Subscribe(ctx, []string{"BENCH"})
		require.NoError(b, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := int64(stock + 1)
			for v := range ch {
				a := int64(v.Available)
				if a >= seen {
					continue
				}
				seen = a
				if a <= target.Load() && reached.Add(1) == int64(n) {
					allThere <- struct{}{}
				}
			}
		}()
	}
	<-allThere // everyone has the first value
	perSub := float64(heapInUse()-before) / 1024 / float64(n)

	b.ResetTimer()
	for i := range b.N {
		reached.Store(0)
		target.Store(int64(stock - 1 - i))
		_, err := bb.engine.Reserve(bb.ctx, buyer(i), inventory.ReserveRequest{SKU: "BENCH", Quantity: 1})
		require.NoError(b, err)
		select {
		case <-allThere:
		case <-time.After(10 * time.Second):
			b.Fatalf("change %d reached %d of %d subscribers", i, reached.Load(), n)
		}
	}
	b.StopTimer()
	b.ReportMetric(perSub, "KiB/sub")
	cancel()
	wg.Wait()
}

// heapInUse is the live heap and goroutine stacks after a collection.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
