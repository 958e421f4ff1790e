package flashsale_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/bench/flashsale"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testSecret = "flashsale-test-secret-0123456789abcdef"

// startApp runs the real Dropline on port 0 against databaseURL and the key
// prefix, as `dropline serve` would.
func startApp(t *testing.T, databaseURL, prefix string) *app.App {
	t.Helper()
	cfg := config.Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL = databaseURL
	if v := os.Getenv("REDIS_URL"); v != "" {
		cfg.RedisURL = v
	}
	cfg.JWTSecret = testSecret
	cfg.KeyPrefix = prefix
	cfg.ShutdownTimeout = 10 * time.Second
	require.NoError(t, cfg.Validate())
	a := app.New(cfg, zerolog.Nop())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		require.NoError(t, a.Stop(ctx))
	})
	return a
}

// TestSmallDropAgainstTwoServers runs a real drop, over HTTP, against two
// Dropline processes sharing one Redis and one Postgres: a few hundred
// buyers chase 50 units with every kind of checkout, and the verdict must
// find nothing oversold and every confirmed commit in Postgres.
func TestSmallDropAgainstTwoServers(t *testing.T) {
	t.Parallel()
	dbURL := testenv.NewDatabase(t)
	prefix := testenv.Redis(t).Prefix
	a := startApp(t, dbURL, prefix)
	b := startApp(t, dbURL, prefix)

	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://" + a.Addr(), "http://" + b.Addr() + "/graphql"}
	cfg.Secret = []byte(testSecret)
	cfg.Buyers = 300
	cfg.Concurrency = 24
	cfg.Stock = 50
	cfg.Quantity = 1
	cfg.MaxPerUser = 1
	cfg.CommitRatio, cfg.CancelRatio = 0.6, 0.2
	cfg.Think = 5 * time.Millisecond
	cfg.Duration = 60 * time.Second
	cfg.DatabaseURL = dbURL
	cfg.RunID = "ci"

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

	v := res.Verdict
	require.True(t, v.OK, "failed checks: %+v", v.Failed())
	require.Zero(t, v.Oversold)
	require.Equal(t, v.CommitsSeen, v.CommitsInLedger, "commits the clients saw == sales in Postgres")
	require.Positive(t, v.CommitsSeen, "somebody bought something")
	require.Equal(t, v.UnitsSeen, v.SoldUnits)
	require.Zero(t, v.CommitsUnknown)
	require.Equal(t, 50, res.Final.Total)
	require.Equal(t, 50, res.Final.Available+res.Final.Held+res.Final.Sold)
	require.Equal(t, cfg.Buyers, res.Ops[0].Requests, "one reserve per buyer, no retries needed on loopback")
	require.Positive(t, res.Ops[0].Codes["OUT_OF_STOCK"], "the stock ran out")
	require.Equal(t, 50, res.Ops[0].Codes[flashsale.CodeOK]-res.BuyerOutcomes[flashsale.BuyerCancelled],
		"every unit was taken once, plus once more per cancelled hold")

	// The commit's latency quiet and in the storm, and its floor: no-op
	// requests to the same server, quiet and through the storm.
	q := res.QuietCommit
	require.NotNil(t, q)
	require.Equal(t, cfg.QuietCommits, q.Commits)
	require.Equal(t, flashsale.OpCommit, res.Ops[1].Op)
	require.Equal(t, res.Ops[1].Requests, q.StormCommits)
	require.Positive(t, q.Quiet.P50ms)
	require.GreaterOrEqual(t, q.Quiet.P99ms, q.Quiet.P50ms)
	require.InDelta(t, q.Storm.P99ms/q.Quiet.P99ms, q.Ratio, 1e-9)
	n := q.NoOp
	require.NotNil(t, n)
	require.Equal(t, cfg.QuietCommits, n.QuietN, "as many quiet no-ops as quiet commits")
	require.Positive(t, n.Quiet.P50ms)
	require.Zero(t, n.QuietFails)
	require.Zero(t, n.StormFails)
	// One every 10 ms from the first buyer to the last: at least a fifth
	// of that, however slow the machine, and not one more.
	sent := float64(n.StormN) * 10e-3
	require.GreaterOrEqual(t, sent, res.ElapsedSeconds/5, "no-ops were timed through the storm")
	require.LessOrEqual(t, sent, res.ElapsedSeconds+10e-3)
	require.GreaterOrEqual(t, n.Storm.MaxMs, n.Storm.P99ms)
	require.InDelta(t, n.Storm.P99ms/n.Quiet.P99ms, n.Ratio, 1e-9)
	require.Contains(t, text.String(), "no-op p99 (GET /healthz, the first server, from this process)")

	var html strings.Builder
	require.NoError(t, flashsale.WriteHTML(&html, res))
	require.Contains(t, html.String(), "<svg")
	require.NotContains(t, html.String(), "http://cdn", "the report is self-contained")
	require.NotContains(t, html.String(), "<script")
}

