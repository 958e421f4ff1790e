package live_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
)

// TestHotSKUFanout measures the hub under a sale: 2,000 subscribers on one
// SKU while 2,000 reserves run. It logs the delay from each change (the
// announcement's timestamp, in ms) to its delivery at every subscriber, how
// long the last subscriber took to see the final value, and the memory one
// subscription costs the hub. The assertions are loose bounds; the figures
// are the point. It does not run in parallel with other tests, so that the
// figures are its own. The 10 ms run is a stress point: 2,000 subscribers x
// 100 deliveries a second saturate a small machine under -race, so it only
// checks that everyone converges and logs what it costs.
func TestHotSKUFanout(t *testing.T) {
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			for _, interval := range []time.Duration{100 * time.Millisecond, 10 * time.Millisecond} {
				t.Run(interval.String(), func(t *testing.T) {
					hotSKU(t, backend, interval)
				})
			}
		})
	}
}

func hotSKU(t *testing.T, backend string, interval time.Duration) {
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

	// Readers: each records the delay of every change it sees.
	type reader struct {
		delays []time.Duration
		last   inventory.Stock
		lastAt time.Time
	}
	readers := make([]reader, subscribers)
	var mu sync.Mutex // guards readers' last/lastAt for the convergence check
	var wg sync.WaitGroup
	for i, ch := range chans {
		wg.Go(func() {
			r := &readers[i]
			for v := range ch {
				now := time.Now()
				if v.Seq != initial.Seq {
					r.delays = append(r.delays, now.Sub(v.UpdatedAt))
				}
				mu.Lock()
				r.last, r.lastAt = v, now
				mu.Unlock()
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
	waitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range readers {
			if !same(readers[i].last, truth) {
				return false
			}
		}
		return true
	}, "not every subscriber reached %+v", truth)
	var converged time.Duration
	mu.Lock()
	for i := range readers {
		converged = max(converged, readers[i].lastAt.Sub(saleEnd))
	}
	mu.Unlock()

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
	if interval >= 100*time.Millisecond { // the default
		require.Less(t, pct(.99), time.Second)
		require.Less(t, converged, 250*time.Millisecond, "G8: every subscriber within 250 ms")
	}

}
