package flashsale_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench/flashsale"
	"github.com/dropline/dropline/internal/testenv"
)

// watchDrop runs a small drop watched by live subscribers against the real
// server and returns the result.
func watchDrop(t *testing.T, transport string, watchers, skus int) *flashsale.Result {
	t.Helper()
	dbURL := testenv.NewDatabase(t)
	a := startApp(t, dbURL, testenv.Redis(t).Prefix)
	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://" + a.Addr()}
	cfg.Secret = []byte(testSecret)
	cfg.Buyers, cfg.Concurrency, cfg.Stock = 60, 8, 30
	cfg.Think = 0
	cfg.DatabaseURL = dbURL
	cfg.RunID = "w" + transport
	cfg.Watchers, cfg.WatchTransport, cfg.WatchSKUs = watchers, transport, skus
	cfg.Changes, cfg.ChangeRate = 10, 40
	cfg.SourceAddrs = 3
	// Under -race on a shared machine the latency is not the point here:
	// convergence and completeness are.
	cfg.WatchP99, cfg.WatchRSSKiB = 5*time.Second, 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := flashsale.NewDriver(ctx, cfg)
	require.NoError(t, err)
	defer d.Close()
	res, err := d.Run(ctx)
	require.NoError(t, err)
	var text strings.Builder
	require.NoError(t, flashsale.WriteText(&text, res))
	t.Log("\n" + text.String())
	return res
}

// TestWatchersSeeTheDrop: websocket watchers from several source addresses
// get every measured change and converge to the final stock, and the
// verdict and both reports say so.
func TestWatchersSeeTheDrop(t *testing.T) {
	t.Parallel()
	res := watchDrop(t, flashsale.TransportWS, 60, 1)
	require.True(t, res.Verdict.OK, "%+v", res.Verdict.Failed())
	w := res.Watch
	require.NotNil(t, w)
	require.Equal(t, 60, w.Connected)
	require.Equal(t, 3, w.SourceAddrs)
	require.Equal(t, 10, w.Changes)
	require.Equal(t, 60*10, w.Deliveries, "every change reached every watcher")
	require.Equal(t, 60, w.Converged)
	require.Positive(t, w.RSSBeforeBytes, "the server's RSS comes from its /metrics")
	require.Positive(t, w.GoroutinesBefore, "so do its goroutines")
	require.Positive(t, w.Latency.MaxMs)

	var html strings.Builder
	require.NoError(t, flashsale.WriteHTML(&html, res))
	require.Contains(t, html.String(), "Live watchers")
	require.Contains(t, html.String(), "ws watchers")
}

func TestSSEWatchersSeeTheDrop(t *testing.T) {
	t.Parallel()
	res := watchDrop(t, flashsale.TransportSSE, 30, 1)
	require.True(t, res.Verdict.OK, "%+v", res.Verdict.Failed())
	require.Equal(t, 30*10, res.Watch.Deliveries)
	require.Equal(t, 30, res.Watch.Converged)
}

// TestWatchersOfManySKUs: five SKUs of four watchers each; every change of
// a SKU reaches its four watchers and nobody else's values are mixed in.
func TestWatchersOfManySKUs(t *testing.T) {
	t.Parallel()
	res := watchDrop(t, flashsale.TransportWS, 20, 5)
	require.True(t, res.Verdict.OK, "%+v", res.Verdict.Failed())
	w := res.Watch
	require.Equal(t, 5, w.SKUs)
	require.Equal(t, 10, w.Changes, "one SKU per tick")
	require.Equal(t, 10*4, w.Deliveries)
	require.Equal(t, 20, w.Converged)
}

// TestJudgeWatch: a watcher that did not converge, a change that did not
// reach everybody, a slow p99 and a fat subscriber each fail the verdict.
func TestJudgeWatch(t *testing.T) {
	t.Parallel()
	good := flashsale.WatchResult{Transport: "ws", Watchers: 10, Connected: 10, Converged: 10, Changes: 4,
		Deliveries: 40, Latency: flashsale.Quantiles{P99ms: 100}, RSSBeforeBytes: 1 << 20, RSSPerWatcherKiB: 20}
	failed := func(w flashsale.WatchResult) []string {
		var out []string
		for _, c := range flashsale.JudgeWatch(w, 250*time.Millisecond, 32) {
			if !c.OK {
				out = append(out, c.Name)
			}
		}
		return out
	}
	require.Empty(t, failed(good))
	bad := good
	bad.Converged = 9
	require.Equal(t, []string{"every watcher converged to the final stock"}, failed(bad))
	bad = good
	bad.Missing = 1
	require.Equal(t, []string{"every change reached every watcher"}, failed(bad))
	bad = good
	bad.Latency.P99ms = 251
	require.Equal(t, []string{"change-to-watcher p99 within 250ms"}, failed(bad))
	bad = good
	bad.RSSPerWatcherKiB = 40
	require.Equal(t, []string{"server memory per idle watcher within 32 KiB"}, failed(bad))
	bad = good
	bad.Connected, bad.Failed, bad.Converged = 9, 1, 9
	require.Equal(t, []string{"every watcher subscribed"}, failed(bad))
}