// TestSecondDropOnExistingSKU reuses a SKU that already sold units: the
// verdict counts only this run's sales and still finds them all.
func TestSecondDropOnExistingSKU(t *testing.T) {
	t.Parallel()
	dbURL := testenv.NewDatabase(t)
	a := startApp(t, dbURL, testenv.Redis(t).Prefix)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(sku string, buyers int, runID string) *flashsale.Result {
		cfg := flashsale.DefaultConfig()
		cfg.Targets = []string{"http://" + a.Addr()}
		cfg.Secret = []byte(testSecret)
		cfg.Buyers, cfg.Concurrency, cfg.Stock = buyers, 8, 20
		cfg.CommitRatio, cfg.CancelRatio = 1, 0
		cfg.Think = 0
		cfg.SKU = sku
		cfg.DatabaseURL = dbURL
		cfg.RunID = runID
		d, err := flashsale.NewDriver(ctx, cfg)
		require.NoError(t, err)
		defer d.Close()
		res, err := d.Run(ctx)
		require.NoError(t, err)
		require.True(t, res.Verdict.OK, "%+v", res.Verdict.Failed())
		return res
	}
	first := run("", 8, "one")
	require.Equal(t, 8, first.Verdict.SoldUnits)
	second := run(first.SKU, 30, "two")
	require.Equal(t, 12, second.Verdict.SoldUnits, "the rest of the stock")
	require.Equal(t, 12, second.Verdict.CommitsInLedger)
	require.Equal(t, 20, second.Final.Sold)
}

func TestRefusesNonLoopbackTargets(t *testing.T) {
	t.Parallel()
	cfg := flashsale.DefaultConfig()
	cfg.Secret = []byte(testSecret)
	for _, u := range []string{"http://10.1.2.3:8080", "http://[2001:db8::1]:8080", "ftp://127.0.0.1/"} {
		cfg.Targets = []string{u}
		require.Error(t, cfg.Validate(context.Background()), u)
	}
	for _, u := range []string{"http://127.0.0.1:8080", "http://localhost:8080/graphql", "http://[::1]:1"} {
		cfg.Targets = []string{u}
		require.NoError(t, cfg.Validate(context.Background()), u)
	}
	cfg.Targets = []string{"http://10.1.2.3:8080"}
	cfg.AllowRemote = true
	require.NoError(t, cfg.Validate(context.Background()))
}

func TestBoundsAndSecretAreChecked(t *testing.T) {
	t.Parallel()
	cfg := flashsale.DefaultConfig()
	err := cfg.Validate(context.Background())
	require.ErrorContains(t, err, "DROPLINE_JWT_SECRET")
	cfg.Secret = []byte(testSecret)
	cfg.Buyers = flashsale.MaxBuyers + 1
	cfg.CommitRatio, cfg.CancelRatio = 0.8, 0.5
	cfg.Hold = 1500 * time.Millisecond
	err = cfg.Validate(context.Background())
	require.ErrorContains(t, err, "--buyers")
	require.ErrorContains(t, err, "--commit")
	require.ErrorContains(t, err, "--hold")
}

func TestDownTargetIsAnError(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1 of loopback.
	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://127.0.0.1:1"}
	cfg.Secret = []byte(testSecret)
	cfg.Timeout = 2 * time.Second
	d, err := flashsale.NewDriver(context.Background(), cfg)
	require.NoError(t, err)
	defer d.Close()
	_, err = d.Run(context.Background())
	require.ErrorContains(t, err, "TRANSPORT")
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, flashsale.Percentile(ds, 0.50))
	require.Equal(t, 99*time.Millisecond, flashsale.Percentile(ds, 0.99))
	require.Equal(t, 100*time.Millisecond, flashsale.Percentile(ds, 1))
	require.Equal(t, time.Millisecond, flashsale.Percentile(ds, 0))
	require.Zero(t, flashsale.Percentile(nil, 0.5))
}

// TestWaitlistRehearsal runs the drop with the waitlist rehearsal against
// two real servers: every freed unit must reach a waiter, in join order,
// and none an outsider, in the API and in the ledger.
func TestWaitlistRehearsal(t *testing.T) {
	t.Parallel()
	dbURL := testenv.NewDatabase(t)
	prefix := testenv.Redis(t).Prefix
	a := startApp(t, dbURL, prefix)
	b := startApp(t, dbURL, prefix)

	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://" + a.Addr(), "http://" + b.Addr()}
	cfg.Secret = []byte(testSecret)
	cfg.Buyers, cfg.Concurrency, cfg.Stock = 200, 24, 40
	cfg.Think = time.Millisecond
	cfg.Waiters = 150
	cfg.DatabaseURL = dbURL
	cfg.RunID = "wl"

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

	require.True(t, res.Verdict.OK, "failed checks: %+v", res.Verdict.Failed())
	w := res.Waitlist
	require.NotNil(t, w)
	require.Equal(t, 40, w.Offered)
	require.Equal(t, 110, w.Waiting)
	require.Zero(t, w.OutsidersServed)
	require.True(t, w.LedgerChecked)
	var names []string
	for _, c := range res.Verdict.Checks {
		if strings.HasPrefix(c.Name, "waitlist: ") {
			require.False(t, c.Skipped, c.Name)
			names = append(names, c.Name)
		}
	}
	require.Len(t, names, 5)
}

