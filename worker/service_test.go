package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A loop that panics, then fails, is restarted each time with a backoff, and
// Stop still stops it and waits.
func TestServiceRestartsAFailedLoop(t *testing.T) {
	checkLeaks(t)
	reg := prometheus.NewRegistry()
	var runs atomic.Int32
	steady := make(chan struct{})
	s := newService("flaky", Options{MinRestartBackoff: 10 * time.Millisecond, MaxRestartBackoff: 20 * time.Millisecond},
		zerolog.New(zerolog.NewTestWriter(t)), reg, func(ctx context.Context) error {
			switch runs.Add(1) {
			case 1:
				panic("boom")
			case 2:
				return errors.New("redis went away")
			case 3:
				return nil // returning without being stopped is a failure too
			}
			close(steady)
			<-ctx.Done()
			return nil
		})
	require.NoError(t, s.Start(context.Background()))
	require.NoError(t, s.Start(context.Background()), "starting a started worker does nothing")
	select {
	case <-steady:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop was not restarted")
	}
	require.Equal(t, 3.0, metric(t, reg, "dropline_worker_restarts_total"))
	s.Stop()
	s.Stop()
	require.Equal(t, int32(4), runs.Load())
}

func TestBackoffDoublesUpToTheCap(t *testing.T) {
	require.InDelta(t, float64(100*time.Millisecond), float64(backoff(100*time.Millisecond, time.Second, 0)), float64(21*time.Millisecond))
	require.InDelta(t, float64(400*time.Millisecond), float64(backoff(100*time.Millisecond, time.Second, 2)), float64(81*time.Millisecond))
	require.LessOrEqual(t, backoff(100*time.Millisecond, time.Second, 50), time.Second)
}
