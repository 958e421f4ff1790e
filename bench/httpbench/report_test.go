package httpbench

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestRewriteSectionReplacesOnlyTheMarkedPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	doc := "# Title\n\nbefore\n\n" + BeginMarker + "\nold figures\n" + EndMarker + "\n\nafter\n"
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))

	require.NoError(t, RewriteSection(path, "new figures\n"))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "# Title\n\nbefore\n\n"+BeginMarker+"\nnew figures\n"+EndMarker+"\n\nafter\n", string(got))

	// A second run replaces the first run's figures, not adds to them.
	require.NoError(t, RewriteSection(path, "newer\n"))
	got, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "# Title\n\nbefore\n\n"+BeginMarker+"\nnewer\n"+EndMarker+"\n\nafter\n", string(got))
}

func TestRewriteSectionRefusesAFileWithoutMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	require.NoError(t, os.WriteFile(path, []byte("# nothing to rewrite\n"), 0o600))
	require.Error(t, RewriteSection(path, "x"))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "# nothing to rewrite\n", string(got))
}

func TestPercentileMS(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	require.InDelta(t, 50, percentileMS(lat, 50), 0.001)
	require.InDelta(t, 99, percentileMS(lat, 99), 0.001)
	require.InDelta(t, 100, percentileMS(lat, 100), 0.001)
	require.InDelta(t, 0, percentileMS(nil, 99), 0.001)
}

func TestChecksJudgeTheGoals(t *testing.T) {
	r := Result{
		Config:     Config{Connections: 50},
		Reserve:    WrkResult{DurationUS: 1e6, Held: 15000, P50US: 2000, P99US: 5000},
		Redis:      Baseline{PerSecond: 28000},
		Postgres:   Baseline{PerSecond: 1000, P99MS: 80},
		Storm:      WrkResult{DurationUS: 1e6, Requests: 45000, OutOfStock: 45000},
		Steady:     WrkResult{DurationUS: 1e6, Requests: 12000, Held: 12000, P50US: 1000, P99US: 3900},
		SteadyRate: 12000,
		Peak:       PeakResult{EventRate: 15000, Capacity: 45000, LagP99: 0.3, Samples: 240},
		StockFell:  15010,
		ServerCPU:  60 * time.Microsecond, FloorCPU: 45 * time.Microsecond,
		RedisCPU: 20 * time.Microsecond, RedisBareCPU: 20 * time.Microsecond,
	}
	for _, c := range r.Checks() {
		require.True(t, c.Passed || c.Retired, "%s: %s (goal %s)", c.Name, c.Value, c.Goal)
	}
	// A storm answered below 3 times the holds' rate, and a write-behind
	// below 3 times the events' rate, fail; the retired EVALSHA ratio is
	// printed, never judged.
	r.Storm.OutOfStock = 44000    // 44,000 ÷ 15,000 < 3
	r.Peak.Capacity = 44000       // 44,000 ÷ 15,000 < 3
	r.Redis.PerSecond = 1_000_000 // 0.015, far below the old 0.5
	failed := map[string]bool{}
	for _, c := range r.Checks() {
		if !c.Passed && !c.Retired {
			failed[c.Name] = true
		}
	}
	require.Equal(t, map[string]bool{"sold-out answers ÷ successful reserves": true,
		"ledger apply capacity ÷ event rate (peak)": true}, failed)
	require.Contains(t, r.Markdown(), "| GraphQL reserves ÷ raw EVALSHA | 0.01 | retired: the two floors below replace it | — |")
	r.Storm.OutOfStock, r.Peak.Capacity = 45000, 45000

	// The floors: above 1.5 and 1.0 fails, and so does a floor not measured.
	r.ServerCPU, r.RedisCPU = 68*time.Microsecond, 21*time.Microsecond
	failed = map[string]bool{}
	for _, c := range r.Checks() {
		if !c.Passed && !c.Retired {
			failed[c.Name] = true
		}
	}
	require.Equal(t, map[string]bool{"dropline CPU per hold ÷ floor server CPU per request": true,
		"redis-server CPU per hold ÷ per bare script call": true}, failed)
	r.ServerCPU, r.RedisCPU, r.FloorCPU = 60*time.Microsecond, 20*time.Microsecond, 0
	for _, c := range r.Checks() {
		if c.Name == "dropline CPU per hold ÷ floor server CPU per request" {
			require.False(t, c.Passed, "no floor measured")
		}
	}
}

func TestBareFloorBoundsTheStormRatio(t *testing.T) {
	r := Result{
		Config:    Config{Connections: 50, StormBuyers: 10000},
		Reserve:   WrkResult{DurationUS: 1e6, Held: 15000},
		Storm:     WrkResult{DurationUS: 1e6, Requests: 33000, OutOfStock: 33000},
		ServerCPU: 60 * time.Microsecond, RedisCPU: 20 * time.Microsecond,
		PostgresCPU: 10 * time.Microsecond, LoadCPU: 12 * time.Microsecond,
		StormCPU: 35 * time.Microsecond, StormRedisCPU: 5 * time.Microsecond, StormLoadCPU: 13 * time.Microsecond,
	}
	// Without a bare handler measured there is no ceiling, and the report
	// says nothing of one.
	require.Zero(t, r.StormCeiling())
	require.NotContains(t, r.Markdown(), "bare `net/http` handler")
	require.Contains(t, r.Markdown(), "CPU time per answer over the sold-out storm: dropline 35.0 µs, redis-server 5.0 µs, wrk 13.0 µs.")

	// 102 µs in all per hold ÷ (15 µs of handler + 14 of wrk + 5 of
	// redis-server per answer) = 3.
	r.Bare = WrkResult{DurationUS: 1e6, Requests: 60000, OutOfStock: 60000, P50US: 700, P99US: 2000, MaxUS: 9000, CPU: 60000 * 14 * time.Microsecond}
	r.BareCPU = 15 * time.Microsecond
	require.InDelta(t, 3.0, r.StormCeiling(), 1e-9)
	md := r.Markdown()
	require.Contains(t, md, "| floor: bare `net/http` handler writing the sold-out answer | 60,000 | 0.70 | 2.00 | 9.0 |\n")
	require.Contains(t, md, "the bare `net/http` handler (the sold-out answer's bytes and headers, nothing parsed) used 15.0 µs of CPU per request and wrk 14.0 µs "+
		"(dropline per storm answer ÷ bare handler: 2.33). Were Dropline's answer to cost no more than the bare handler's, "+
		"storm answers ÷ successful holds could reach 3.00 with `net/http` (102.0 µs in all per hold ÷ 34.0 µs of handler, wrk and redis-server per answer).")
	// It is information, not a goal.
	for _, c := range r.Checks() {
		require.NotContains(t, c.Name, "net/http")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