// The waitlist verdict fails when an outsider got a freed unit, or a
// waiter was served out of turn.
func TestJudgeWaitlistFailsOnUnfairHandoff(t *testing.T) {
	t.Parallel()
	pos := func(n int) *int { return &n }
	res := &flashsale.WaitlistResult{SKU: "WAIT-x", Holders: 1, Waiters: 2, Outsiders: 5, OutsidersServed: 1,
		Final: flashsale.Stock{Held: 1, Total: 1}}
	entries := []flashsale.WaitlistEntry{
		{Status: "WAITING", Position: pos(1)},
		{Status: "OFFERED", Reservation: &flashsale.Reservation{Token: "t", Status: "HELD", Quantity: 1}},
	}
	checks := flashsale.JudgeWaitlist(res, []int{1, 2}, entries, nil)
	failed := map[string]bool{}
	for _, c := range checks {
		if !c.OK {
			failed[c.Name] = true
		}
	}
	require.True(t, failed["waitlist: nobody outside the queue served"])
	require.True(t, failed["waitlist: freed units handed in join order, one waiter each"])
}

// TestDrawRehearsal runs the drop with the draw rehearsal against two real
// servers: 800 buyers enter a draw of 300 units (every tenth twice), the
// servers draw it, and the verdict's draw checks all run and pass,
// the recomputation from the ledger included.
func TestDrawRehearsal(t *testing.T) {
	t.Parallel()
	dbURL := testenv.NewDatabase(t)
	prefix := testenv.Redis(t).Prefix
	a := startApp(t, dbURL, prefix)
	b := startApp(t, dbURL, prefix)

	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://" + a.Addr(), "http://" + b.Addr()}
	cfg.Secret = []byte(testSecret)
	cfg.Buyers, cfg.Concurrency, cfg.Stock = 100, 24, 300
	cfg.Think = time.Millisecond
	cfg.Mode, cfg.Entrants, cfg.DrawWindow = flashsale.ModeDraw, 800, 15*time.Second
	cfg.DrawWatchers = 100
	cfg.DatabaseURL = dbURL
	cfg.RunID = "dr"

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

	require.True(t, res.Verdict.OK, "failed checks: %+v", res.Verdict.Failed())
	dr := res.Draw
	require.NotNil(t, dr)
	require.Equal(t, 800, dr.Entries)
	require.Equal(t, 80, dr.Replays)
	require.Equal(t, 800, dr.Winners+dr.Losers)
	require.Greater(t, dr.WonUnits, 300-2)
	require.True(t, dr.LedgerChecked)
	require.Contains(t, dr.Verification, "draw of DRAW-dr verified: 800 entries, 300 units")
	var names []string
	for _, c := range res.Verdict.Checks {
		if strings.HasPrefix(c.Name, "draw: ") {
			require.False(t, c.Skipped, c.Name)
			names = append(names, c.Name)
		}
	}
	require.Len(t, names, 7)
	require.Equal(t, 100, dr.Told, "every watcher told by a push")
	var html strings.Builder
	require.NoError(t, flashsale.WriteHTML(&html, res))
	require.Contains(t, html.String(), "<h2>Draw rehearsal</h2>")
}

// The draw verdict fails on a winner without its HELD reservation, a
// stock filled past what it has, a seed that does not hash to the
// published seedHash, and a recomputation that disagrees.
func TestJudgeDrawFailsOnABadDraw(t *testing.T) {
	t.Parallel()
	seed := strings.Repeat("ab", 32)
	res := &flashsale.DrawResult{SKU: "DRAW-x", Stock: 2, Entrants: 3, Entries: 3, Seed: seed,
		SeedHash: strings.Repeat("0", 64), Final: flashsale.Stock{Held: 2, Total: 2}, LedgerChecked: true}
	firsts := []flashsale.DrawEntry{{Status: "ENTERED", Quantity: 1}, {Status: "ENTERED", Quantity: 2}, {Status: "ENTERED", Quantity: 1}}
	entries := []flashsale.DrawEntry{
		{Status: "WON", Quantity: 1, Reservation: &flashsale.Reservation{Token: "t1", Status: "HELD", Quantity: 1}},
		{Status: "WON", Quantity: 2},
		{Status: "LOST", Quantity: 1},
	}
	checks := flashsale.JudgeDraw(res, firsts, entries, errors.New("draw of DRAW-x does NOT verify: 1 mismatches"))
	failed := map[string]bool{}
	for _, c := range checks {
		if !c.OK {
			failed[c.Name] = true
		}
	}
	require.False(t, failed["draw: one entry per buyer"])
	require.False(t, failed["draw: every buyer WON or LOST"])
	require.True(t, failed["draw: stock filled as far as the entries fit"])
	require.True(t, failed["draw: winners hold HELD reservations"])
	require.True(t, failed["draw: the revealed seed hashes to seedHash"])
	require.True(t, failed["draw: recomputed draw equals the published one"])
}
