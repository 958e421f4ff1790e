package flashsale

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestP99RankIsPercentiles says which commit, from the slowest, the p99
// is, for the sample sizes the rehearsal uses: the slowest of 30, the 4th
// slowest of 300.
func TestP99RankIsPercentiles(t *testing.T) {
	for n, want := range map[int]int{1: 1, 30: 1, 99: 1, 100: 2, 300: 4, 352: 4, 5000: 51} {
		require.Equal(t, want, p99Rank(n), "n=%d", n)
	}
	require.Zero(t, p99Rank(0))
	for n := 1; n <= 1000; n++ {
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i+1) * time.Millisecond
		}
		require.Equal(t, s[n-p99Rank(n)], Percentile(s, 0.99), "n=%d", n)
	}
	require.Equal(t, "the slowest", rankWord(1))
	require.Equal(t, "the 2nd slowest", rankWord(2))
	require.Equal(t, "the 4th slowest", rankWord(4))
	require.Equal(t, "the 12th slowest", rankWord(12))
	require.Equal(t, "the 21st slowest", rankWord(21))
	require.Equal(t, "the 51st slowest", rankWord(51))
}

// TestQuietCommitsDefaultIsASample checks that the default number of quiet
// commits makes their p99 something other than their slowest one.
func TestQuietCommitsDefaultIsASample(t *testing.T) {
	require.Greater(t, p99Rank(DefaultConfig().QuietCommits), 1)
}

// TestNoOpsTimeHealthz checks the no-op probe: it asks the /healthz of the
// endpoint's server, times the answered requests, counts the failed ones
// apart, stops at n, and with a stop channel sends one every interval
// until it is closed.
func TestNoOpsTimeHealthz(t *testing.T) {
	var calls, bad atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/healthz" {
			bad.Add(1)
			http.NotFound(w, r)
			return
		}
		if calls.Add(1)%4 == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	c := NewClient(srv.URL+"/graphql", 2, 5*time.Second)
	defer c.Close()
	ctx := context.Background()

	lat, failed := noOps(ctx, c, 20, 0, nil)
	require.Len(t, lat, 15)
	require.Equal(t, 5, failed, "every 4th answer is a 503")
	for _, l := range lat {
		require.Positive(t, l)
	}
	require.Zero(t, bad.Load(), "every request was GET /healthz")
	lat, failed = noOps(ctx, c, 0, 0, nil)
	require.Empty(t, lat, "n 0 and no stop: nothing to send")
	require.Zero(t, failed)

	stop := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() { close(stop) })
	before := calls.Load()
	lat, failed = noOps(ctx, c, 0, 10*time.Millisecond, stop)
	sent := calls.Load() - before
	require.Equal(t, sent, int64(len(lat)+failed))
	require.GreaterOrEqual(t, sent, int64(3), "one every 10 ms for 100 ms")
	require.LessOrEqual(t, sent, int64(11), "no more than one every 10 ms, and the first at once")
}
