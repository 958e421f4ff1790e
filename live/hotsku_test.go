package live_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
)

// TestHotSKUFanout is G8 under a sale at the hub's default interval
// (100 ms): 2,000 subscribers on one SKU while 2,000 reserves run; every
// subscriber ends on the true value, the last within 250 ms of the last
// reserve, and p99 of the delay from a change to its delivery stays under a
// second. It does not run in parallel with other tests, whose load would be
// measured with it. The figures, and the 10 ms stress point, are
// BenchmarkHotSKUFanout's.
func TestHotSKUFanout(t *testing.T) {
	testenv.Quiet(t)
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			f := hotSKU(t, backend, 100*time.Millisecond)
			require.Less(t, f.p99, time.Second)
			require.Less(t, f.converged, 250*time.Millisecond, "G8: every subscriber within 250 ms")
		})
	}
}

// BenchmarkHotSKUFanout measures the hub under the sale of TestHotSKUFanout
// at the default interval and at 10 ms, a stress point (2,000 subscribers x
// 100 deliveries a second saturate a small machine under -race): the delay
// from each change (the announcement's timestamp, in ms) to its delivery at
// every subscriber, how long the last subscriber took to see the final
// value, and the memory one subscription costs the hub.
//
//	go test -run '^$' -bench HotSKUFanout -benchtime 1x ./live/
func BenchmarkHotSKUFanout(b *testing.B) {
	for _, backend := range testenv.Backends {
		for _, interval := range []time.Duration{100 * time.Millisecond, 10 * time.Millisecond} {
			b.Run(backend+"/"+interval.String(), func(b *testing.B) {
				for range b.N {
					f := hotSKU(b, backend, interval)
					b.ReportMetric(float64(f.p50.Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(f.p99.Microseconds())/1000, "p99-ms")
					b.ReportMetric(float64(f.converged.Microseconds())/1000, "converged-ms")
					b.ReportMetric(f.perSub/1024, "KiB/subscriber")
				}
			})
		}
	}
}

// fanout is what one hot-SKU sale measured.
type fanout struct {
	p50, p99, converged time.Duration
	perSub              float64 // bytes the hub keeps per subscription
}

// hotSKU runs the sale: every subscriber must reach the true value within
// 5 s of its end; it returns the figures and logs them.
func hotSKU(t testing.TB, backend string, interval time.Duration) fanout {
	const subscribers, reserves = 2000, 2000
	b := setupBackend(t, backend, live.HubConfig{Interval: interval})
	b.product(t, "HOT", reserves)
	initial := b.truth(t, "HOT")

	// Memory: subscribe everyone before any reader runs, so the figure is
	// the hub's side only (subscriber, mailbox, channel, goroutine stack).
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	chans := make([]<-chan inventory.Stock, subscribers)
	for i := range chans {
		ch, err := b.hub.Subscribe(ctx, []string{"HOT"})
		require.NoError(t, err)
		chans[i] = ch
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perSub := (float64(after.HeapAlloc) - float64(before.HeapAlloc) + float64(after.StackInuse) - float64(before.StackInuse)) / subscribers

	// Readers: each records the delay of every change it sees, and the value
	// it holds. The sale's last reserve is the only change that leaves
	// nothing available, so a reader knows when it has the final value:
	// the last of them to get it closes soldOut. Each reader guards its own
	// fields, so that the readers never wait on each other.
	type reader struct {
		delays []time.Duration
		mu     sync.Mutex // guards last and finalAt, read by the convergence check
		last   inventory.Stock
		// finalAt is when the reader received the first value with nothing
		// available.
		finalAt time.Time
	}
	readers := make([]reader, subscribers)
	var toSellOut atomic.Int64
	toSellOut.Store(subscribers)
	soldOut := make(chan struct{})
	var wg sync.WaitGroup
	for i, ch := range chans {
		wg.Go(func() {
			r := &readers[i]
			for v := range ch {
				now := time.Now()
				if v.Seq != initial.Seq {
					r.delays = append(r.delays, now.Sub(v.UpdatedAt))
				}
				r.mu.Lock()
				r.last = v
				first := v.Available == 0 && r.finalAt.IsZero()
				if first {
					r.finalAt = now
				}
				r.mu.Unlock()
				if first && toSellOut.Add(-1) == 0 {
					close(soldOut)
				}
			}
		})
	}

	start := time.Now()
	var rw sync.WaitGroup
	reserveErrs := make([]error, 8)
	for g := range reserveErrs {
		rw.Go(func() {
			for i := g; i < reserves; i += 8 {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "HOT", Quantity: 1})
				if err != nil {
					reserveErrs[g] = fmt.Errorf("reserve %d: %w", i, err)
					return
				}
			}
		})
	}
	rw.Wait()
	require.NoError(t, errors.Join(reserveErrs...))
	saleEnd := time.Now()
	truth := b.truth(t, "HOT")
	require.Zero(t, truth.Available)
	select {
	case <-soldOut:
	case <-time.After(5 * time.Second):
		t.Fatalf("after 5s: %d subscribers never received the final value %+v", toSellOut.Load(), truth)
	}
	var converged time.Duration
	for i := range readers {
		r := &readers[i]
		r.mu.Lock()
		last, finalAt := r.last, r.finalAt
		r.mu.Unlock()
		require.True(t, same(last, truth), "subscriber %d ended on %+v, not on %+v", i, last, truth)
		converged = max(converged, finalAt.Sub(saleEnd))
	}

	cancel()
	wg.Wait()
	var delays []time.Duration
	for i := range readers {
		delays = append(delays, readers[i].delays...)
	}
	require.NotEmpty(t, delays)
	slices.Sort(delays)
	pct := func(p float64) time.Duration { return delays[int(p*float64(len(delays)-1))] }
	t.Logf("%s, interval %s: %d subscribers, %d reserves in %s; %d deliveries of changes (%.1f per subscriber); "+
		"delay change->delivery p50 %s p99 %s max %s; last subscriber had the final value %s after the last reserve returned; "+
		"%.1f KiB per subscription; %.0f messages received, %.0f coalesced",
		backend, interval, subscribers, reserves, saleEnd.Sub(start).Round(time.Millisecond), len(delays),
		float64(len(delays))/subscribers, pct(.5).Round(100*time.Microsecond), pct(.99).Round(100*time.Microsecond),
		delays[len(delays)-1].Round(100*time.Microsecond), converged.Round(100*time.Microsecond), perSub/1024,
		b.metric(t, "dropline_live_messages_received_total"), b.metric(t, "dropline_live_coalesced_total"))
	return fanout{p50: pct(.5), p99: pct(.99), converged: converged, perSub: perSub}
}
